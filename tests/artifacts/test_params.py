"""Which initializers train by default (requires_grad=None)."""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from onnxtrain.artifacts.params import plan_parameters


def _rope_like() -> onnx.GraphProto:
    """y = (x W) * cos(positions * inv_freq): a weight, and a rotary embedding's frequency buffer."""
    inits = [numpy_helper.from_array(np.ones((4, 4), np.float32), "layer.weight"),
             numpy_helper.from_array(np.full(4, 0.5, np.float32), "model.rotary_emb.inv_freq"),
             numpy_helper.from_array(np.arange(4, dtype=np.float32), "positions")]
    nodes = [helper.make_node("MatMul", ["x", "layer.weight"], ["h"]),
             helper.make_node("Mul", ["positions", "model.rotary_emb.inv_freq"], ["angles"]),
             helper.make_node("Cos", ["angles"], ["c"]),
             helper.make_node("Mul", ["h", "c"], ["y"])]
    return helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, [2, 4])],
                             [helper.make_tensor_value_info("y", 1, [2, 4])], initializer=inits)


def test_rotary_inverse_frequencies_are_not_trained_by_default():
    graph = _rope_like()
    weights = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    plan = plan_parameters(graph, weights, None, None)
    assert "layer.weight" in plan.trainable and "positions" in plan.trainable
    assert "model.rotary_emb.inv_freq" not in plan.trainable


def test_a_constant_a_tool_folded_into_an_initializer_is_not_trained_by_default():
    """onnxruntime's optimizer turns Constant nodes into initializers (an attention mask's 0 and -inf) that keep
    the TorchScript exporter's Constant output names: not parameters, unless named."""
    graph = _rope_like()
    graph.initializer.append(numpy_helper.from_array(np.zeros(1, np.float32), "/attention/Constant_3_output_0"))
    graph.node.append(helper.make_node("Add", ["y", "/attention/Constant_3_output_0"], ["y2"]))
    weights = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    assert "/attention/Constant_3_output_0" not in plan_parameters(graph, weights, None, None).trainable
    named = plan_parameters(graph, weights, ["/attention/Constant_3_output_0"], None)
    assert named.trainable == ["/attention/Constant_3_output_0"]


def test_a_known_buffer_trains_when_asked_for():
    graph = _rope_like()
    weights = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    plan = plan_parameters(graph, weights, ["*inv_freq"], None)
    assert plan.trainable == ["model.rotary_emb.inv_freq"]


def _dynamo_export_with_buffers(path):
    """A torch module with a parameter, a persistent and a non-persistent buffer and a tensor attribute, exported by
    torch's dynamo exporter, which marks each initializer's role in its value info."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxscript")  # the dynamo exporter's; it needs a newer onnx than onnxtrain's floor

    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 3)
            self.register_buffer("scale", torch.full((3,), 2.0))
            self.register_buffer("shift", torch.ones(3), persistent=False)
            self.offset = torch.tensor([0.5, 0.5, 0.5])

        def forward(self, x):
            return self.fc(x) * self.scale + self.shift + self.offset

    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Scaled(), (torch.randn(2, 4),), str(path), dynamo=True, optimize=False, verbose=False)
    return onnx.load(str(path))


def test_torch_buffers_and_constants_of_a_dynamo_export_are_not_trained_by_default(tmp_path):
    model = _dynamo_export_with_buffers(tmp_path / "scaled.onnx")
    weights = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    assert {"scale", "shift", "offset"} <= set(weights)  # the exporter keeps them as initializers
    plan = plan_parameters(model.graph, weights, None, None)
    assert sorted(plan.trainable) == ["fc.bias", "fc.weight"]
    assert sorted(plan_parameters(model.graph, weights, ["fc.*", "scale"], None).trainable) == [
        "fc.bias", "fc.weight", "scale"]   # listed, a buffer trains


def _weights_as_inputs() -> onnx.ModelProto:
    """y = x W + b with W and b graph inputs without values, as torch.onnx.export(export_params=False) writes."""
    nodes = [helper.make_node("MatMul", ["x", "fc.weight"], ["h"]), helper.make_node("Add", ["h", "fc.bias"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, ["N", 4]),
                                           helper.make_tensor_value_info("fc.weight", 1, [4, 3]),
                                           helper.make_tensor_value_info("fc.bias", 1, [3])],
                              [helper.make_tensor_value_info("y", 1, ["N", 3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_weight_exported_as_an_input_is_named_as_such():
    graph = _weights_as_inputs().graph
    with pytest.raises(ValueError, match=r"'fc.weight' is an input of the model, not an initializer.*export_params"):
        plan_parameters(graph, {}, ["fc.weight"], None)


def test_a_torch_name_the_exporter_replaced_says_how_to_keep_it():
    """torch.onnx.export's constant folding stores a Linear's weight on a 3-D input transposed as onnx::MatMul_N:
    a user's list of torch parameter names then misses it, and the error says why and what to do."""
    graph = _rope_like()
    graph.initializer[0].name = "onnx::MatMul_11"
    graph.node[0].input[1] = "onnx::MatMul_11"
    weights = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    with pytest.raises(ValueError, match=r"'layer.weight' is not an initializer.*onnx::MatMul_11.*"
                                         r"do_constant_folding=False"):
        plan_parameters(graph, weights, ["layer.weight"], None)
    with pytest.raises(ValueError) as plain:   # no made-up names: no such advice
        plan_parameters(_rope_like(), {i.name: numpy_helper.to_array(i) for i in _rope_like().initializer},
                        ["other.weight"], None)
    assert "do_constant_folding" not in str(plain.value)



