import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from onnxtrain.artifacts.passes import FoldOutputIdentities


def _vi(name):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, [3])


def _graph():
    nodes = [
        helper.make_node("Mul", ["x", "x"], ["sq"]),
        helper.make_node("Add", ["sq", "x"], ["s"]),
        helper.make_node("Identity", ["sq"], ["sq_out"]),   # sq is also read by Add: folded
        helper.make_node("Identity", ["x"], ["x_out"]),     # a graph input: kept
        helper.make_node("Identity", ["s"], ["s_out"]),
    ]
    return helper.make_graph(nodes, "g", [_vi("x")], [_vi("sq_out"), _vi("x_out"), _vi("s_out")])


def _model(graph):
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _run(model):
    onnx.checker.check_model(model, full_check=True)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": np.array([1.0, -2.0, 3.0], np.float32)})


def test_output_identities_fold_into_their_producers():
    model = _model(_graph())
    expected = _run(model)
    result = FoldOutputIdentities()(model)
    graph = result.model.graph
    assert result.modified
    assert [n.op_type for n in graph.node] == ["Mul", "Add", "Identity"]
    assert graph.node[0].output[0] == "sq_out" and list(graph.node[1].input) == ["sq_out", "x"]
    for got, want in zip(_run(result.model), expected):
        np.testing.assert_array_equal(got, want)


def test_nothing_to_fold_leaves_the_graph_alone():
    model = _model(helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [_vi("x")], [_vi("y")]))
    result = FoldOutputIdentities()(model)
    assert not result.modified and result.model is model
    assert [n.op_type for n in model.graph.node] == ["Identity"]
