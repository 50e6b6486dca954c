"""Frozen convolution weights as constants of the training sessions (runtime/passes/frozen_constants.py): which
values the pass turns into constants, that training gives the same results as with every value an input, that a
frozen parameter written after the sessions opened is not trained on stale constants, and that a caller's
SessionOptions reach those sessions."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxtrain import blocks
from onnxtrain.api import CheckpointState, Module, Optimizer
from onnxtrain.artifacts import LossType, generate_artifacts
from onnxtrain.errors import ArtifactError, PassError
from onnxtrain.runtime import run as run_module
from onnxtrain.runtime.backends.ort import copy_session_options
from onnxtrain.runtime.loading import load_model
from onnxtrain.runtime.passes import FrozenAsConstants, constant_names

BACKBONE = ["conv1.weight", "conv1.bias", "bn1.weight", "bn1.bias", "bn1.mean", "bn1.var", "conv2.weight",
            "bn2.weight", "bn2.bias", "bn2.mean", "bn2.var"]


def _cnn(seed: int = 0, dynamo_bias: bool = False) -> onnx.ModelProto:
    """Conv -> BatchNormalization (inference mode) -> Relu -> Conv (stride 2) -> BatchNormalization -> Relu -> GAP
    -> Gemm."""
    rng = np.random.default_rng(seed)
    w = {"conv1.weight": rng.standard_normal((8, 3, 3, 3)) * 0.3, "conv1.bias": rng.standard_normal(8) * 0.1,
         "conv2.weight": rng.standard_normal((16, 8, 3, 3)) * 0.2, "fc.weight": rng.standard_normal((4, 16)) * 0.5,
         "fc.bias": np.zeros(4)}
    for bn, c in (("bn1", 8), ("bn2", 16)):
        w.update({f"{bn}.weight": 1 + 0.1 * rng.standard_normal(c), f"{bn}.bias": 0.1 * rng.standard_normal(c),
                  f"{bn}.mean": 0.1 * rng.standard_normal(c), f"{bn}.var": 1 + rng.random(c)})
    nodes = [
        helper.make_node("Conv", ["input", "conv1.weight", "conv1.bias"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "bn1.weight", "bn1.bias", "bn1.mean", "bn1.var"], ["b1"]),
        helper.make_node("Relu", ["b1"], ["r1"]),
        helper.make_node("Conv", ["r1", "conv2.weight", *(["conv2.zero_bias"] if dynamo_bias else [])], ["c2"],
                         pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("BatchNormalization", ["c2", "bn2.weight", "bn2.bias", "bn2.mean", "bn2.var"], ["b2"]),
        helper.make_node("Relu", ["b2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "fc.weight", "fc.bias"], ["output"], transB=1),
    ]
    if dynamo_bias:  # torch's dynamo exporter (optimize=False) computes a bias-free Conv's zero bias at run time
        nodes[:0] = [
            helper.make_node("Shape", ["conv2.weight"], ["conv2.channels"], start=0, end=1),
            helper.make_node("Constant", [], ["zero"], value=numpy_helper.from_array(np.array(0, np.int64))),
            helper.make_node("CastLike", ["zero", "input"], ["zero_like_input"]),
            helper.make_node("Expand", ["zero_like_input", "conv2.channels"], ["conv2.zero_bias"]),
        ]
    graph = helper.make_graph(
        nodes, "cnn", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, 10, 10])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 4])],
        [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in w.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _generate(folder, trainable=("fc.*",), dynamo_bias: bool = False):
    frozen = [n for n in BACKBONE if not any(n.startswith(t.rstrip("*")) for t in trainable)]
    generate_artifacts(_cnn(dynamo_bias=dynamo_bias), requires_grad=list(trainable), frozen_params=frozen,
                       loss=LossType.CrossEntropyLoss, optimizer=blocks.AdamW(), artifact_directory=folder)
    return folder


def _batches(n: int = 6):
    rng = np.random.default_rng(1)
    return [(rng.standard_normal((5, 3, 10, 10)).astype(np.float32), rng.integers(0, 4, 5).astype(np.int64))
            for _ in range(n)]


def _train(folder, constants: bool, batches, write_frozen_at: int | None = None, session_options=None,
           fuse: bool = True, evaluate: bool = True):
    state = CheckpointState.load_checkpoint(folder / "checkpoint")
    module = Module(folder / "training_model.onnx", state, folder / "eval_model.onnx", session_options=session_options)
    module.training_run.frozen_constants = constants
    module.training_run.fuse = fuse
    optimizer = Optimizer(folder / "optimizer_model.onnx", module)
    losses = []
    for k, (x, y) in enumerate(batches):
        if k == write_frozen_at:
            state.parameters["conv2.weight"].data = state.parameters["conv2.weight"].data * 0.5
            state.parameters["bn1.mean"].data = state.parameters["bn1.mean"].data + 0.3
        losses.append(float(module(x, y)))
        optimizer.step()
        module.lazy_reset_grad()
    if not evaluate:
        return losses, None, state.parameters["fc.weight"].data
    module.eval()
    return losses, float(module(*batches[0])), state.parameters["fc.weight"].data


def _opened_constants(monkeypatch) -> list[list[str]]:
    """The constants each session opened by the training run holds (recorded as the sessions open)."""
    opened = []
    original = run_module.open_artifact_session

    def record(model, what, device, session_options, constants=None):
        opened.append(sorted(constants or {}))
        return original(model, what, device, session_options, constants)

    monkeypatch.setattr(run_module, "open_artifact_session", record)
    return opened


def test_the_pass_makes_only_convolution_and_batchnorm_weights_constants(tmp_path):
    # conv1 trains: the input gradient that reaches it reads conv2's weight and the BatchNormalizations' scales and
    # variances, so those stay inputs; the shifts and means only the forward BatchNormalizations read
    folder = _generate(tmp_path, trainable=("conv1.*", "fc.*"))
    train = load_model(folder / "training_model.onnx", "training model")
    frozen = {n: v for n, v in CheckpointState.load_checkpoint(folder / "checkpoint").values.frozen.items()}
    assert set(frozen) == {n for n in BACKBONE if not n.startswith("conv1")}
    result = FrozenAsConstants(frozen)(train)  # __call__: the ONNX checker with full_check passes on the result
    assert result.modified
    made = constant_names(result.model)
    assert sorted(made) == ["bn1.bias", "bn1.mean", "bn2.bias", "bn2.mean"]
    inputs = {i.name for i in result.model.graph.input}
    assert {"conv2.weight", "bn1.weight", "bn1.var", "bn2.weight", "bn2.var"} <= inputs
    assert not set(made) & inputs
    assert all(not t.raw_data for t in result.model.graph.initializer if t.name in made)
    # torch's dynamo exporter reads convolution weights' shapes: a Shape reader keeps a weight eligible
    shape_read = onnx.ModelProto()
    shape_read.CopyFrom(train)
    shape_read.graph.node.insert(0, helper.make_node("Shape", ["bn1.var"], ["bn1.var.shape"]))
    assert "bn1.var" not in constant_names(FrozenAsConstants(frozen)(shape_read).model)  # the backward reads it
    shape_read.graph.node.insert(0, helper.make_node("Shape", ["bn2.mean"], ["bn2.mean.shape"]))
    assert "bn2.mean" in constant_names(FrozenAsConstants(frozen)(shape_read).model)
    # nothing frozen that a convolution reads as a weight: unchanged
    assert not FrozenAsConstants({"fc.weight": np.zeros((4, 16), np.float32)})(train).modified
    # a placeholder declared with another shape than the model's is caught by the postconditions
    with pytest.raises(PassError, match="FrozenAsConstants"):
        FrozenAsConstants({**frozen, "bn1.mean": np.zeros(1, np.float32)})(train)


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "separate"])
def test_training_with_frozen_constants_matches_inputs(tmp_path, monkeypatch, fuse):
    folder = _generate(tmp_path)
    batches = _batches()
    opened = _opened_constants(monkeypatch)
    reference = _train(folder, False, batches, fuse=fuse)
    assert opened and not any(opened)
    opened.clear()
    with_constants = _train(folder, True, batches, fuse=fuse)
    assert opened[0] == sorted(BACKBONE)  # every frozen weight is read by a Conv or a BatchNormalization only
    # folding BatchNormalization into the Conv rounds differently
    np.testing.assert_allclose(with_constants[0], reference[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(with_constants[1], reference[1], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(with_constants[2], reference[2], rtol=1e-5, atol=1e-6)
    initial = CheckpointState.load_checkpoint(folder / "checkpoint").parameters["fc.weight"].data
    assert np.abs(reference[2] - initial).max() > 1e-3


def test_a_frozen_parameter_written_after_the_sessions_opened_is_used(tmp_path, monkeypatch):
    folder = _generate(tmp_path)
    batches = _batches()
    opened = _opened_constants(monkeypatch)
    reference = _train(folder, False, batches, write_frozen_at=3)
    stale_free = _train(folder, True, batches, write_frozen_at=3)
    np.testing.assert_allclose(stale_free[0], reference[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(stale_free[2], reference[2], rtol=1e-5, atol=1e-6)
    assert sum(1 for names in opened if names) == 2  # reopened once, after the write
    unchanged = _train(folder, True, batches)
    assert abs(unchanged[0][3] - reference[0][3]) > 1e-3  # the write does change the loss


def test_a_callers_session_options_reach_the_sessions_with_constants(tmp_path, monkeypatch):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.add_session_config_entry("session.set_denormal_as_zero", "1")
    copy = copy_session_options(options)
    assert copy is not options
    assert copy.intra_op_num_threads == 1
    assert copy.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    assert copy.get_session_config_entry("session.set_denormal_as_zero") == "1"

    folder = _generate(tmp_path)
    batches = _batches(3)
    opened = _opened_constants(monkeypatch)
    losses = _train(folder, True, batches, session_options=options)[0]
    assert opened[0] == sorted(BACKBONE)
    np.testing.assert_allclose(losses, _train(folder, False, batches)[0], rtol=1e-5, atol=1e-6)


def test_the_reference_backend_reads_frozen_weights_as_inputs(tmp_path, monkeypatch):
    folder = _generate(tmp_path)
    opened = _opened_constants(monkeypatch)
    state = CheckpointState.load_checkpoint(folder / "checkpoint")
    module = Module(folder / "training_model.onnx", state, device="reference")
    x, y = _batches(1)[0]
    module(x, y)
    assert opened and not any(opened)


def test_a_session_that_refuses_the_constants_reads_them_as_inputs(tmp_path, monkeypatch, caplog):
    folder = _generate(tmp_path)
    batches = _batches(3)
    original = run_module.open_artifact_session

    def refuse_constants(model, what, device, session_options, constants=None):
        if constants:
            raise ArtifactError(f"the {what} cannot be loaded: (refused for the test)")
        return original(model, what, device, session_options)

    monkeypatch.setattr(run_module, "open_artifact_session", refuse_constants)
    losses = _train(folder, True, batches)[0]
    assert "reads its frozen weights as inputs" in caplog.text and "refused for the test" in caplog.text
    monkeypatch.setattr(run_module, "open_artifact_session", original)
    np.testing.assert_array_equal(losses, _train(folder, False, batches)[0])


@pytest.mark.parametrize("dynamo_bias", [False, True], ids=["conv", "dynamo-zero-bias"])
def test_onnxruntime_folds_the_frozen_batchnorms_into_the_convolutions(tmp_path, dynamo_bias):
    """What the constants are for, seen in onnxruntime's optimized training graph: every BatchNormalization of the
    frozen backbone folded into its Conv; with the weights as inputs none is. With dynamo's zero bias, that needs
    the source's CastLike rewritten as a Cast (artifacts/passes/cast_like_to_cast.py)."""
    folder = _generate(tmp_path / "artifacts", dynamo_bias=dynamo_bias)
    batch_norms = {}
    for constants in (False, True):
        options = ort.SessionOptions()
        options.optimized_model_filepath = str(tmp_path / f"optimized_{constants}.onnx")
        _train(folder, constants, _batches(1), session_options=options, evaluate=False)  # eval would overwrite it
        optimized = onnx.load(options.optimized_model_filepath, load_external_data=False)
        batch_norms[constants] = sum(n.op_type == "BatchNormalization" for n in optimized.graph.node)
    assert batch_norms == {False: 2, True: 0}
