import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxtrain import artifacts
from onnxtrain.artifacts.passes import FoldIndexConstants


def _const(name, value):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value, np.int64), name))


def _ghost_slices():
    """timm GhostNet's ``x[:, :4]`` as torch's TorchScript exporter writes it without constant folding: the
    Slice's bounds are Unsqueeze(Constant); two such slices of convolutions of x are added."""
    nodes = [_const("zero", 0), _const("four", 4), _const("one", 1), _const("axis0", [0]),
             helper.make_node("Unsqueeze", ["zero", "axis0"], ["starts"]),
             helper.make_node("Unsqueeze", ["four", "axis0"], ["ends"]),
             helper.make_node("Unsqueeze", ["one", "axis0"], ["axes"]),
             helper.make_node("Conv", ["x", "w1"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["x", "w2"], ["c2"], kernel_shape=[1, 1]),
             helper.make_node("Slice", ["c1", "starts", "ends", "axes"], ["s1"]),
             helper.make_node("Slice", ["c2", "starts", "ends", "axes"], ["s2"]),
             helper.make_node("Add", ["s1", "s2"], ["y"])]
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((6, 3, 3, 3)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.standard_normal((6, 3, 1, 1)).astype(np.float32), "w2")]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, "h", "w"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4, "h", "w"])
    graph = helper.make_graph(nodes, "ghost", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_unsqueezed_constants_become_constants_and_the_values_stay():
    import onnxruntime as ort

    model = _ghost_slices()
    result = FoldIndexConstants()(model)
    assert result.modified
    ops = [n.op_type for n in result.model.graph.node]
    assert "Unsqueeze" not in ops
    assert ops.count("Constant") == 3  # starts, ends, axes; the unsqueezed scalars are no longer read
    x = np.random.default_rng(1).standard_normal((2, 3, 5, 7)).astype(np.float32)
    run = [ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
           for m in (model, result.model)]
    np.testing.assert_array_equal(run[0], run[1])


def test_shape_inference_then_keeps_the_slices_sizes():
    model = FoldIndexConstants()(_ghost_slices()).model
    inferred = onnx.shape_inference.infer_shapes(model)
    dims = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in inferred.graph.value_info}
    assert dims["s1"][:2] == ["n", 4]


@pytest.mark.parametrize("op,inputs,attrs", [
    ("Cast", [3], {"to": TensorProto.FLOAT}),        # a float result: not index arithmetic
    ("Unsqueeze", [list(range(70)), [0]], {}),       # more than MAX_ELEMENTS
    ("Relu", [[1, 2]], {}),                          # not a folded op
])
def test_what_is_left_alone(op, inputs, attrs):
    names = [f"c{k}" for k in range(len(inputs))]
    nodes = [_const(n, v) for n, v in zip(names, inputs)] + [helper.make_node(op, names, ["y"], **attrs)]
    graph = helper.make_graph(nodes, "g", [], [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert not FoldIndexConstants()(model).modified


def test_a_node_reading_a_graph_input_is_left_alone():
    nodes = [_const("axis0", [0]), helper.make_node("Unsqueeze", ["k", "axis0"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("k", TensorProto.INT64, [])],
                              [helper.make_tensor_value_info("y", TensorProto.INT64, None)])
    assert not FoldIndexConstants()(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])).modified


def test_the_training_graph_reduces_no_axis_at_run_time(tmp_path):
    artifacts.generate_artifacts(_ghost_slices(), requires_grad=["w1", "w2"], loss=artifacts.LossType.MSELoss,
                                 artifact_directory=str(tmp_path))
    training = onnx.load(str(tmp_path / "training_model.onnx"))
    assert not [n.name for n in training.graph.node if n.op_type == "NonZero"]


def _group_norm_scale(declared_last: int | None = 1):
    """The scale of a GroupNorm as torch's dynamo exporter writes it: ``x * Unsqueeze(w, Range(1, rank - 1, 1))``
    with constant bounds, over x of shape (n, 3, 4, q); ``y`` declared with the example's last size (timm's
    MobileViT v2 at 64 px: one patch column, so the export declares 1 for a size that is 4 at 128 px)."""
    nodes = [_const("one", 1), _const("three", 3),
             helper.make_node("Range", ["one", "three", "one"], ["axes"]),
             helper.make_node("Unsqueeze", ["w", "axes"], ["scale"]),
             helper.make_node("Mul", ["x", "scale"], ["y"])]
    w = numpy_helper.from_array(np.array([0.5, -1.0, 2.0], np.float32), "w")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 4, "q"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3, 4, "q"])
    declared = ([helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3, 4, declared_last])]
                if declared_last else [])
    graph = helper.make_graph(nodes, "group_norm_scale", [x], [y], [w], value_info=declared)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


def test_a_range_of_constants_becomes_a_constant_and_inference_reads_the_unsqueeze():
    result = FoldIndexConstants()(_group_norm_scale(None))
    assert result.modified
    assert "Range" not in [n.op_type for n in result.model.graph.node]
    inferred = onnx.shape_inference.infer_shapes(result.model)
    dims = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in inferred.graph.value_info}
    assert dims["scale"] == [3, 1, 1]


@pytest.mark.parametrize("bounds", [(0, 100, 1), (0, 5, 0), (5, 0, 1)])
def test_a_long_or_invalid_range_is_left_alone_and_an_empty_one_folds(bounds):
    names = ["start", "limit", "delta"]
    nodes = [_const(n, v) for n, v in zip(names, bounds)] + [helper.make_node("Range", names, ["y"])]
    graph = helper.make_graph(nodes, "g", [], [helper.make_tensor_value_info("y", TensorProto.INT64, ["k"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    result = FoldIndexConstants()(model)
    assert result.modified == (bounds == (5, 0, 1))  # 100 elements: above MAX_ELEMENTS; a zero step: invalid


@pytest.mark.parametrize("q", [1, 4])
def test_the_scale_gradient_sums_over_a_size_declared_static(tmp_path, q):
    """Without the fold, inference could not read the Unsqueeze's axes, the declared size 1 was taken for the
    product's last axis, and the weight's gradient summed over the batch and the third axis only: at q = 4 the
    training step failed in a Reshape (``Input shape:{3,1,4}, requested shape:{3}``)."""
    from onnxtrain.api import CheckpointState, Module

    artifacts.generate_artifacts(_group_norm_scale(), requires_grad=["w"], loss=artifacts.LossType.MSELoss,
                                 artifact_directory=str(tmp_path))
    state = CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    module = Module(tmp_path / "training_model.onnx", state)
    rng = np.random.default_rng(q)
    x = rng.standard_normal((2, 3, 4, q)).astype(np.float32)
    target = rng.standard_normal((2, 3, 4, q)).astype(np.float32)
    module.train()
    module(x, target)
    w = np.array([0.5, -1.0, 2.0])
    y = x * w[:, None, None]
    expected = (2 * (y - target) * x / y.size).sum(axis=(0, 2, 3))  # d mean((y - t)^2) / dw
    np.testing.assert_allclose(state.parameters["w"].grad, expected, rtol=1e-5, atol=1e-7)
