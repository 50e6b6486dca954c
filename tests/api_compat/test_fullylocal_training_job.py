"""A desktop app's local training job: it builds a model from the user's node graph, generates artifacts with
only ``requires_grad`` (no ``frozen_params``), rewrites every artifact to IR version 7, trains with a shuffled
batch loop (``lazy_reset_grad`` before each call, ``float(np.asarray(loss).reshape(-1)[0])``), exports the
inference model under the model's own output names and evaluates it with an InferenceSession, then saves the
checkpoint with a positional ``include_optimizer_state``.

Source: a public GitHub file found through the code index (stored file id 57146362432: ``run_training``,
``_apply_learning_rate``, ``_loss_type``, ``_resolve_optimizer_type``, backend "fullylocal_ort").
Adapted: the imports (the script's loader of ``onnxruntime.training.api`` is ``import onnxtrain.api``); a torch
MLP with random weights instead of the app's graph compiler; random data instead of its datasets; no progress
events, no kill switch, no manifest files.
"""

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import onnxtrain.api as api_mod  # was: api_mod = import_module("onnxruntime.training.api")
from onnxtrain import artifacts as ort_artifacts  # was: import_module("onnxruntime.training.artifacts")

torch = pytest.importorskip("torch")


# -- the user's helpers (unchanged, but for the module they read) ---------------------------------------------------
def _loss_type(name: str):
    normalized = str(name).lower()
    if normalized in {"cross_entropy", "crossentropyloss", "ce"}:
        return ort_artifacts.LossType.CrossEntropyLoss
    if normalized in {"mse", "mse_loss", "mean_squared_error"}:
        for attr in ("MSELoss", "MeanSquaredError"):
            if hasattr(ort_artifacts.LossType, attr):
                return getattr(ort_artifacts.LossType, attr)
        raise ValueError("This onnxruntime-training build does not expose MSELoss artifacts")
    raise ValueError(f"Unsupported FullyLocal loss '{name}'")


def _resolve_optimizer_type(name: str):
    normalized = str(name).lower()
    if normalized in {"adam", "adamw"}:
        return ort_artifacts.OptimType.AdamW, "adamw", "", False
    if normalized in {"sgd", "stochastic_gradient_descent"}:
        for attr in ("SGD", "SGDOptimizer"):
            if hasattr(ort_artifacts.OptimType, attr):
                return getattr(ort_artifacts.OptimType, attr), "sgd", "", False
    raise ValueError(f"Unsupported FullyLocal optimizer '{name}'")


def _apply_learning_rate(optimizer, learning_rate):
    if learning_rate is None:
        return
    for method_name in ("set_learning_rate", "set_lr"):
        method = getattr(optimizer, method_name, None)
        if callable(method):
            method(float(learning_rate))
            return


def run_training(model_proto, trainable_params, loss_name, optimizer_name, learning_rate, x, y, temp_dir,
                 checkpoint_dir, epochs=3, batch_size=16):
    model_output_names = [out.name for out in model_proto.graph.output]
    training_model_path = temp_dir / "training_model.onnx"
    optimizer_model_path = temp_dir / "optimizer_model.onnx"
    eval_model_path = temp_dir / "eval_model.onnx"
    optimizer_type, _, _, _ = _resolve_optimizer_type(optimizer_name)

    ort_artifacts.generate_artifacts(
        model_proto,
        requires_grad=trainable_params,
        loss=_loss_type(loss_name),
        optimizer=optimizer_type,
        artifact_directory=str(temp_dir),
    )

    for path in (training_model_path, optimizer_model_path, eval_model_path):
        if path.exists():
            model = onnx.load(path)
            model.ir_version = 7
            onnx.save(model, path)

    state = api_mod.CheckpointState.load_checkpoint(str(temp_dir / "checkpoint"))
    session = api_mod.Module(str(training_model_path), state, str(eval_model_path), device="cpu")
    optimizer = api_mod.Optimizer(str(optimizer_model_path), session)
    _apply_learning_rate(optimizer, learning_rate)

    epoch_losses = []
    for _ in range(epochs):
        session.train()
        epoch_loss = 0.0
        batches_count = 0
        order = np.arange(len(x))
        np.random.shuffle(order)
        for start in range(0, len(x), batch_size):
            batch_indices = order[start:start + batch_size]
            bx, by = x[batch_indices], y[batch_indices]
            session.lazy_reset_grad()
            loss = session(bx, by)
            optimizer.step()
            epoch_loss += float(np.asarray(loss).reshape(-1)[0])
            batches_count += 1
        epoch_losses.append(epoch_loss / max(1, batches_count))

    inference_path = temp_dir / "inference.onnx"
    session.export_model_for_inferencing(str(inference_path), model_output_names)
    sess = ort.InferenceSession(str(inference_path), providers=["CPUExecutionProvider"])
    preds = sess.run(None, {sess.get_inputs()[0].name: x})[0]
    api_mod.CheckpointState.save_checkpoint(state, str(checkpoint_dir / "checkpoint"), False)
    return state, epoch_losses, preds
# ------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("loss_name, optimizer_name", [("cross_entropy", "adam"), ("mse", "sgd")])
def test_fullylocal_training_job(tmp_path, loss_name, optimizer_name):
    torch.manual_seed(0)
    classes = 5 if loss_name == "cross_entropy" else 1
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, classes))
    torch.onnx.export(net, (torch.randn(4, 8),), str(tmp_path / "graph.onnx"), input_names=["x"],
                      output_names=["logits"], dynamic_axes={"x": {0: "b"}, "logits": {0: "b"}}, dynamo=False)
    model_proto = onnx.load(str(tmp_path / "graph.onnx"))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 8)).astype(np.float32)
    y = (rng.integers(0, classes, 64) if classes > 1 else (x[:, :1] * 2.0)).astype(
        np.int64 if classes > 1 else np.float32)
    np.random.seed(0)
    temp_dir, checkpoint_dir = tmp_path / "job", tmp_path / "out"
    temp_dir.mkdir()
    checkpoint_dir.mkdir()

    state, losses, preds = run_training(model_proto, ["2.weight", "2.bias"], loss_name, optimizer_name, 0.05, x, y,
                                        temp_dir, checkpoint_dir)

    assert losses[-1] < losses[0]
    # Only the listed parameters are in the checkpoint and trained; the first layer stays the model's constant.
    assert sorted(n for n, _ in state.parameters) == ["2.bias", "2.weight"]
    with torch.no_grad():
        net[2].weight.copy_(torch.from_numpy(state.parameters["2.weight"].data))
        net[2].bias.copy_(torch.from_numpy(state.parameters["2.bias"].data))
        expected = net(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(preds, expected, rtol=1e-5, atol=1e-5)
    saved = api_mod.CheckpointState.load_checkpoint(Path(checkpoint_dir) / "checkpoint")
    np.testing.assert_array_equal(saved.parameters["2.weight"].data, state.parameters["2.weight"].data)
