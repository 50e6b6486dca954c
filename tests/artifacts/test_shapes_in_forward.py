import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from onnxtrain.artifacts import LossType, generate_artifacts
from onnxtrain.artifacts.passes import ShapesInForward
from onnxtrain.artifacts.passes.recompute import forward_nodes
from tests.artifacts.as_built import as_built

D, H = 6, 10


def _backward_reads(model: onnx.ModelProto) -> dict[str, list[str]]:
    """The forward values other nodes read, with the op types of those readers."""
    graph = model.graph
    forward = forward_nodes(graph.node, graph.output[0].name)
    made = {o for k, n in enumerate(graph.node) if k in forward for o in n.output}
    reads: dict[str, list[str]] = {}
    for k, n in enumerate(graph.node):
        if k not in forward:
            for x in n.input:
                if x in made:
                    reads.setdefault(x, []).append(n.op_type)
    return reads


def _run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {k: v for k, v in feeds.items() if k in {i.name for i in model.graph.input}})


def _shapes_model() -> onnx.ModelProto:
    """loss = sum(relu(x)); the other outputs read relu(x)'s shape as a backward would: Shape, Shape(start=1),
    Size."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["h"]), helper.make_node("ReduceSum", ["h"], ["loss"], keepdims=0),
         helper.make_node("Shape", ["h"], ["s"]), helper.make_node("Shape", ["h"], ["tail"], start=1),
         helper.make_node("Size", ["h"], ["n"])],
        "shapes", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 4])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, []),
         helper.make_tensor_value_info("s", TensorProto.INT64, [3]),
         helper.make_tensor_value_info("tail", TensorProto.INT64, [2]),
         helper.make_tensor_value_info("n", TensorProto.INT64, [])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_shape_and_size_readers_read_a_shape_computed_in_the_forward():
    model = _shapes_model()
    assert sorted(_backward_reads(model)["h"]) == ["Shape", "Shape", "Size"]
    result = ShapesInForward()(model)
    assert result.modified
    assert "h" not in _backward_reads(result.model)
    # the forward's reader of h reads it through a Reshape to Shape(h): the Shape runs before h can be freed
    (reader,) = [n for n in result.model.graph.node if n.op_type == "ReduceSum"]
    (pin,) = [n for n in result.model.graph.node if n.output[0] == reader.input[0]]
    assert pin.op_type == "Reshape" and pin.input[0] == "h"
    for batch in (1, 5):
        x = np.random.default_rng(batch).normal(size=(batch, 3, 4)).astype(np.float32)
        for got, want in zip(_run(result.model, {"x": x}), _run(model, {"x": x})):
            np.testing.assert_array_equal(got, want)


def test_a_value_the_backward_reads_for_more_than_its_shape_is_left_alone():
    model = _shapes_model()
    model.graph.node.append(helper.make_node("Neg", ["h"], ["minus"]))
    model.graph.output.append(helper.make_tensor_value_info("minus", TensorProto.FLOAT, ["N", 3, 4]))
    result = ShapesInForward()(model)
    assert not result.modified and result.model is model


def _dynamic_mlp() -> onnx.ModelProto:
    """x [N, D] @ W1 -> h [N, H] -> Reshape [N, 2, H/2] -> Tanh -> Reshape [N, H] @ W2: the gradient of the
    first Reshape reads Shape(h), which nothing else of the backward reads (dW1 = x^T dh)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=(D, H)).astype(np.float32), "W1"),
             numpy_helper.from_array(rng.normal(size=(H, 3)).astype(np.float32), "W2"),
             numpy_helper.from_array(np.array([-1, 2, H // 2], np.int64), "split"),
             numpy_helper.from_array(np.array([-1, H], np.int64), "flat")]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W1"], ["h"]), helper.make_node("Reshape", ["h", "split"], ["r"]),
         helper.make_node("Tanh", ["r"], ["t"]), helper.make_node("Reshape", ["t", "flat"], ["f"]),
         helper.make_node("MatMul", ["f", "W2"], ["y"])],
        "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", D])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_the_reshape_gradient_of_a_dynamic_batch_no_longer_keeps_its_input(tmp_path):
    with as_built():
        paths = generate_artifacts(_dynamic_mlp(), requires_grad=["W1"], frozen_params=["W2"],
                                   loss=LossType.MSELoss, artifact_directory=tmp_path)
    model = onnx.load(paths["training"])
    assert _backward_reads(model).get("h") == ["Shape"]
    result = ShapesInForward()(model)
    assert result.modified and "h" not in _backward_reads(result.model)
    for batch in (2, 7):
        rng = np.random.default_rng(batch)
        feeds = {"x": rng.normal(size=(batch, D)).astype(np.float32),
                 "target": rng.normal(size=(batch, 3)).astype(np.float32), "lazy_reset_grad": np.array(True),
                 "W1": numpy_helper.to_array(_dynamic_mlp().graph.initializer[0]),
                 "W2": numpy_helper.to_array(_dynamic_mlp().graph.initializer[1])}
        for i in model.graph.input:
            if i.name not in feeds:  # the gradient buffer
                feeds[i.name] = np.zeros([d.dim_value for d in i.type.tensor_type.shape.dim], np.float32)
        got, want = _run(result.model, feeds), _run(model, feeds)
        assert len(got) == len(want) >= 2  # the loss and the gradient of W1
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)


def _same_index(derived, fresh) -> None:
    assert derived is not fresh
    assert derived.reads == fresh.reads and derived.producer == fresh.producer and derived.implicit == fresh.implicit
    assert [n.SerializeToString() for n in derived.nodes] == [n.SerializeToString() for n in fresh.nodes]


def test_the_index_it_hands_on_is_the_one_built_from_scratch(tmp_path, monkeypatch):
    """In a PassManager the next pass reads the index this pass derives from its input's (the inserted and edited
    nodes read again, the others shifted), not one built from the new model."""
    from onnxtrain.ir.passes import NodeIndex, node_index, shared_node_indices

    with as_built():
        paths = generate_artifacts(_dynamic_mlp(), requires_grad=["W1"], frozen_params=["W2"],
                                   loss=LossType.MSELoss, artifact_directory=tmp_path)
    built = []
    real = NodeIndex.__init__
    monkeypatch.setattr(NodeIndex, "__init__", lambda self, model: built.append(model) or real(self, model))
    for model in (_shapes_model(), onnx.load(paths["training"])):
        with shared_node_indices():
            result = ShapesInForward()(model)
            assert result.modified and built[-1] is model
            derived = node_index(result.model)
            assert built[-1] is model  # derived, not built
            _same_index(derived, NodeIndex(result.model))
            assert derived.ancestors(result.model.graph.output[0].name) == forward_nodes(
                result.model.graph.node, result.model.graph.output[0].name)
