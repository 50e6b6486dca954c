"""LoRA against torch + Hugging Face PEFT on a small random transformers BERT, exported by torch (TorchScript).

Gradients of A and B, the PEFT adapter file in both directions (ours loaded by PEFT, PEFT's loaded by us), and
the command line (generate --lora-*, export --adapter). Nothing is downloaded: random weights, a small config.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tests.zoo.vision import import_torchvision

torch = pytest.importorskip("torch")


def _import_peft():
    """Import transformers and peft (both import torchvision, which needs tests.zoo.vision's workaround here)."""
    import_torchvision()
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    return transformers, peft


transformers, peft = _import_peft()

from onnxtrain.api import CheckpointState, Module, Optimizer  # noqa: E402
from onnxtrain.artifacts import LoRA, LossType, OptimType, generate_artifacts  # noqa: E402
from onnxtrain.artifacts.passes.gelu_backward import SUFFIX as GELU_SUFFIX  # noqa: E402
from onnxtrain.lora import save_peft_adapter  # noqa: E402
from tests.cli.conftest import assert_one_line_error, run_cli  # noqa: E402

TARGETS = ["*query*", "*value*"]
BATCH, SEQ, VOCAB, CLASSES = 4, 8, 100, 3


def _bert() -> torch.nn.Module:
    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=16, num_labels=CLASSES,
                                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    return transformers.BertForSequenceClassification(config).eval()


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    """(the torch model's state dict, the ONNX file, a batch)."""
    model = _bert()
    path = tmp_path_factory.mktemp("bert") / "bert.onnx"
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings():  # the TorchScript exporter's deprecation and tracer warnings
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (ids,), str(path), input_names=["input_ids"], output_names=["logits"],
                          dynamo=False, opset_version=17, dynamic_axes={"input_ids": {0: "batch"}})
    labels = np.arange(BATCH, dtype=np.int64) % CLASSES
    return model.state_dict(), path, ids.numpy(), labels


def _torch_peft(state_dict, adapter_dir, trainable: bool = False):
    model = _bert()
    model.load_state_dict(state_dict)
    return peft.PeftModel.from_pretrained(model, str(adapter_dir), is_trainable=trainable).eval()


def _artifacts(path, out, lora, requires_grad=None):
    paths = generate_artifacts(str(path), requires_grad=requires_grad, loss=LossType.CrossEntropyLoss,
                               optimizer=OptimType.AdamW, artifact_directory=out, additional_output_names=["logits"],
                               lora=lora)
    state = CheckpointState.load_checkpoint(paths["checkpoint"])
    return paths, state, Module(paths["training"], state, paths["eval"])


def _logits(path, ids) -> np.ndarray:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(["logits"], {"input_ids": ids})[0]


def test_gradients_of_a_and_b_match_torch_peft(bert, tmp_path):
    state_dict, path, ids, labels = bert
    paths, state, module = _artifacts(path, tmp_path / "art", LoRA(rank=4, alpha=8, targets=TARGETS))
    rng = np.random.default_rng(3)
    for name, p in state.parameters:  # B = 0 would give A no gradient
        if name.endswith("lora_B.weight"):
            state.parameters[name] = (0.1 * rng.normal(size=p.data.shape)).astype(np.float32)
    save_peft_adapter(state, paths["training"], tmp_path / "adapter")
    module.train()
    loss = float(module(ids, labels)[0])

    torch_model = _torch_peft(state_dict, tmp_path / "adapter", trainable=True)
    torch_loss = torch.nn.functional.cross_entropy(torch_model(input_ids=torch.from_numpy(ids)).logits,
                                                   torch.from_numpy(labels))
    torch_loss.backward()
    assert loss == pytest.approx(torch_loss.item(), rel=1e-5)
    torch_grads = {n.removeprefix("base_model.model.").replace(".default.", "."): p.grad.numpy()
                   for n, p in torch_model.named_parameters() if p.requires_grad}
    ours = {n: p.grad for n, p in state.parameters if p.requires_grad}
    assert sorted(ours) == sorted(torch_grads) and len(ours) == 8  # 2 layers x (query, value) x (A, B)
    for name, grad in ours.items():
        expected = torch_grads[name]
        assert np.linalg.norm(expected) > 0, name
        assert np.linalg.norm(grad - expected) <= 1e-4 * np.linalg.norm(expected), name


