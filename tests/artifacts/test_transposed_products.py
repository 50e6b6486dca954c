import itertools

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxtrain import artifacts
from onnxtrain.artifacts.passes import TransposedProducts


def _model(nodes, inputs, outputs):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, [None, None]) for n in outputs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _run(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


@pytest.mark.parametrize("trans_a,trans_b,alpha", [*itertools.product([0, 1], [0, 1], [1.0]), (1, 0, 0.5)])
def test_a_transposed_gemm_becomes_the_gemm_of_the_transposes(trans_a, trans_b, alpha):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((4, 3) if trans_a else (3, 4)).astype(np.float32)
    b = rng.standard_normal((5, 4) if trans_b else (4, 5)).astype(np.float32)
    model = _model([helper.make_node("Gemm", ["a", "b"], ["p"], transA=trans_a, transB=trans_b, alpha=alpha),
                    helper.make_node("Transpose", ["p"], ["pt"], perm=[1, 0]),
                    helper.make_node("Relu", ["pt"], ["y"])],
                   [("a", a.shape), ("b", b.shape)], ["y"])
    result = TransposedProducts()(model)
    assert result.modified
    assert [n.op_type for n in result.model.graph.node] == ["Gemm", "Relu"]
    gemm = result.model.graph.node[0]
    assert list(gemm.input) == ["b", "a"] and gemm.output[0] == "pt"
    want = np.maximum(alpha * ((a.T if trans_a else a) @ (b.T if trans_b else b)).T, 0)
    np.testing.assert_allclose(_run(result.model, {"a": a, "b": b})[0], want, rtol=1e-5, atol=1e-6)


def test_a_transposed_product_of_a_transposed_product_is_rewritten_too():
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((4, 5)).astype(np.float32)
    model = _model([helper.make_node("Gemm", ["a", "b"], ["p"]),
                    helper.make_node("Transpose", ["p"], ["pt"], perm=[1, 0]),
                    helper.make_node("Transpose", ["pt"], ["y"], perm=[1, 0])],
                   [("a", a.shape), ("b", b.shape)], ["y"])
    result = TransposedProducts()(model)
    assert [n.op_type for n in result.model.graph.node] == ["Gemm"]
    np.testing.assert_allclose(_run(result.model, {"a": a, "b": b})[0], a @ b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", ["bias", "other_reader", "graph_output", "other_perm"])
def test_left_alone(case):
    nodes = [helper.make_node("Gemm", ["a", "b", "c"] if case == "bias" else ["a", "b"], ["p"]),
             helper.make_node("Transpose", ["p"], ["pt"], perm=[1, 0])]
    outputs = ["pt"]
    if case == "other_reader":
        nodes.append(helper.make_node("Relu", ["p"], ["r"]))
        outputs.append("r")
    if case == "graph_output":
        outputs.append("p")
    if case == "other_perm":   # a 3-D transpose of the product's reshape is not a transposed product
        nodes[1:] = [helper.make_node("Unsqueeze", ["p", "zero"], ["p3"]),
                     helper.make_node("Transpose", ["p3"], ["pt"], perm=[0, 2, 1])]
    model = _model(nodes, [("a", [3, 4]), ("b", [4, 5]), ("c", [5]), ("zero", [1])], outputs)
    if case == "other_perm":
        model.graph.initializer.append(numpy_helper.from_array(np.zeros(1, np.int64), "zero"))
        del model.graph.input[-1]
    result = TransposedProducts()(model)
    assert not result.modified and result.model is model


def test_linear_layers_exported_with_a_transposed_weight_get_one_gemm_per_weight_gradient(tmp_path):
    """MatMul(x, Transpose(W)) on a 3-D input, as torch exports nn.Linear without constant folding: the weight's
    gradient is one Gemm (no Transpose of a Gemm in the training graph) and equals x^T dY summed over the rows."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((6, 4)).astype(np.float32)
    nodes = [helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]),
             helper.make_node("MatMul", ["x", "wt"], ["y"])]
    graph = helper.make_graph(nodes, "linear", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 5, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 5, 6])],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    artifacts.generate_artifacts(model, requires_grad=["w"], loss=artifacts.LossType.MSELoss,
                                 artifact_directory=str(tmp_path))
    training = onnx.load(str(tmp_path / "training_model.onnx"))
    producers = {o: n for n in training.graph.node for o in n.output}
    transposed = [n.name for n in training.graph.node if n.op_type == "Transpose"
                  and n.input[0] in producers and producers[n.input[0]].op_type == "Gemm"]
    assert not transposed

    x = rng.standard_normal((3, 5, 4)).astype(np.float32)
    target = rng.standard_normal((3, 5, 6)).astype(np.float32)
    session = ort.InferenceSession(training.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {i.name: np.array(True) if i.type == "tensor(bool)" else None for i in session.get_inputs()}
    feeds.update({"x": x, "target": target, "w": w,
                  "w_grad.accumulation.buffer": np.zeros_like(w)})
    names = [o.name for o in session.get_outputs()]
    grad = session.run(None, feeds)[names.index("w_grad.accumulation.out")]
    dy = 2 * (x @ w.T - target) / target.size
    np.testing.assert_allclose(grad, np.einsum("nso,nsi->oi", dy, x), rtol=1e-4, atol=1e-6)
