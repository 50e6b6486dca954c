"""onnxblock's forward and training blocks: what they build, and that it computes the right numbers."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import onnxtrain.onnxblock as onnxblock
from onnxtrain import conventions as names
from tests import models


def _run(model: onnx.ModelProto, feeds: dict, outputs: list[str] | None = None) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(outputs, feeds)


def _forward(x: np.ndarray, model: onnx.ModelProto) -> np.ndarray:
    return _run(model, {"input": x}, ["output"])[0]


class _Loss(onnxblock.ForwardBlock):
    def __init__(self, loss):
        super().__init__()
        self.loss = loss

    def build(self, output_name):
        return self.loss(output_name)


class _TrainingLoss(onnxblock.TrainingBlock):
    def __init__(self, loss):
        super().__init__()
        self.loss = loss

    def build(self, output_name):
        return self.loss(output_name)


@pytest.fixture
def batch():
    rng = np.random.default_rng(0)
    return rng.standard_normal((5, 8)).astype(np.float32), rng.standard_normal((5, 4)).astype(np.float32)


@pytest.mark.parametrize("loss, reference", [
    (onnxblock.loss.MSELoss(), lambda y, t: np.mean((y - t) ** 2)),
    (onnxblock.loss.L1Loss(), lambda y, t: np.mean(np.abs(y - t))),
    (onnxblock.loss.BCEWithLogitsLoss(), lambda y, t: np.mean(np.logaddexp(0, y) - t * y)),
])
def test_forward_block_makes_the_loss_the_only_output(loss, reference, batch):
    x, t = batch
    base = models.mlp()
    block = _Loss(loss)
    with onnxblock.base(base):
        out = block("output")
    model = block.to_model_proto()
    assert [o.name for o in model.graph.output] == [out]
    assert [i.name for i in model.graph.input] == ["input", "target"]
    assert len(base.graph.node) == 3, "the caller's model must stay untouched"
    (value,) = _run(model, {"input": x, "target": t})
    np.testing.assert_allclose(value, reference(_forward(x, base), t), rtol=1e-5)


def test_losses_take_the_peers_target_and_labels_names(batch):
    x, t = batch

    class Weighted(onnxblock.ForwardBlock):
        def __init__(self):
            super().__init__()
            self.mse, self.ce = onnxblock.loss.MSELoss(), onnxblock.loss.CrossEntropyLoss()
            self.w = onnxblock.blocks.Constant(0.25)
            self.mul, self.add = onnxblock.blocks.Mul(), onnxblock.blocks.Add()

        def build(self, output_name):
            return self.add(self.mse(output_name, target_name="goal"),
                            self.mul(self.w(), self.ce(output_name, labels_name="classes")))

    block = Weighted()
    base = models.mlp()
    with onnxblock.base(base):
        block("output")
    model = block.to_model_proto()
    assert [i.name for i in model.graph.input] == ["input", "goal", "classes"]
    labels = np.array([0, 1, 2, 3, 0])
    (value,) = _run(model, {"input": x, "goal": t, "classes": labels})
    y = _forward(x, base)
    logp = y - np.log(np.exp(y).sum(1, keepdims=True))
    expected = np.mean((y - t) ** 2) + 0.25 * -np.mean(logp[np.arange(5), labels])
    np.testing.assert_allclose(value, expected, rtol=1e-5)


def test_training_block_returns_the_peers_training_and_eval_models(batch):
    x, t = batch
    block = _TrainingLoss(onnxblock.loss.MSELoss())
    for name in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"):
        block.requires_grad(name)
    base = models.mlp()
    with onnxblock.base(base):
        block("output")
    training, evaluation = block.to_model_proto()
    trainable, frozen = block.parameters()
    assert [p.name for p in trainable] == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"] and not frozen
    weights = {p.name: onnx.numpy_helper.to_array(p) for p in trainable}
    feeds = {"input": x, "target": t, **weights, names.LAZY_RESET_GRAD: np.full(1, True),  # the peer's [1]
             **{names.grad_buffer_name(n): np.zeros_like(v) for n, v in weights.items()}}
    loss, *grads = _run(training, feeds)
    y = _forward(x, base)
    np.testing.assert_allclose(loss, np.mean((y - t) ** 2), rtol=1e-5)
    dy = 2 * (y - t) / y.size                     # d loss / d output, then through the last Gemm
    a = np.maximum(x @ weights["fc1.weight"].T + weights["fc1.bias"], 0)
    grad_out = dict(zip([o.name for o in training.graph.output[1:]], grads))
    np.testing.assert_allclose(grad_out[names.grad_output_name("fc2.weight")], dy.T @ a, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(grad_out[names.grad_output_name("fc2.bias")], dy.sum(0), rtol=1e-4, atol=1e-6)
    (eval_loss,) = _run(evaluation, {"input": x, "target": t, **weights})
    np.testing.assert_allclose(eval_loss, loss, rtol=1e-6)


def test_requires_grad_false_freezes_and_unmarked_parameters_train():
    block = _TrainingLoss(onnxblock.loss.MSELoss())
    block.requires_grad("fc2.weight", False)
    block.requires_grad("fc1.bias", True)
    block.requires_grad("fc1.bias", False)  # the last call wins
    with onnxblock.base(models.mlp()):
        block("output")
    trainable, frozen = block.parameters()
    assert [p.name for p in trainable] == ["fc1.weight", "fc2.bias"]
    assert [p.name for p in frozen] == ["fc2.weight", "fc1.bias"]  # in the order they were marked
    training, _ = block.to_model_proto()
    outputs = {o.name for o in training.graph.output}
    assert names.grad_output_name("fc1.weight") in outputs and names.grad_output_name("fc2.weight") not in outputs


def test_requires_grad_on_a_graph_input_returns_its_gradient(batch):
    x, t = batch
    block = _TrainingLoss(onnxblock.loss.MSELoss())
    block.requires_grad("input")
    with onnxblock.base(models.mlp()):
        block("output")
    training, _ = block.to_model_proto()
    inputs = {i.name for i in training.graph.input}
    assert names.grad_buffer_name("input") in inputs
    trainable, _ = block.parameters()
    weights = {p.name: onnx.numpy_helper.to_array(p) for p in trainable}
    feeds = {"input": x, "target": t, **weights, names.LAZY_RESET_GRAD: np.array(True),
             **{names.grad_buffer_name(n): np.zeros_like(v) for n, v in {**weights, "input": x}.items()}}
    (dx,) = _run(training, feeds, [names.grad_output_name("input")])
    eps, i = 1e-2, (2, 3)
    shifted = x.copy()
    shifted[i] += eps
    base = models.mlp()
    numeric = (np.mean((_forward(shifted, base) - t) ** 2) - np.mean((_forward(x, base) - t) ** 2)) / eps
    np.testing.assert_allclose(dx[i], numeric, rtol=0.05, atol=1e-4)


def test_parameters_and_models_before_the_block_is_called_raise():
    block = _TrainingLoss(onnxblock.loss.MSELoss())
    with pytest.raises(RuntimeError, match="Please build the training model first"):
        block.parameters()
    with pytest.raises(RuntimeError, match="Please build the training and eval models first"):
        block.to_model_proto()
    with pytest.raises(RuntimeError, match="Please build the forward models first"):
        _Loss(onnxblock.loss.MSELoss()).to_model_proto()
    with pytest.raises(RuntimeError, match="inside `with onnxblock.base"):
        _Loss(onnxblock.loss.MSELoss())("output")


def test_blocks_see_inputs_added_through_self_base_and_label_encoder():
    class EncodedLabels(onnxblock.ForwardBlock):
        def __init__(self):
            super().__init__()
            self.loss = onnxblock.loss.CrossEntropyLoss()
            self.encode = onnxblock.blocks.LabelEncoder(keys_int64s=[10, 11, 12, 13], values_int64s=[0, 1, 2, 3],
                                                        default_int64=0)

        def build(self, output_name):
            self.base.graph.input.append(onnx.helper.make_tensor_value_info("raw", onnx.TensorProto.INT64, ["b"]))
            return self.loss(output_name, self.encode("raw"))

    block = EncodedLabels()
    base = models.mlp()
    with onnxblock.base(base):
        block("output")
    model = block.to_model_proto()
    assert [i.name for i in model.graph.input] == ["input", "raw"]
    # written with default-domain ops (the artifacts may hold no ai.onnx.ml node)
    assert all(n.domain in ("", "ai.onnx") for n in model.graph.node)
    assert all(o.domain in ("", "ai.onnx") for o in model.opset_import)
    x = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    (value,) = _run(model, {"input": x, "raw": np.array([10, 13, 12])})
    y = _forward(x, base)
    logp = y - np.log(np.exp(y).sum(1, keepdims=True))
    np.testing.assert_allclose(value, -np.mean(logp[[0, 1, 2], [0, 3, 2]]), rtol=1e-5)


def test_empty_base_with_cast_and_linear_builds_a_trainable_model():
    class Model(onnxblock.ForwardBlock):
        def __init__(self):
            super().__init__()
            self.cast = onnxblock.blocks.Cast(to=onnx.TensorProto.FLOAT)
            self.linear = onnxblock.blocks.Linear(4, 2, seed=0)

        def build(self, x):
            return self.linear(self.cast(x))

    block = Model()
    with onnxblock.empty_base() as accessor:
        accessor.model.graph.input.append(onnx.helper.make_tensor_value_info("s", onnx.TensorProto.STRING, [1, 4]))
        out = block("s")
    model = block.to_model_proto()
    weights = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    assert sorted(weights) == ["linear.bias", "linear.weight"] and weights["linear.weight"].shape == (2, 4)
    assert np.abs(weights["linear.weight"]).max() <= 0.5  # torch's bound, 1/sqrt(in_features)
    (y,) = _run(model, {"s": np.array([["1", "2", "3", "4"]], dtype=object)}, [out])
    np.testing.assert_allclose(y, [[1, 2, 3, 4]] @ weights["linear.weight"].T + weights["linear.bias"], rtol=1e-5)


def test_empty_base_defaults_to_an_opset_and_ir_the_oldest_supported_onnxruntime_loads():
    """onnx 1.16's newest (opset 21, IR 10) made artifacts onnxruntime 1.17 refused to load; an explicit opset wins."""
    with onnxblock.empty_base() as accessor:
        model = accessor.model
    assert model.opset_import[0].version == min(onnx.defs.onnx_opset_version(), 20)
    assert model.ir_version <= 9
    with onnxblock.empty_base(opset_version=13) as accessor:
        assert accessor.model.opset_import[0].version == 13 and accessor.model.ir_version == 7

def test_save_checkpoint_and_load_checkpoint_to_model(tmp_path):
    block = _TrainingLoss(onnxblock.loss.MSELoss())
    block.requires_grad("fc1.weight", False)
    with onnxblock.base(models.mlp(seed=1)):
        block("output")
    onnxblock.save_checkpoint(block.parameters(), tmp_path / "checkpoint")
    target = models.mlp(seed=2)
    onnxblock.load_checkpoint_to_model(tmp_path / "checkpoint", target)
    for init in target.graph.initializer:  # trainable and frozen parameters both come back
        expected = next(i for i in models.mlp(seed=1).graph.initializer if i.name == init.name)
        np.testing.assert_array_equal(onnx.numpy_helper.to_array(init), onnx.numpy_helper.to_array(expected))
    from onnxtrain.api import CheckpointState

    state = CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    assert [(n, p.requires_grad) for n, p in state.parameters] == [
        ("fc1.bias", True), ("fc2.weight", True), ("fc2.bias", True), ("fc1.weight", False)]