def test_a_glob_over_a_module_names_the_weights_the_exporter_renamed():
    """TorchScript's default constant folding stores a Linear's weight on a 3-D input as onnx::MatMul_N: a glob over
    the layer's torch names trained its bias and missed that weight without a word."""
    import torch

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.dense, self.norm = torch.nn.Linear(4, 4), torch.nn.LayerNorm(4)

        def forward(self, x):
            return self.norm(self.dense(x))

    model = torch.nn.Sequential(Layer(), Layer())
    buffer = io.BytesIO()
    torch.onnx.export(model, (torch.randn(2, 3, 4),), buffer, dynamo=False, input_names=["x"])
    graph = onnx.load_from_string(buffer.getvalue()).graph
    weights = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    with pytest.warns(UserWarning, match=r"requires_grad: '1\.\*' matches the module of 1 weights that torch's export "
                                         r"renamed, which it does not train: \['onnx::MatMul_\d+ \(read by "
                                         r"/1/dense/MatMul\)'\].*do_constant_folding=False"):
        plan = plan_parameters(graph, weights, ["1.*"], None)
    assert "1.dense.bias" in plan.trainable and not any(p.startswith("onnx::") for p in plan.trainable)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan_parameters(graph, weights, ["1.dense.b*"], None)   # not the weight's module path: no warning

def test_a_model_without_weights_says_why_nothing_trains(tmp_path, caplog):
    from onnxtrain.artifacts import LossType, OptimType, generate_artifacts

    generate_artifacts(_weights_as_inputs(), loss=LossType.MSELoss, optimizer=OptimType.AdamW,
                       artifact_directory=tmp_path)
    assert "no parameter trains" in caplog.text
    assert "the model has no initializers but 3 inputs" in caplog.text and "export_params" in caplog.text


def _shapeless_input_conv() -> onnx.ModelProto:
    """A Conv and a mean over its output whose input 'x' declares no shape, not even a rank."""
    w = numpy_helper.from_array(np.ones((3, 2, 3, 3), np.float32), "conv.weight")
    nodes = [helper.make_node("Conv", ["x", "conv.weight"], ["c"]),
             helper.make_node("ReduceMean", ["c"], ["y"], keepdims=0, axes=[2, 3])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, None)],
                              [helper.make_tensor_value_info("y", 1, None)], initializer=[w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_an_input_without_shape_is_named_with_how_to_give_it_one(tmp_path):
    from onnxtrain.artifacts import LossType, generate_artifacts
    from onnxtrain.errors import UnknownShapeError

    model = _shapeless_input_conv()
    with pytest.raises(UnknownShapeError, match=r"the model's input 'x' has no shape.*make_tensor_value_info\('x'"):
        generate_artifacts(model, loss=LossType.CrossEntropyLoss, artifact_directory=tmp_path)
    model.graph.input[0].CopyFrom(helper.make_tensor_value_info("x", 1, ["N", 3, "H", "W"]))
    generate_artifacts(model, loss=LossType.CrossEntropyLoss, artifact_directory=tmp_path)  # the advice works


def _quantized(weight_dtype) -> onnx.ModelProto:
    """y = Dequantize(Quantize(x W1)) W2: a float W1 before a quantizing op and W2 after it, or an int8 W2
    dequantized (QDQ) when ``weight_dtype`` is int8. Scales and zero points are initializers."""
    w1 = numpy_helper.from_array(np.full((4, 4), 0.1, np.float32), "w1")
    w2 = numpy_helper.from_array(np.ones((4, 3), weight_dtype), "w2")
    scale = numpy_helper.from_array(np.array(0.05, np.float32), "scale")
    zero = numpy_helper.from_array(np.array(0, np.uint8), "zero")
    w2_zero = numpy_helper.from_array(np.array(0, np.int8), "w2_zero")
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
             helper.make_node("QuantizeLinear", ["h", "scale", "zero"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "scale", "zero"], ["d"])]
    if weight_dtype == np.int8:
        nodes.append(helper.make_node("DequantizeLinear", ["w2", "scale", "w2_zero"], ["w2_float"]))
        nodes.append(helper.make_node("MatMul", ["d", "w2_float"], ["y"]))
    else:
        nodes.append(helper.make_node("MatMul", ["d", "w2"], ["y"]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, ["N", 4])],
                              [helper.make_tensor_value_info("y", 1, ["N", 3])],
                              initializer=[w1, w2, scale, zero, w2_zero])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_quantization_scales_are_not_trained_by_default():
    graph = _quantized(np.float32).graph
    weights = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    assert plan_parameters(graph, weights, None, None).trainable == ["w1", "w2"]


