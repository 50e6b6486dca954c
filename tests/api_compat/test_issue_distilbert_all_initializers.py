"""A user's script from the peer's issue tracker: DistilBERT embeddings trained with MSE on the encoder output,
``requires_grad`` = every initializer, ``loss_input_names=["output"]``. onnxruntime-training fails building the
gradient graph ("Error building gradient graph for bert models for on-device training").

Source: https://github.com/microsoft/onnxruntime/issues/22465
Adapted: the imports; a random-weight DistilBERT (small config) instead of distilbert/distilbert-base-uncased;
the issue's export call is kept (TorchScript exporter: ``dynamo=False``); a training loop that pulls the embeddings
of a batch towards target embeddings.
"""

from pathlib import Path

import numpy as np
import pytest

from onnxtrain import artifacts  # was: from onnxruntime.training import artifacts
from onnxtrain.api import CheckpointState, Module, Optimizer  # was: from onnxruntime.training.api import ...
from tests.zoo.vision import import_torchvision

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
import_torchvision()  # transformers imports torchvision; see tests/zoo/vision.py


def test_distilbert_mse_on_the_encoder_output(tmp_path, monkeypatch):
    import onnx
    from transformers import DistilBertConfig, DistilBertModel

    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    model = DistilBertModel(DistilBertConfig(vocab_size=100, dim=32, n_layers=2, n_heads=2, hidden_dim=64,
                                             max_position_embeddings=16))
    example_input = (
        torch.randint(10, (1, 10)),
        torch.ones(10, dtype=int).view(1, 10)
    )
    torch.onnx.export(
        model,
        example_input,
        "./embedding_test",
        export_params=True,
        do_constant_folding=False,
        training=torch.onnx.TrainingMode.TRAINING,
        input_names=["input_ids",
                     "attention_mask"],
        output_names=["output"],
        dynamo=False)
    onnx_model = onnx.load("./embedding_test")
    p = Path("./embedding_training")
    p.mkdir(exist_ok=True, parents=True)
    artifacts.generate_artifacts(onnx_model,
                                 frozen_params=[],
                                 requires_grad=[initializer.name for initializer in onnx_model.graph.initializer],
                                 loss=artifacts.LossType.MSELoss,
                                 optimizer=artifacts.OptimType.AdamW,
                                 loss_input_names=["output"],
                                 artifact_directory=p)

    state = CheckpointState.load_checkpoint(p / "checkpoint")
    module = Module(p / "training_model.onnx", state, p / "eval_model.onnx")
    optimizer = Optimizer(p / "optimizer_model.onnx", module)
    assert len([n for n, q in state.parameters if q.requires_grad]) == len(onnx_model.graph.initializer)
    assert module.input_names() == ["input_ids", "attention_mask", "target"]
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 100, (1, 10)).astype(np.int64)  # the export has no dynamic axes: batch 1
    mask = np.ones((1, 10), np.int64)
    target = rng.standard_normal((1, 10, 32)).astype(np.float32) * 0.5
    optimizer.set_learning_rate(0.01)
    losses = []
    for _ in range(10):
        losses.append(float(module(ids, mask, target)))
        optimizer.step()
        module.lazy_reset_grad()
    assert losses[-1] < 0.8 * losses[0]
    with torch.no_grad():
        expected = model(torch.from_numpy(ids), torch.from_numpy(mask)).last_hidden_state.numpy()
    module.eval()
    module.export_model_for_inferencing(p / "inference.onnx")
    from onnxruntime import InferenceSession

    trained = InferenceSession(str(p / "inference.onnx"), providers=["CPUExecutionProvider"])
    out = trained.run(None, {"input_ids": ids, "attention_mask": mask})[0]
    assert out.shape == expected.shape and not np.allclose(out, expected, atol=1e-3)  # the weights did change
