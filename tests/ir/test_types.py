import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxtrain import artifacts
from onnxtrain.ir.types import TensorInfo, infer_tensor_info


def _normalized_then_convolved(op_type: str, opset: int, **attrs) -> onnx.ModelProto:
    """x (b, 4, 3, 3) -> ``op_type`` -> Conv -> ReduceSumSquare: a normalization ONNX inference gives no output
    type for, before ops whose rules read their inputs' types."""
    inits = [numpy_helper.from_array(np.random.default_rng(0).standard_normal((2, 4, 1, 1)).astype(np.float32),
                                     "w")]
    inputs = ["x"]
    if op_type == "GroupNormalization":
        inits += [numpy_helper.from_array(np.ones(4, np.float32) * 1.5, "s"),
                  numpy_helper.from_array(np.full(4, 0.25, np.float32), "bias")]
        inputs += ["s", "bias"]
    nodes = [helper.make_node(op_type, inputs, ["n"], **attrs),
             helper.make_node("Conv", ["n", "w"], ["c"]),
             helper.make_node("ReduceSumSquare", ["c"], ["loss"], keepdims=0)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 4, 3, 3])],
                              [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


CASES = [("GroupNormalization", 21, {"num_groups": 2}), ("MeanVarianceNormalization", 13, {})]


@pytest.mark.parametrize("op_type,opset,attrs", CASES, ids=[c[0] for c in CASES])
def test_untyped_normalization_outputs_take_their_input_type(op_type, opset, attrs):
    model = _normalized_then_convolved(op_type, opset, **attrs)
    infos = infer_tensor_info(model)
    assert infos["n"] == TensorInfo(TensorProto.FLOAT, ("b", 4, 3, 3))
    assert infos["c"].elem_type == TensorProto.FLOAT and infos["c"].shape[:2] == ("b", 2)
    assert not model.graph.value_info  # the model itself is left as it was


@pytest.mark.parametrize("op_type,opset,attrs", CASES[:1], ids=[c[0] for c in CASES[:1]])
def test_untyped_normalization_trains(op_type, opset, attrs, tmp_path):
    """Before: generate_artifacts failed with "no type information for 'n'"; now the Conv weight's gradient matches
    a float64 numpy reference. (MeanVarianceNormalization-13 is not tried: the ONNX checker rejects any model with
    one, its function body failing inference, so generation refuses it as invalid.)"""
    from onnxtrain.api import CheckpointState, Module

    model = _normalized_then_convolved(op_type, opset, **attrs)
    artifacts.generate_artifacts(model, loss=None, artifact_directory=tmp_path)
    state = CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    module = Module(tmp_path / "training_model.onnx", state)
    x = np.random.default_rng(1).standard_normal((3, 4, 3, 3)).astype(np.float32)
    module(x)
    grad = state.parameters["w"].grad
    w = numpy_helper.to_array(model.graph.initializer[0]).astype(np.float64)
    n = _reference_normalization(op_type, x.astype(np.float64), attrs)
    c = np.einsum("oc,bchw->bohw", w[:, :, 0, 0], n)
    expected = 2 * np.einsum("bohw,bchw->oc", c, n)[:, :, None, None]
    assert np.linalg.norm(grad - expected) / np.linalg.norm(expected) < 1e-4


def _reference_normalization(op_type: str, x: np.ndarray, attrs: dict) -> np.ndarray:
    if op_type == "GroupNormalization":
        b, c = x.shape[:2]
        g = x.reshape(b, attrs["num_groups"], -1)
        g = (g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + 1e-5)
        return g.reshape(x.shape) * 1.5 + 0.25
    centered = x - x.mean((0, 2, 3), keepdims=True)
    return centered / (np.sqrt((centered ** 2).mean((0, 2, 3), keepdims=True)) + 1e-9)  # the spec's body


def _linear_with_reshape(ir_version: int, weights_are_inputs: bool = False) -> onnx.ModelProto:
    """y = Reshape(x W, [-1, 2, 32]): a 64x64 weight (4,096 floats) and an int64 shape inference must read."""
    w = numpy_helper.from_array(np.ones((64, 64), np.float32), "W")
    shape = numpy_helper.from_array(np.array([-1, 2, 32], np.int64), "shape")
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])]
    if weights_are_inputs:  # IR 3 lists initializers among the graph inputs
        inputs += [helper.make_tensor_value_info("W", TensorProto.FLOAT, [64, 64]),
                   helper.make_tensor_value_info("shape", TensorProto.INT64, [3])]
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["h"]),
                               helper.make_node("Reshape", ["h", "shape"], ["y"])], "g", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w, shape])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=ir_version)


@pytest.mark.parametrize(("ir_version", "weights_are_inputs"), [(8, False), (3, True)])
def test_inference_does_not_carry_the_weights(monkeypatch, ir_version, weights_are_inputs):
    """Every inference serializes the model; weights are declared as inputs for it, with the same infos."""
    model = _linear_with_reshape(ir_version, weights_are_inputs)
    sizes, infer = [], onnx.shape_inference.infer_shapes

    def recording(m, *args, **kwargs):
        sizes.append(m.ByteSize())
        return infer(m, *args, **kwargs)

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", recording)
    infos = infer_tensor_info(model)
    assert sizes and max(sizes) < 64 * 64 * 4     # the 16 KB weight never went to the C++ side
    assert infos["W"] == TensorInfo(TensorProto.FLOAT, (64, 64))
    assert infos["y"] == TensorInfo(TensorProto.FLOAT, ("batch", 2, 32))   # the int64 shape was read
    assert len(model.graph.initializer) == 2 and len(model.graph.input) == (3 if weights_are_inputs else 1)