def test_a_parameter_before_a_quantizing_op_is_named(tmp_path, caplog):
    from onnxtrain.artifacts import LossType, OptimType, generate_artifacts

    generate_artifacts(_quantized(np.float32), loss=LossType.MSELoss, optimizer=OptimType.AdamW,
                       artifact_directory=tmp_path)
    assert "1 trainable parameters (e.g. 'w1') are read by a quantizing op (QuantizeLinear)" in caplog.text


def test_a_quantized_model_says_why_nothing_trains(tmp_path, caplog):
    from onnxtrain.artifacts import LossType, OptimType, generate_artifacts

    generate_artifacts(_quantized(np.int8), loss=LossType.MSELoss, optimizer=OptimType.AdamW,
                       requires_grad=[], artifact_directory=tmp_path)
    assert "no parameter trains" in caplog.text
    assert "the model is quantized (DequantizeLinear, QuantizeLinear): train the float model" in caplog.text


def test_integer_initializers_are_not_frozen_parameters_nor_matched_by_globs():
    """A glob over a quantized layer matches its integer zero points, and a list can name a shape: neither is a
    parameter, so they stay constants (a frozen int64 shape came back from get_contiguous_parameters as
    float64 data that copy_buffer_to_parameters refused); a name given exactly is still an error."""
    weights = {"l.weight": np.ones((2, 2), np.float32), "l.zero_point": np.zeros(2, np.int8),
               "shape": np.array([-1, 2], np.int64)}
    graph = onnx.helper.make_graph([], "g", [], [])
    with pytest.warns(UserWarning, match="1 integer initializers .*'shape'"):
        plan = plan_parameters(graph, weights, ["l.*"], ["shape"])
    assert plan.trainable == ["l.weight"] and plan.frozen == []
    with pytest.raises(TypeError, match="'l.zero_point' has dtype int8"):
        plan_parameters(graph, weights, ["l.zero_point"], None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # a glob's integer matches are dropped without a word
        assert plan_parameters(graph, weights, None, ["*"]).frozen == ["l.weight"]


def test_statistics_of_a_batchnorm_written_as_arithmetic_are_not_trained_by_default():
    """torchvision's FrozenBatchNorm2d (DETR's backbone), exported by TorchScript: y = x * w / sqrt(var + eps) +
    (b - mean * w / sqrt(var + eps)), its running statistics plain initializers read by Add and Mul. Trained by
    default, a step could drive the variance negative."""
    names = ("bn.weight", "bn.bias", "bn.running_mean", "bn.running_var")
    inits = [numpy_helper.from_array(np.full(3, v, np.float32), n) for n, v in zip(names, (1.0, 0.0, 0.1, 2.0))]
    inits.append(numpy_helper.from_array(np.array(1e-5, np.float32), "eps"))
    nodes = [helper.make_node("Add", ["bn.running_var", "eps"], ["v"]), helper.make_node("Sqrt", ["v"], ["s"]),
             helper.make_node("Div", ["bn.weight", "s"], ["scale"]),
             helper.make_node("Mul", ["bn.running_mean", "scale"], ["shift"]),
             helper.make_node("Sub", ["bn.bias", "shift"], ["bias"]),
             helper.make_node("Mul", ["x", "scale"], ["xs"]), helper.make_node("Add", ["xs", "bias"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, [2, 3])],
                              [helper.make_tensor_value_info("y", 1, [2, 3])], initializer=inits)
    weights = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    assert plan_parameters(graph, weights, None, None).trainable == ["bn.weight", "bn.bias"]
    assert plan_parameters(graph, weights, ["bn.*"], None).trainable == list(names)


@pytest.mark.parametrize("given_as", ["path", "bytes"])
def test_an_input_without_shape_is_named_also_from_a_path_or_bytes(tmp_path, given_as):
    from onnxtrain.artifacts import LossType, generate_artifacts
    from onnxtrain.errors import UnknownShapeError

    model = _shapeless_input_conv()
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    source = str(path) if given_as == "path" else model.SerializeToString()
    with pytest.raises(UnknownShapeError, match=r"the model's input 'x' has no shape"):
        generate_artifacts(source, loss=LossType.CrossEntropyLoss, artifact_directory=tmp_path / "art")