def test_trained_adapter_loads_into_peft_with_the_same_outputs(bert, tmp_path):
    state_dict, path, ids, labels = bert
    proc = run_cli("generate", path, "-o", tmp_path / "art", "--loss", "cross-entropy", "--lora-rank", "4",
                   "--lora-alpha", "8", "--lora-targets", *TARGETS, "--requires-grad", "classifier.*")
    assert proc.returncode == 0, proc.stderr
    assert "LoRA:        rank 4, alpha 8 (scale 2), dropout 0 on bert.encoder.layer.0.attention.self.query" \
        in proc.stdout  # onnxtrain info's summary
    paths = {k: str(tmp_path / "art" / f"{k}_model.onnx") for k in ("training", "eval", "optimizer")}
    state = CheckpointState.load_checkpoint(tmp_path / "art" / "checkpoint")
    module = Module(paths["training"], state, paths["eval"])
    optimizer = Optimizer(paths["optimizer"], module)
    optimizer.set_learning_rate(3e-2)
    module.train()
    losses = []
    for _ in range(20):
        losses.append(float(module(ids, labels)[0]))
        optimizer.step()
        module.lazy_reset_grad()
    assert losses[-1] < 0.7 * losses[0], losses  # adapters + head only
    CheckpointState.save_checkpoint(state, tmp_path / "art" / "checkpoint")
    proc = run_cli("export", tmp_path / "art", "--adapter", "-o", tmp_path / "adapter", "--checkpoint", "initial")
    assert proc.returncode == 0, proc.stderr
    module.export_model_for_inferencing(tmp_path / "unmerged.onnx", ["logits"])
    module.export_model_for_inferencing(tmp_path / "merged.onnx", ["logits"], merge_adapters=True)
    unmerged, merged = _logits(tmp_path / "unmerged.onnx", ids), _logits(tmp_path / "merged.onnx", ids)
    np.testing.assert_allclose(merged, unmerged, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        expected = _torch_peft(state_dict, tmp_path / "adapter")(input_ids=torch.from_numpy(ids)).logits.numpy()
    np.testing.assert_allclose(unmerged, expected, rtol=1e-4, atol=1e-5)


def test_peft_adapter_starts_the_artifacts(bert, tmp_path):
    state_dict, path, ids, _ = bert
    model = _bert()
    model.load_state_dict(state_dict)
    config = peft.LoraConfig(r=2, lora_alpha=6, target_modules=["query", "value"], init_lora_weights=False,
                             modules_to_save=["classifier"])
    peft_model = peft.get_peft_model(model, config)  # random A and B, and a classifier of its own
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "modules_to_save" in name:
                p.normal_(0.0, 0.5)
    peft_model.save_pretrained(str(tmp_path / "peft"))
    assert sorted(LoRA.from_peft(tmp_path / "peft").base_values) == ["classifier.bias", "classifier.weight"]
    proc = run_cli("generate", path, "-o", tmp_path / "art", "--loss", "cross-entropy",
                   "--lora-from", tmp_path / "peft")
    assert proc.returncode == 0, proc.stderr
    proc = run_cli("export", tmp_path / "art", "-o", tmp_path / "model.onnx", "--merge-adapters")
    assert proc.returncode == 0, proc.stderr
    with torch.no_grad():
        expected = _torch_peft(state_dict, tmp_path / "peft")(input_ids=torch.from_numpy(ids)).logits.numpy()
    base = _logits(path, ids)
    assert np.abs(expected - base).max() > 2e-4  # the adapter changes the (small, random-head) logits
    np.testing.assert_allclose(_logits(tmp_path / "model.onnx", ids), expected, rtol=1e-4, atol=2e-6)


def test_command_line_lora_mistakes(bert, tmp_path):
    proc = run_cli("generate", bert[1], "-o", tmp_path, "--loss", "cross-entropy", "--lora-rank", "4")
    assert_one_line_error(proc, "--lora-rank needs --lora-targets")


def _forward_and_backward_reads(model: onnx.ModelProto) -> tuple[list[onnx.NodeProto], set[str]]:
    """The forward nodes (those the loss depends on), and the graph inputs and values the other nodes read."""
    producer = {o: n for n in model.graph.node for o in n.output}
    forward, stack = set(), [model.graph.output[0].name]
    while stack:
        node = producer.get(stack.pop())
        if node is not None and node.name not in forward:
            forward.add(node.name)
            stack.extend(node.input)
    return ([n for n in model.graph.node if n.name in forward],
            {x for n in model.graph.node if n.name not in forward for x in n.input})


def test_the_backward_does_only_what_the_adapters_need(bert, tmp_path):
    _, path, _, _ = bert
    paths = generate_artifacts(str(path), loss=LossType.CrossEntropyLoss, artifact_directory=tmp_path,
                               lora=LoRA(rank=4, alpha=8, targets=TARGETS))
    model = onnx.load(paths["training"])
    forward, reads = _forward_and_backward_reads(model)
    # the module of each frozen matrix the backward multiplies by (dX = dY W^T): every linear layer above the
    # first adapter; in layer 0 not the key, nor the query and value base weights (nothing below them trains)
    frozen = {i.name for i in model.graph.input} - {n for n in reads if "lora" in n}
    weights = {n.input[1]: n.name.rsplit("/", 1)[0] for n in forward
               if n.op_type in ("MatMul", "Gemm") and n.input[1] in frozen}
    multiplied = sorted(weights[w] for w in reads if w in weights)
    layer = [f"/attention/self/{m}" for m in ("query", "key", "value")] + ["/attention/output/dense",
                                                                           "/intermediate/dense", "/output/dense"]
    assert multiplied == sorted(["/bert/encoder/layer.0" + m for m in layer[3:]] +
                                ["/bert/encoder/layer.1" + m for m in layer] + ["/bert/pooler/dense", "/classifier"])
    # below the first adapter the backward reads only the adapters' input (for the gradient of A)
    embeddings = {o for n in forward if n.name.startswith("/bert/embeddings/") and n.op_type != "Constant"
                  for o in n.output}
    assert reads & embeddings == {"/bert/embeddings/LayerNorm/LayerNormalization_output_0"}
    # the batch is dynamic: the backward reads the shapes of values it needs the shape of only (the projections,
    # the attention context), computed in the forward, not the values (ShapesInForward)
    forward_names = {n.name for n in forward}
    only_shapes = {x: set() for x in reads if x in {o for n in forward for o in n.output}}
    for n in model.graph.node:
        if n.name not in forward_names:
            for x in n.input:
                if x in only_shapes:
                    only_shapes[x].add(n.op_type)
    assert not [x for x, ops in only_shapes.items() if ops <= {"Shape", "Size"}]
    # the erf GELU keeps only its input, and its backward is one product by its derivative (GeluBackward) in
    # both layers: torch's export is the form that pass rewrites
    gelu = {o for n in forward if "intermediate_act_fn" in n.name and n.op_type != "Constant" for o in n.output}
    assert reads & gelu == set()
    assert len([n for n in model.graph.node if n.op_type == "Mul" and n.name.endswith(GELU_SUFFIX)]) == 2
    # so are the attention probabilities where the backward keeps q and k anyway (layer 0's key needs no
    # gradient, so there it may keep them instead), and onnxruntime does not merge the copies back
    probabilities = {n.output[0]: n.name for n in forward if n.op_type == "Softmax"}
    kept = {probabilities[v] for v in reads & set(probabilities)}
    assert kept <= {"/bert/encoder/layer.0/attention/self/Softmax"}
    copies = [n for n in model.graph.node if n.op_type == "Softmax" and n.name not in probabilities.values()]
    assert len(copies) == 2 - len(kept)
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(paths["training"], so, providers=["CPUExecutionProvider"])
    optimized = onnx.load(str(tmp_path / "optimized.onnx")).graph
    assert [n.op_type for n in optimized.node].count("Softmax") == 4 - len(kept)
    # dX = dY W^T: onnxruntime folds the Transpose of a frozen weight into the MatMul, no copy per step
    assert [n for n in model.graph.node if n.op_type == "Transpose" and n.input[0] in frozen]
    assert not [n.name for n in optimized.node if n.op_type == "Transpose" and n.input[0] in frozen]
