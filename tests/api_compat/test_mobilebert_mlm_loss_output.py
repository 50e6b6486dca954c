"""The C# masked-language-modelling sample's offline step: a model that computes its own loss (labels as an input,
"loss" its first output), generate_artifacts with no loss, parameter lists taken from torch.

Source: https://github.com/microsoft/onnxruntime-training-examples/blob/master/on_device_training/desktop/csharp/masked_language_modeling/mobilebert_offline.ipynb
Adapted: the imports; a random-weight MobileBERT (small config) instead of the google/mobilebert-uncased download,
random token ids instead of the tokenizer and wikitext; the C# training loop (TrainStep, OptimizerStep,
LazyResetGrad) is the Python API's; exported with ``dynamo=False`` (the notebook's TorchScript exporter: its
``training=TRAINING`` and ``do_constant_folding`` arguments mean nothing to the dynamo exporter).
The notebook lists torch's buffers (``position_ids``, ...) in frozen_params; they are constants in the export,
and, as the peer does, generate_artifacts skips them (onnxtrain warns). onnxruntime-training 1.19.2 itself fails
on this export in its gradient builder (``GradientBuilderBase::O ... i < node_->OutputDefs().size()``).
"""

import numpy as np
import pytest

from onnxtrain import artifacts  # was: from onnxruntime.training import artifacts
from onnxtrain.api import CheckpointState, Module, Optimizer  # was: (the C# training API)
from tests.zoo.vision import import_torchvision

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
import_torchvision()  # transformers imports torchvision; see tests/zoo/vision.py


def test_mobilebert_masked_lm_with_its_own_loss(tmp_path):
    import onnx
    from transformers import MobileBertConfig

    torch.manual_seed(0)
    config = MobileBertConfig(num_hidden_layers=2, vocab_size=200, hidden_size=64, embedding_size=32,
                              intra_bottleneck_size=32, num_attention_heads=2, true_hidden_size=32,
                              intermediate_size=64, num_feedforward_networks=1, max_position_embeddings=32)
    model = transformers.MobileBertForMaskedLM(config)
    model_name = "mobilebert-uncased"
    rng = np.random.default_rng(0)
    input_ids = torch.tensor(rng.integers(5, 200, (4, 16)))
    inputs = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids),
              "token_type_ids": torch.zeros_like(input_ids)}
    masked = torch.tensor(rng.random((4, 16)) < 0.3)
    labels = torch.where(masked, input_ids, -100)
    inputs["input_ids"] = torch.where(masked, torch.full_like(input_ids, 3), input_ids)

    class FlatModel(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, *local_inputs):
            return self.model(inputs["input_ids"], inputs["attention_mask"], inputs["token_type_ids"], labels=labels)

    model = FlatModel(model)
    out = tmp_path / "training_artifacts"
    out.mkdir()
    torch.onnx.export(
        model,
        (inputs["input_ids"], inputs["attention_mask"], inputs["token_type_ids"], labels),
        f"{out}/{model_name}.onnx",
        input_names=["input_ids", "attention_mask", "token_type_ids", "labels"],
        output_names=["loss", "logits"],
        dynamic_axes={
            "input_ids": {0: "batch_size", 1: "sequence_length"},
            "attention_mask": {0: "batch_size", 1: "sequence_length"},
            "token_type_ids": {0: "batch_size", 1: "sequence_length"},
            "labels": {0: "batch_size", 1: "sequence_length"},
            "logits ": {0: "batch_size", 1: "sequence_length"}
        },
        export_params=True,
        opset_version=15,
        do_constant_folding=False,
        training=torch.onnx.TrainingMode.TRAINING,
        dynamo=False,
    )

    requires_grad = []
    frozen_params = []
    for name, param in model.named_parameters():
        if param.requires_grad:
            requires_grad.append(name)
        else:
            frozen_params.append(name)
    for name, param in model.named_buffers():
        frozen_params.append(name)
    model = onnx.load(f"{out}/{model_name}.onnx")
    artifacts.generate_artifacts(
        model,
        requires_grad=requires_grad,
        frozen_params=frozen_params,
        optimizer=artifacts.OptimType.AdamW,
        artifact_directory=f"{out}/"
    )

    state = CheckpointState.load_checkpoint(f"{out}/checkpoint")
    module = Module(f"{out}/training_model.onnx", state, f"{out}/eval_model.onnx")
    optimizer = Optimizer(f"{out}/optimizer_model.onnx", module)
    assert {n for n, p in state.parameters if p.requires_grad} == set(requires_grad)
    feeds = [inputs["input_ids"].numpy(), inputs["attention_mask"].numpy(), inputs["token_type_ids"].numpy(),
             labels.numpy()]
    # The C# app feeds the model's own inputs, labels last; no label input is added (no loss block).
    assert module.input_names() == ["input_ids", "attention_mask", "token_type_ids", "labels"]
    # With no loss block the model's first output is the loss and its others come after it, as the peer's
    # (its loss=None is a PassThrough of every output): the C# app reads the "loss" output by name.
    assert module.output_names()[1:] == ["logits"]
    losses = []
    for _ in range(8):
        loss, logits = module(*feeds)
        assert logits.shape == (4, 16, 200)
        losses.append(float(loss))
        optimizer.step()
        module.lazy_reset_grad()
    assert losses[-1] < 0.9 * losses[0]
    assert abs(losses[0] - np.log(200)) < 1.0  # random weights: about uniform over the vocabulary
