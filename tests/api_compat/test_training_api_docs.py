"""The peer's Python API documentation, "Prepare for training" and "Train the Model on the Device", as a user
follows it: export with the documented arguments, generate, train, evaluate, save, resume; the documented
property bag, learning-rate scheduler and nominal checkpoint.

Sources: https://onnxruntime.ai/docs/api/python/on_device_training/training_artifacts.html and
https://onnxruntime.ai/docs/api/python/on_device_training/training_api.html (the sample usage, the CheckpointState,
Module, Optimizer and LinearLRScheduler reference), and generate_artifacts' docstring on ``nominal_checkpoint``
(https://github.com/microsoft/onnxruntime/blob/main/orttraining/orttraining/python/training/artifacts.py), and
onnxblock's ``load_checkpoint_to_model`` ("Loads the checkpoint to an onnx inference model").
Adapted: the imports; the placeholders (paths, ``module(...)``) filled in with a small torch MLP on sklearn's digits.
"""

import numpy as np
import onnx
import pytest
from onnxruntime import InferenceSession

import onnxtrain.onnxblock as onnxblock  # was: import onnxruntime.training.onnxblock as onnxblock
from onnxtrain import artifacts  # was: from onnxruntime.training import artifacts
from onnxtrain.api import CheckpointState, LinearLRScheduler, Module, Optimizer  # was: onnxruntime.training.api
from tests.api_compat._data import batches, digits

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def artifact_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("docs")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    torch.onnx.export(net, (torch.randn(8, 64),), str(path / "forward.onnx"), input_names=["input"],
                      output_names=["output"], dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}},
                      export_params=True, do_constant_folding=False, training=torch.onnx.TrainingMode.TRAINING,
                      dynamo=False)
    model = onnx.load(str(path / "forward.onnx"))
    artifacts.generate_artifacts(model,
                                 requires_grad=["2.weight", "2.bias"],
                                 frozen_params=["0.weight", "0.bias"],
                                 loss=artifacts.LossType.CrossEntropyLoss,
                                 optimizer=artifacts.OptimType.AdamW,
                                 artifact_directory=str(path),
                                 nominal_checkpoint=True)
    return path


def test_sample_usage_train_eval_save_resume(artifact_dir, tmp_path):
    state = CheckpointState.load_checkpoint(str(artifact_dir / "checkpoint"))
    module = Module(str(artifact_dir / "training_model.onnx"), state, str(artifact_dir / "eval_model.onnx"),
                    device="cpu")
    optimizer = Optimizer(str(artifact_dir / "optimizer_model.onnx"), module)
    x, y = digits(512)
    module.eval()
    eval_before = float(np.squeeze(module(x, y)))
    for xb, yb in batches(x, y, 64):
        module.train()
        training_loss = module(xb, yb)
        optimizer.step()
        module.lazy_reset_grad()
    module.eval()
    eval_loss = float(np.squeeze(module(x, y)))
    assert np.isfinite(training_loss).all() and eval_loss < eval_before

    # "User defined properties can be indexed by name from the CheckpointState object."
    state.properties["epoch"] = 1
    state.properties["best_loss"] = eval_loss
    state.properties["run"] = "docs"
    CheckpointState.save_checkpoint(state, str(tmp_path / "ckpt"), include_optimizer_state=True)

    # onnxblock.load_checkpoint_to_model: the trained weights into the forward model, as the export writes them.
    forward = onnx.load(str(artifact_dir / "forward.onnx"))
    onnxblock.load_checkpoint_to_model(str(tmp_path / "ckpt"), forward)
    module.export_model_for_inferencing(str(tmp_path / "exported.onnx"), ["output"])
    runs = [InferenceSession(m, providers=["CPUExecutionProvider"]).run(["output"], {"input": x})[0]
            for m in (forward.SerializeToString(), str(tmp_path / "exported.onnx"))]
    np.testing.assert_allclose(runs[0], runs[1], rtol=1e-6, atol=1e-6)

    resumed = CheckpointState.load_checkpoint(str(tmp_path / "ckpt"))
    assert resumed.properties["epoch"] == 1 and resumed.properties["run"] == "docs"
    assert resumed.properties["best_loss"] == pytest.approx(eval_loss)
    assert "epoch" in resumed.properties and len(resumed.properties) == 3
    for name, param in state.parameters:
        np.testing.assert_array_equal(resumed.parameters[name].data, param.data)
    # The resumed run takes the same next step as the uninterrupted one (optimizer state included).
    module2 = Module(str(artifact_dir / "training_model.onnx"), resumed, str(artifact_dir / "eval_model.onnx"))
    optimizer2 = Optimizer(str(artifact_dir / "optimizer_model.onnx"), module2)
    for m, o in ((module, optimizer), (module2, optimizer2)):
        m.train()
        m(x[:64], y[:64])
        o.step()
        m.lazy_reset_grad()
    np.testing.assert_allclose(module2.get_contiguous_parameters().numpy(),
                               module.get_contiguous_parameters().numpy(), rtol=1e-6, atol=1e-7)


def test_linear_lr_scheduler_as_documented(artifact_dir):
    state = CheckpointState.load_checkpoint(str(artifact_dir / "checkpoint"))
    module = Module(str(artifact_dir / "training_model.onnx"), state, str(artifact_dir / "eval_model.onnx"))
    optimizer = Optimizer(str(artifact_dir / "optimizer_model.onnx"), module)
    # "Linearly increases the learning rate from 0 to initial_lr over warmup_step_count steps, then decays it
    # linearly to 0 at total_step_count" (onnxruntime-training 1.19.2 itself swaps the two counts: README).
    scheduler = LinearLRScheduler(optimizer, warmup_step_count=2, total_step_count=6, initial_lr=0.1)
    lrs = []
    for _ in range(6):
        lrs.append(optimizer.get_learning_rate())
        scheduler.step()
    np.testing.assert_allclose(lrs, [0.0, 0.05, 0.1, 0.075, 0.05, 0.025], atol=1e-7)


def test_nominal_checkpoint_then_parameters_from_the_server(artifact_dir):
    # generate_artifacts' docstring: the nominal checkpoint "contains nominal information about the model
    # parameters ... to reduce the size of the checkpoint packaged with the on-device application".
    full = CheckpointState.load_checkpoint(str(artifact_dir / "checkpoint"))
    server = Module(str(artifact_dir / "training_model.onnx"), full, str(artifact_dir / "eval_model.onnx"))
    buffer = server.get_contiguous_parameters(trainable_only=False)
    assert buffer.numpy().size == server.get_parameters_size(trainable_only=False)

    nominal = CheckpointState.load_checkpoint(str(artifact_dir / "nominal_checkpoint"))
    device = Module(str(artifact_dir / "training_model.onnx"), nominal, str(artifact_dir / "eval_model.onnx"))
    with pytest.raises(RuntimeError, match="load"):
        nominal.parameters["2.weight"]
    device.copy_buffer_to_parameters(buffer, trainable_only=False)
    np.testing.assert_array_equal(nominal.parameters["0.weight"].data, full.parameters["0.weight"].data)

    optimizers = [Optimizer(str(artifact_dir / "optimizer_model.onnx"), m) for m in (server, device)]
    x, y = digits(64)
    for m, o in zip((server, device), optimizers):
        m(x, y)
        o.step()
        m.lazy_reset_grad()
    trained = device.get_contiguous_parameters(trainable_only=True).numpy()
    np.testing.assert_array_equal(trained, server.get_contiguous_parameters(trainable_only=True).numpy())
    assert trained.size == 32 * 10 + 10
