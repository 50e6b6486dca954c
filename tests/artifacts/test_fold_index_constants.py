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
