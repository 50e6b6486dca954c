"""Models in forms exporters and converters write: float16 / bfloat16 / mixed weights, Constant-node weights
(onnxscript), sparse initializers, sequence inputs, bytes arguments, names the training graph reserves,
quantized models, old invalid models. Each trains with correct gradients or is refused at generation with an
error that names the tensor and what was expected."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from onnxtrain import blocks
from onnxtrain.api import CheckpointState, Module, Optimizer
from onnxtrain.artifacts import LossType, generate_artifacts
from onnxtrain.errors import InvalidModelError

X = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
Y = np.random.default_rng(1).standard_normal((5, 3)).astype(np.float32)


def _mlp(w1_type: int = T.FLOAT, w2_type: int = T.FLOAT, opset: int = 17, ir: int = 8) -> onnx.ModelProto:
    """y = relu(x W1) W2 with float32 input and output; a weight in another float type is cast where it is read
    (onnxconverter-common's float16 conversion with keep_io_types writes this form)."""
    rng = np.random.default_rng(2)
    values = {"W1": rng.standard_normal((4, 8)), "W2": rng.standard_normal((8, 3))}
    types = {"W1": w1_type, "W2": w2_type}
    nodes, inits, read = [], [], {}
    for name, value in values.items():
        np_type = onnx.helper.tensor_dtype_to_np_dtype(types[name])
        inits.append(nh.from_array(value.astype(np_type), name))
        read[name] = name
        if types[name] != T.FLOAT:
            nodes.append(h.make_node("Cast", [name], [name + "_f"], to=T.FLOAT))
            read[name] = name + "_f"
    nodes += [h.make_node("MatMul", ["x", read["W1"]], ["h"]), h.make_node("Relu", ["h"], ["r"]),
              h.make_node("MatMul", ["r", read["W2"]], ["y"])]
    graph = h.make_graph(nodes, "mlp", [h.make_tensor_value_info("x", T.FLOAT, ["n", 4])],
                         [h.make_tensor_value_info("y", T.FLOAT, ["n", 3])], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", opset)])
    model.ir_version = ir
    return model


def _numpy_gradients(w1: np.ndarray, w2: np.ndarray) -> dict[str, np.ndarray]:
    """d mean((relu(X W1) W2 - Y)^2) / d W1, W2 in float64."""
    w1, w2 = w1.astype(np.float64), w2.astype(np.float64)
    pre = X @ w1
    out = np.maximum(pre, 0) @ w2
    d = 2 * (out - Y) / out.size
    return {"W1": X.T @ ((d @ w2.T) * (pre > 0)), "W2": np.maximum(pre, 0).T @ d}


def _train_and_check(model, folder, steps: int = 3, **kwargs) -> Module:
    """Generate, check the first step's gradients against numpy, train, evaluate and export."""
    paths = generate_artifacts(model, loss=LossType.MSELoss, optimizer=blocks.SGD(), artifact_directory=folder,
                               **kwargs)
    state = CheckpointState.load_checkpoint(paths["checkpoint"])
    module = Module(paths["training"], state, paths["eval"])
    optimizer = Optimizer(paths["optimizer"], module)
    optimizer.set_learning_rate(0.01)
    for step in range(steps):
        module(X, Y)
        if step == 0:
            expected = _numpy_gradients(state.parameters["W1"].data, state.parameters["W2"].data)
            for name, grad in expected.items():
                np.testing.assert_allclose(state.parameters[name].grad, grad, rtol=1e-4, atol=1e-5)
        optimizer.step()
        module.lazy_reset_grad()
    module.eval()
    loss = float(module(X, Y))
    module.export_model_for_inferencing(str(folder / "inference.onnx"), ["y"])
    onnx.checker.check_model(str(folder / "inference.onnx"), full_check=True)
    out = ort.InferenceSession(str(folder / "inference.onnx"), providers=["CPUExecutionProvider"]).run(
        None, {"x": X})[0]
    assert loss == pytest.approx(float(np.mean((out - Y) ** 2)), rel=1e-5)
    return module


# -- float types -----------------------------------------------------------------------------------------------

def test_mixed_float16_and_float32_parameters_are_refused_naming_both(tmp_path):
    with pytest.raises(TypeError, match=r"several dtypes \(float32: 1 \(e.g. 'W1'\); float16: 1 \(e.g. 'W2'\)\)"):
        generate_artifacts(_mlp(w2_type=T.FLOAT16), loss=LossType.MSELoss, optimizer=None,
                           artifact_directory=tmp_path)
    assert not list(tmp_path.iterdir())  # refused before any file is written


def test_mixed_float_types_train_the_float32_ones_with_the_float16_one_frozen(tmp_path):
    paths = generate_artifacts(_mlp(w2_type=T.FLOAT16), loss=LossType.MSELoss, optimizer=blocks.SGD(),
                               artifact_directory=tmp_path, requires_grad=["W1"], frozen_params=["W2"])
    state = CheckpointState.load_checkpoint(paths["checkpoint"])
    module = Module(paths["training"], state, paths["eval"])
    module(X, Y)
    w2 = state.parameters["W2"].data
    assert w2.dtype == np.float16
    np.testing.assert_allclose(state.parameters["W1"].grad, _numpy_gradients(state.parameters["W1"].data, w2)["W1"],
                               rtol=1e-4, atol=1e-5)


def test_float16_parameters_under_an_optimizer_are_refused_before_the_graphs_are_built(tmp_path, monkeypatch):
    from onnxtrain.artifacts import generate

    monkeypatch.setattr(generate, "build_graphs", lambda *a, **k: pytest.fail("graphs built before the refusal"))
    with pytest.raises(TypeError, match="supports float32 parameters; the 2 trainable parameters are float16 "
                                        r"\(e.g. 'W1'\).*optimizer=None"):
        generate_artifacts(_mlp(T.FLOAT16, T.FLOAT16), loss=LossType.MSELoss, optimizer=blocks.SGD(),
                           artifact_directory=tmp_path)


def test_bfloat16_state_is_refused_naming_the_tensor(tmp_path):
    with pytest.raises(TypeError, match="parameter 'W1' is bfloat16.*cannot feed bfloat16 arrays"):
        generate_artifacts(_mlp(w1_type=T.BFLOAT16), loss=LossType.MSELoss, optimizer=None,
                           artifact_directory=tmp_path, requires_grad=["W1"])


def test_a_bfloat16_weight_left_constant_trains_the_others(tmp_path):
    paths = generate_artifacts(_mlp(w1_type=T.BFLOAT16), loss=LossType.MSELoss, optimizer=blocks.SGD(),
                               artifact_directory=tmp_path, requires_grad=["W2"])
    state = CheckpointState.load_checkpoint(paths["checkpoint"])
    assert [n for n, _ in state.parameters] == ["W2"]
    Module(paths["training"], state, paths["eval"])(X, Y)
    assert np.abs(state.parameters["W2"].grad).max() > 0


# -- where the weights are --------------------------------------------------------------------------------------

def _as_constant_nodes(model: onnx.ModelProto) -> onnx.ModelProto:
    """The weights as Constant nodes, no initializers (onnxscript's form)."""
    constants = [h.make_node("Constant", [], [i.name], value=i) for i in model.graph.initializer]
    del model.graph.initializer[:]
    for node in reversed(constants):
        model.graph.node.insert(0, node)
    return model


@pytest.mark.parametrize("requires_grad", [["W1", "W2"], ["W*"]])
def test_weights_in_constant_nodes_train_when_named(requires_grad, tmp_path):
    _train_and_check(_as_constant_nodes(_mlp()), tmp_path, requires_grad=requires_grad)


def test_weights_in_constant_nodes_are_named_when_nothing_trains(tmp_path, caplog):
    generate_artifacts(_as_constant_nodes(_mlp()), loss=LossType.MSELoss, optimizer=blocks.SGD(),
                       artifact_directory=tmp_path)
    assert "2 Constant nodes hold float tensors (e.g. 'W1'): name them in requires_grad" in caplog.text


@pytest.mark.parametrize("coordinates", [False, True])
def test_sparse_initializers_train_as_dense_parameters(coordinates, tmp_path):
    model = _mlp()
    dense = nh.to_array(model.graph.initializer[1]).copy()
    dense[dense < 0.3] = 0
    flat = np.flatnonzero(dense)
    indices = np.stack(np.unravel_index(flat, dense.shape), 1) if coordinates else flat
    del model.graph.initializer[1]
    model.graph.sparse_initializer.append(h.make_sparse_tensor(
        nh.from_array(dense.reshape(-1)[flat], "W2"), nh.from_array(indices.astype(np.int64), "W2_indices"),
        list(dense.shape)))
    paths = generate_artifacts(model, loss=LossType.MSELoss, artifact_directory=tmp_path / "check")
    np.testing.assert_array_equal(CheckpointState.load_checkpoint(paths["checkpoint"]).parameters["W2"].data, dense)
    _train_and_check(model, tmp_path)


def test_a_model_given_as_bytes_a_path_or_serialized(tmp_path):
    onnx.save(_mlp(), tmp_path / "model.onnx")
    _train_and_check(str(tmp_path / "model.onnx").encode(), tmp_path / "path")
    _train_and_check(_mlp().SerializeToString(), tmp_path / "serialized")
    with pytest.raises(TypeError, match="11 bytes that neither name an existing file nor parse"):
        generate_artifacts(b"not a model", loss=LossType.MSELoss, artifact_directory=tmp_path / "bad")


# -- inputs and names ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind, spelled", [("sequence", "a sequence"), ("optional", "an optional")])
def test_an_input_that_is_not_a_tensor_is_named(kind, spelled, tmp_path):
    model = _mlp()
    tensor = h.make_tensor_type_proto(T.FLOAT, [5, 3])
    extra = (h.make_sequence_type_proto(tensor) if kind == "sequence" else h.make_optional_type_proto(tensor))
    model.graph.input.append(h.make_value_info("extra", extra))
    op = "SequenceAt" if kind == "sequence" else "OptionalGetElement"
    model.graph.node.append(h.make_node(op, ["extra", "zero"] if kind == "sequence" else ["extra"], ["e"]))
    model.graph.initializer.append(nh.from_array(np.array(0, np.int64), "zero"))
    model.graph.node[-2].output[0] = "y0"
    model.graph.node.append(h.make_node("Add", ["y0", "e"], ["y"]))
    with pytest.raises(ValueError, match=f"input 'extra' is {spelled}, not a tensor"):
        generate_artifacts(model, loss=LossType.MSELoss, artifact_directory=tmp_path)


@pytest.mark.parametrize("value, role", [("x", "the flag that restarts gradient accumulation"),
                                         ("h", "the gradient output of 'W2'")])
def test_a_value_with_a_name_the_training_graph_reserves_is_named(value, role, tmp_path):
    model = _mlp()
    reserved = {"x": "lazy_reset_grad", "h": "W2_grad.accumulation.out"}[value]
    for node in model.graph.node:
        node.input[:] = [reserved if i == value else i for i in node.input]
        node.output[:] = [reserved if o == value else o for o in node.output]
    for vi in model.graph.input:
        vi.name = reserved if vi.name == value else vi.name
    with pytest.raises(ValueError, match=f"value named '{reserved}', the name the training graph gives {role}"):
        generate_artifacts(model, loss=LossType.MSELoss, artifact_directory=tmp_path)


# -- old and quantized models -----------------------------------------------------------------------------------

def test_an_old_model_the_converter_cannot_read_is_reported_as_invalid(tmp_path):
    """IR 3 requires initializers to be graph inputs: the version converter's 'Input W1 is undefined' was the
    error; the checker's complaint about the model is."""
    with pytest.raises(InvalidModelError, match="W1 in initializer but not in graph input"):
        generate_artifacts(_mlp(opset=7, ir=3), loss=LossType.MSELoss, artifact_directory=tmp_path)


def test_an_old_model_with_initializers_as_inputs_trains(tmp_path):
    model = _mlp(opset=7, ir=3)
    model.graph.input.extend(h.make_tensor_value_info(i.name, T.FLOAT, i.dims) for i in model.graph.initializer)
    _train_and_check(model, tmp_path)


def test_parameters_behind_a_quantized_output_are_named_as_not_training(tmp_path):
    """A QDQ model quantizes its output too: no gradient reaches any float parameter."""
    model = _mlp()
    model.graph.initializer.extend([nh.from_array(np.array(0.05, np.float32), "s"),
                                    nh.from_array(np.array(0, np.int8), "z")])
    model.graph.node[-1].output[0] = "y_float"
    model.graph.node.extend([h.make_node("QuantizeLinear", ["y_float", "s", "z"], ["y_q"]),
                             h.make_node("DequantizeLinear", ["y_q", "s", "z"], ["y"])])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        generate_artifacts(model, loss=LossType.MSELoss, optimizer=blocks.SGD(), artifact_directory=tmp_path)
    assert any("2 trainable parameters (e.g. ['W1', 'W2']) reach the loss only through quantizing ops"
               in str(w.message) for w in caught)


@pytest.mark.parametrize("value, loss, where", [("y", LossType.MSELoss, "an output of the model"),
                                                ("h", LossType.L1Loss, "a value of the model"),
                                                ("W2", LossType.MSELoss, "a weight of the model")])
def test_a_model_value_with_the_label_name_is_not_taken_for_the_label(value, loss, where, tmp_path):
    """The loss declares its label input unless the model has a value of that name: a graph input is reused (as
    the peer), a value the model computes or holds would be compared with the model's output as the label."""
    model = _mlp()
    for node in model.graph.node:
        node.input[:] = ["target" if i == value else i for i in node.input]
        node.output[:] = ["target" if o == value else o for o in node.output]
    for vi in [*model.graph.output, *model.graph.initializer]:
        vi.name = "target" if vi.name == value else vi.name
    with pytest.raises(ValueError, match=f"label input is called 'target', which is {where}"):
        generate_artifacts(model, loss=loss, artifact_directory=tmp_path)


def test_a_model_input_with_the_label_name_is_the_label(tmp_path):
    model = _mlp()
    model.graph.input.append(h.make_tensor_value_info("target", T.FLOAT, ["n", 3]))
    paths = generate_artifacts(model, loss=LossType.MSELoss, artifact_directory=tmp_path)
    assert [i.name for i in onnx.load(paths["eval"]).graph.input][:2] == ["x", "target"]


def test_a_model_saved_at_ort_enable_all_names_the_level_to_save_at(tmp_path):
    rng = np.random.default_rng(3)
    graph = h.make_graph(
        [h.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), h.make_node("Relu", ["c"], ["y"])], "cnn",
        [h.make_tensor_value_info("x", T.FLOAT, [1, 8, 8, 8])], [h.make_tensor_value_info("y", T.FLOAT, [1, 16, 8, 8])],
        [nh.from_array(rng.standard_normal((16, 8, 3, 3)).astype(np.float32), "w"),
         nh.from_array(np.zeros(16, np.float32), "b")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    options.log_severity_level = 3
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    optimized = onnx.load(tmp_path / "optimized.onnx")
    if not any(n.domain == "com.microsoft.nchwc" for n in optimized.graph.node):
        pytest.skip("this CPU gets no NCHWc layout from onnxruntime")
    with pytest.raises(ValueError, match="ORT_ENABLE_ALL level.*save it from a session at ORT_ENABLE_EXTENDED"):
        generate_artifacts(optimized, loss=LossType.MSELoss, artifact_directory=tmp_path / "out")


def test_a_model_input_with_the_label_name_and_another_shape_is_named(tmp_path):
    model = _mlp()
    model.graph.input.append(h.make_tensor_value_info("target", T.FLOAT, ["n", 4]))
    with pytest.raises(ValueError, match=r"MSELoss cannot compute the loss: its Sub node reads 'y' float32\[n, 3\], "
                                         r"'target' float32\[n, 4\]"):
        generate_artifacts(model, loss=LossType.MSELoss, artifact_directory=tmp_path)


def test_a_model_input_with_the_class_label_name_and_a_float_type_is_named(tmp_path):
    model = _mlp()
    model.graph.input.append(h.make_tensor_value_info("labels", T.FLOAT, ["n"]))
    with pytest.raises(ValueError, match=r"reads its labels from 'labels', float32\[n\]: class labels are int64"):
        generate_artifacts(model, loss=LossType.CrossEntropyLoss, artifact_directory=tmp_path)


def test_a_glob_does_not_train_the_constant_nodes_of_a_model_with_initializers(tmp_path):
    model = _mlp()
    model.graph.node.insert(0, h.make_node("Constant", [], ["Wscale"], value=nh.from_array(
        np.full((1, 3), 2.0, np.float32), "Wscale")))
    model.graph.node[-1].output[0] = "y0"
    model.graph.node.append(h.make_node("Mul", ["y0", "Wscale"], ["y"]))
    paths = generate_artifacts(model, loss=LossType.MSELoss, artifact_directory=tmp_path / "glob", requires_grad=["W*"])
    assert [n for n, _ in CheckpointState.load_checkpoint(paths["checkpoint"]).parameters] == ["W1", "W2"]
    paths = generate_artifacts(model, loss=LossType.MSELoss, artifact_directory=tmp_path / "named",
                               requires_grad=["W1", "Wscale"])
    assert [n for n, _ in CheckpointState.load_checkpoint(paths["checkpoint"]).parameters] == ["W1", "Wscale"]


def _quantized_linear() -> onnx.ModelProto:
    """What onnxruntime.quantization writes for a Linear in QDQ format: its weight and bias stored as integers
    (``fc.weight_quantized``, ``fc.bias_quantized``) and dequantized where they are read."""
    rng = np.random.default_rng(4)
    inits = [nh.from_array(rng.integers(-127, 127, (4, 3)).astype(np.int8), "fc.weight_quantized"),
             nh.from_array(np.array(0.01, np.float32), "fc.weight_scale"),
             nh.from_array(np.array(0, np.int8), "fc.weight_zero_point"),
             nh.from_array(rng.integers(-100, 100, 3).astype(np.int32), "fc.bias_quantized"),
             nh.from_array(np.array(0.001, np.float32), "fc.bias_scale"),
             nh.from_array(np.array(0, np.int32), "fc.bias_zero_point")]
    nodes = [h.make_node("DequantizeLinear", ["fc.weight_quantized", "fc.weight_scale", "fc.weight_zero_point"],
                         ["w"]),
             h.make_node("DequantizeLinear", ["fc.bias_quantized", "fc.bias_scale", "fc.bias_zero_point"], ["b"]),
             h.make_node("MatMul", ["x", "w"], ["m"]), h.make_node("Add", ["m", "b"], ["y"])]
    graph = h.make_graph(nodes, "qdq", [h.make_tensor_value_info("x", T.FLOAT, ["n", 4])],
                         [h.make_tensor_value_info("y", T.FLOAT, ["n", 3])], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_naming_a_weight_the_quantizer_stored_as_integers_says_so(tmp_path):
    with pytest.raises(ValueError, match="'fc.bias' is not an initializer of the model: onnxruntime.quantization "
                                         "stored it as the integers 'fc.bias_quantized'.*train the float model"):
        generate_artifacts(_quantized_linear(), loss=LossType.MSELoss, artifact_directory=tmp_path,
                           requires_grad=["fc.bias"])


def test_a_qoperator_model_is_named_as_quantized(tmp_path):
    model = _quantized_linear()
    model.graph.node[-1].CopyFrom(h.make_node("QLinearAdd", ["m", "s", "z", "b", "s", "z", "s", "z"], ["y"],
                                              domain="com.microsoft"))
    model.opset_import.append(h.make_opsetid("com.microsoft", 1))
    with pytest.raises(ValueError, match=r"com.microsoft::QLinearAdd.*onnxruntime.quantization \(QOperator format"):
        generate_artifacts(model, loss=LossType.MSELoss, artifact_directory=tmp_path)
