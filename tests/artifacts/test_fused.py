"""The train-step model (artifacts/fused.py): one plain-ONNX graph whose run is one step of Python's runtime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from onnxtrain import blocks
from onnxtrain import conventions as names
from onnxtrain.api import CheckpointState, Module, Optimizer
from onnxtrain.artifacts import LossType, generate_artifacts
from onnxtrain.artifacts.fused import train_step_model, write_train_step_model
from onnxtrain.conventions import OptimizerMeta, TrainingMeta, TrainStepMeta
from onnxtrain.errors import ArtifactError
from tests import models

OPTIMIZERS = {"adamw": lambda: blocks.AdamW(weight_decay=0.01), "sgd": lambda: blocks.SGD(momentum=0.9)}


def _generate(folder, model, optimizer="adamw"):
    generate_artifacts(model, loss=LossType.CrossEntropyLoss, optimizer=OPTIMIZERS[optimizer](),
                       artifact_directory=folder)
    return folder


def _batch(model_name, rng):
    shape = (5, 8) if model_name == "mlp" else (5, 2, 6, 6)
    return rng.standard_normal(shape).astype(np.float32), rng.integers(0, 3, 5).astype(np.int64)


def _feeds(folder, fused: onnx.ModelProto, x, y, lr: float) -> dict[str, np.ndarray]:
    """What a runtime binds for the first step from the generated checkpoint (no gradients yet)."""
    meta = TrainingMeta.from_model(fused, "train-step model")
    prefix = TrainStepMeta.from_model(fused).prefix
    state = CheckpointState.load_checkpoint(folder / "checkpoint")
    params = {n: state.parameters[n].data for n in meta.trainable}
    flat = np.concatenate([p.reshape(-1) for p in params.values()])
    feeds = {meta.user_inputs[0]: x, meta.labels[0]: y, **params, **state.buffers,
             prefix + names.LEARNING_RATE: np.array(lr, np.float32), prefix + names.STEP: np.array(1, np.int64),
             prefix + names.PARAMS: flat}
    for s in OptimizerMeta.from_model(fused).states:
        feeds[prefix + s] = np.zeros_like(flat)
    return feeds


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("model_name", ["mlp", "conv_bn"])
def test_one_run_is_one_step_of_the_python_runtime(tmp_path, rng, model_name, optimizer):
    folder = _generate(tmp_path, getattr(models, model_name)(), optimizer)
    path = write_train_step_model(folder)
    assert path == folder / "train_step_model.onnx" == folder / names.artifact_file("train_step")
    fused = onnx.load(path)
    onnx.checker.check_model(fused, full_check=True)
    assert {o.domain for o in fused.opset_import} <= {"", "ai.onnx"}
    step_meta = TrainStepMeta.from_model(fused)
    assert step_meta.reset is True
    inputs = [i.name for i in fused.graph.input]
    assert names.LAZY_RESET_GRAD not in inputs and not any(i.endswith(".accumulation.buffer") for i in inputs)

    x, y = _batch(model_name, rng)
    session = ort.InferenceSession(path.read_bytes(), providers=["CPUExecutionProvider"])
    outputs = dict(zip([o.name for o in session.get_outputs()], session.run(None, _feeds(folder, fused, x, y, 0.05))))

    state = CheckpointState.load_checkpoint(folder / "checkpoint")
    module = Module(folder / "training_model.onnx", state)
    python_optimizer = Optimizer(folder / "optimizer_model.onnx", module)
    python_optimizer.set_learning_rate(0.05)
    loss = module(x, y)
    python_optimizer.step()
    np.testing.assert_allclose(outputs["loss"], loss, rtol=1e-6)
    meta = TrainingMeta.from_model(fused, "train-step model")
    updated = np.concatenate([state.parameters[n].data.reshape(-1) for n in meta.trainable])
    np.testing.assert_allclose(outputs[step_meta.prefix + "params.out"], updated, rtol=1e-5, atol=1e-7)
    for b in meta.buffers:  # BatchNorm running statistics (conv_bn)
        np.testing.assert_allclose(outputs[names.buffer_output_name(b)], state.buffers[b], rtol=1e-6)


def test_the_flag_can_stay_an_input(tmp_path, rng):
    folder = _generate(tmp_path, models.mlp())
    train, optimizer = (onnx.load(folder / f) for f in ("training_model.onnx", "optimizer_model.onnx"))
    fused = train_step_model(train, optimizer, reset=None)
    assert TrainStepMeta.from_model(fused).reset is None
    assert names.LAZY_RESET_GRAD in [i.name for i in fused.graph.input]
    x, y = _batch("mlp", rng)
    feeds = _feeds(folder, fused, x, y, 0.05)
    meta = TrainingMeta.from_model(fused, "train-step model")
    session = ort.InferenceSession(fused.SerializeToString(), providers=["CPUExecutionProvider"])
    shapes = {n: feeds[n].shape for n in meta.trainable}
    offsets = np.cumsum([0, *(int(np.prod(s)) for s in shapes.values())])

    def flat_gradient(reset: bool, buffers: np.ndarray) -> np.ndarray:
        for (n, shape), a, b in zip(shapes.items(), offsets, offsets[1:]):
            feeds[names.grad_buffer_name(n)] = buffers[a:b].reshape(shape)
        feeds[names.LAZY_RESET_GRAD] = np.array(reset)
        return session.run(["optimizer/gradients"], feeds)[0]

    fresh = flat_gradient(True, np.full(offsets[-1], np.nan, np.float32))  # a reset ignores the buffers
    assert np.isfinite(fresh).all()
    np.testing.assert_allclose(flat_gradient(False, fresh), 2 * fresh, rtol=1e-6)  # no reset: buffers + fresh


def test_artifacts_that_do_not_belong_together_are_refused(tmp_path):
    mlp = _generate(tmp_path / "mlp", models.mlp())
    conv = _generate(tmp_path / "conv", models.conv_bn())
    with pytest.raises(ArtifactError, match="not generated together"):
        train_step_model(onnx.load(mlp / "training_model.onnx"), onnx.load(conv / "optimizer_model.onnx"))
    (conv / "optimizer_model.onnx").unlink()
    with pytest.raises(ArtifactError, match=r"no optimizer model at .*optimizer_model\.onnx"):
        write_train_step_model(conv)


def test_train_step_meta_round_trips_and_damage_is_an_artifact_error():
    model = onnx.helper.make_model(onnx.helper.make_graph([], "g", [], []))
    for key, value in TrainStepMeta("optimizer/", None).to_props().items():
        model.metadata_props.add(key=key, value=value)
    assert TrainStepMeta.from_model(model) == TrainStepMeta("optimizer/", None)
    model.metadata_props[0].value = '{"prefix": 3}'
    with pytest.raises(ArtifactError, match="damaged 'onnxtrain.train_step' metadata"):
        TrainStepMeta.from_model(model)
    with pytest.raises(ArtifactError, match="no 'onnxtrain.train_step' metadata"):
        TrainStepMeta.from_model(onnx.helper.make_model(onnx.helper.make_graph([], "g", [], [])))
