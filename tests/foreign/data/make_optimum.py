"""Make bert_optimum.onnx with Hugging Face optimum's ONNX exporter (committed; tests never run this).

Run it where optimum-onnx is installed (it pins an older transformers than the test environment, so use a
separate venv), from the repository root:

    python3 -m venv /tmp/optvenv && /tmp/optvenv/bin/pip install optimum-onnx==0.1.0 torch==2.13.0
    /tmp/optvenv/bin/python tests/foreign/data/make_optimum.py

A random-weight BertForSequenceClassification (fresh initialization, seeded: biases are zeros and LayerNorm
weights ones, which the exporter de-duplicates into Identity aliases) is saved to a temporary folder and exported
by ``optimum.exporters.onnx.main_export`` for ``text-classification``, as a user exports a local checkpoint:
inputs ``input_ids``, ``attention_mask``, ``token_type_ids`` with axes ``batch_size`` and ``sequence_length``,
output ``logits``, opset 18. ``bert_optimum.npz`` holds one padded batch, torch's logits and cross-entropy
loss in eval mode, and ``grad:<initializer>`` for each ONNX initializer or alias that holds a torch parameter
(by name, or transposed for the ``onnx::MatMul_*`` weights the exporter renames).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

import numpy as np
import onnx
import torch
from onnx import numpy_helper

sys.path.insert(0, os.getcwd())
from tests.zoo.vision import import_torchvision  # noqa: E402

import_torchvision()  # the CUDA torchvision wheel beside the CPU torch: see tests/zoo/vision.py
from optimum.exporters.onnx import main_export  # noqa: E402
from transformers import BertConfig, BertForSequenceClassification  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> None:
    torch.manual_seed(0)
    config = BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=32, num_labels=3, type_vocab_size=2)
    model = BertForSequenceClassification(config).eval()
    folder = tempfile.mkdtemp()
    try:
        model.save_pretrained(os.path.join(folder, "bert"))
        main_export(os.path.join(folder, "bert"), output=os.path.join(folder, "onnx"), task="text-classification")
        shutil.copy(os.path.join(folder, "onnx", "model.onnx"), os.path.join(HERE, "bert_optimum.onnx"))
    finally:
        shutil.rmtree(folder)

    rng = np.random.default_rng(0)
    ids = rng.integers(1, 40, (3, 9))
    mask = np.ones((3, 9), np.int64)
    mask[1, 6:] = 0  # padded rows, as a tokenizer writes them
    mask[2, 4:] = 0
    ids[mask == 0] = 0
    types = np.zeros((3, 9), np.int64)
    types[:, 5:] = 1
    labels = np.array([0, 2, 1])
    model = model.double()
    logits = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                   token_type_ids=torch.tensor(types)).logits
    loss = torch.nn.functional.cross_entropy(logits, torch.tensor(labels))
    loss.backward()
    data = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types, "labels": labels,
            "logits": logits.detach().numpy().astype(np.float32), "loss": np.float64(loss.item())}
    params = dict(model.named_parameters())
    proto = onnx.load(os.path.join(HERE, "bert_optimum.onnx"))
    aliases = [n.output[0] for n in proto.graph.node if n.op_type == "Identity" and n.output[0] in params]
    for name in [i.name for i in proto.graph.initializer] + aliases:
        if name in params:
            data[f"grad:{name}"] = params[name].grad.numpy()
            continue
        value = numpy_helper.to_array(next(i for i in proto.graph.initializer if i.name == name))
        hits = [p for p in params.values() if p.dim() == 2 and p.t().shape == value.shape
                and np.array_equal(p.detach().t().numpy().astype(np.float32), value)]
        if len(hits) == 1:
            data[f"grad:{name}"] = hits[0].grad.t().numpy()
    np.savez_compressed(os.path.join(HERE, "bert_optimum.npz"), **data)
    print(f"{len(proto.graph.node)} nodes, opset {proto.opset_import[0].version}, "
          f"{sum(k.startswith('grad:') for k in data)} gradients of {len(params)} parameters")


if __name__ == "__main__":
    main()
