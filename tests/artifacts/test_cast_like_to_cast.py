"""CastLikeToCast (artifacts/passes/cast_like_to_cast.py): CastLike nodes whose target type is declared become
Casts; the model computes the same; generate_artifacts applies it to the source model."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from onnxtrain.artifacts import LossType, generate_artifacts
from onnxtrain.artifacts.passes import CastLikeToCast
from onnxtrain.artifacts.source import load_source_model


def _model() -> onnx.ModelProto:
    """y = x + Expand(CastLike(0, x), shape) + CastLike(w, h) with h's type unknown to the graph."""
    nodes = [
        helper.make_node("Constant", [], ["zero"], value=numpy_helper.from_array(np.array(0, np.int64))),
        helper.make_node("CastLike", ["zero", "x"], ["zero_like_x"], name="bias_type"),
        helper.make_node("Expand", ["zero_like_x", "shape"], ["bias"]),
        helper.make_node("Add", ["x", "bias"], ["h"]),
        helper.make_node("CastLike", ["w", "h"], ["w_like_h"], name="undeclared"),
        helper.make_node("Add", ["h", "w_like_h"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])],
                              [numpy_helper.from_array(np.array([3], np.int64), "shape"),
                               numpy_helper.from_array(np.array([1.0, 2.0, 3.0], np.float64), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_a_castlike_to_a_declared_type_becomes_a_cast():
    model = _model()
    result = CastLikeToCast()(model)  # __call__: the ONNX checker with full_check passes on the result
    assert result.modified
    ops = {n.name: n for n in result.model.graph.node if n.name}
    assert ops["bias_type"].op_type == "Cast"
    assert helper.get_attribute_value(ops["bias_type"].attribute[0]) == TensorProto.FLOAT
    assert ops["undeclared"].op_type == "CastLike"  # h is computed and has no value_info
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)

    def run(m):
        return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]

    np.testing.assert_array_equal(run(result.model), run(model))
    # a type given to the pass (a weight of a graph held without initializers) counts as declared
    assert CastLikeToCast({"h": TensorProto.FLOAT})(model).model.graph.node[4].op_type == "Cast"
    assert not CastLikeToCast()(result.model).modified


def test_generate_artifacts_reads_the_source_with_casts(tmp_path):
    source = load_source_model(_model())
    assert [n.op_type for n in source.model.graph.node].count("CastLike") == 1
    generate_artifacts(_model(), requires_grad=[], loss=LossType.MSELoss, artifact_directory=tmp_path)
    eval_model = onnx.load(tmp_path / "eval_model.onnx")
    assert "bias_type" in {n.name for n in eval_model.graph.node if n.op_type == "Cast"}
