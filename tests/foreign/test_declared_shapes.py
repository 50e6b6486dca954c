"""Value infos that declare a static size where the model's inputs give a dynamic one (torch's dynamo exporter
declares a recurrent layer's output over a dynamic sequence with the example input's length): the gradient
must follow the inputs, not the declaration."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from onnxtrain.api import CheckpointState, Module
from onnxtrain.artifacts import LossType, generate_artifacts
from onnxtrain.conventions import grad_output_name
from onnxtrain.ir.types import TensorInfo, infer_from_inputs


def _model(declared_length: int = 8) -> onnx.ModelProto:
    """y = mean over the sequence of x * w, with h = x * w declared (N, 8, 4) though x is (N, T, 4)."""
    nodes = [helper.make_node("Mul", ["x", "w"], ["h"]),
             helper.make_node("ReduceMean", ["h"], ["y"], axes=[1], keepdims=0)]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "T", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        initializer=[numpy_helper.from_array(np.array([0.5, -1.0, 2.0, 1.5], np.float32), "w")],
        value_info=[helper.make_tensor_value_info("h", TensorProto.FLOAT, ["N", declared_length, 4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_inference_keeps_the_inputs_dynamic_dimension_over_a_declared_size():
    infos, corrected = infer_from_inputs(_model())
    assert infos["h"] == TensorInfo(TensorProto.FLOAT, ("N", "T", 4))
    assert corrected == {"h": infos["h"]}


def test_a_declaration_inference_cannot_contradict_is_kept():
    model = _model()
    model.graph.value_info.append(helper.make_tensor_value_info("unknown", TensorProto.FLOAT, [3]))
    infos, corrected = infer_from_inputs(model)
    assert infos["unknown"].shape == (3,) and "unknown" not in corrected


def test_the_gradient_follows_the_sequence_length_of_the_inputs(tmp_path):
    paths = generate_artifacts(_model(), requires_grad=["w"], loss=LossType.MSELoss, artifact_directory=tmp_path)
    training = onnx.load(paths["training"])
    assert [d.dim_param or d.dim_value for vi in training.graph.value_info if vi.name == "h"
            for d in vi.type.tensor_type.shape.dim] in ([], ["N", "T", 4])
    session = ort.InferenceSession(paths["training"], providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    w = np.array([0.5, -1.0, 2.0, 1.5], np.float32)
    for length in (8, 12):
        x = rng.standard_normal((3, length, 4)).astype(np.float32)
        labels = rng.standard_normal((3, 4)).astype(np.float32)
        given = {"x": x, "w": w, "lazy_reset_grad": np.array(True)}
        feeds = {i.name: given.get(i.name, labels if i.name == "target" else np.zeros(4, np.float32))
                 for i in session.get_inputs()}  # the rest: the accumulated gradient
        outputs = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
        y = (x * w).mean(axis=1)
        expected = (2 * (y - labels) / y.size * x.mean(axis=1)).sum(axis=0)
        np.testing.assert_allclose(outputs[grad_output_name("w")], expected, rtol=1e-5, atol=1e-6)


def test_what_only_the_declarations_lead_to_is_still_inferred():
    """r = Relu(Reshape(x, s)) with s a run-time input: only h's declaration gives r a rank."""
    nodes = [helper.make_node("Reshape", ["x", "s"], ["h"]), helper.make_node("Relu", ["h"], ["r"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6]),
                     helper.make_tensor_value_info("s", TensorProto.INT64, [None])],
        [helper.make_tensor_value_info("r", TensorProto.FLOAT, None)],
        value_info=[helper.make_tensor_value_info("h", TensorProto.FLOAT, ["N", 2, 3])])
    infos, corrected = infer_from_inputs(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert infos["h"].shape == ("N", 2, 3) and infos["r"].rank == 3
    assert corrected == {}


def test_a_static_output_declaration_does_not_fix_the_batch(tmp_path):
    """An export given dynamic axes for its inputs only can declare its outputs with the example's batch."""
    model = _model()
    del model.graph.value_info[:]
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4]))
    paths = generate_artifacts(model, requires_grad=["w"], loss=LossType.MSELoss, artifact_directory=tmp_path)
    from onnxtrain.api import CheckpointState, Module

    state = CheckpointState.load_checkpoint(paths["checkpoint"])
    module = Module(paths["training"], state, paths["eval"])
    rng = np.random.default_rng(1)
    x, labels = rng.standard_normal((5, 3, 4)).astype(np.float32), rng.standard_normal((5, 4)).astype(np.float32)
    module(x, labels)
    y = (x * state.parameters["w"].data).mean(axis=1)
    expected = (2 * (y - labels) / y.size * x.mean(axis=1)).sum(axis=0)
    np.testing.assert_allclose(state.parameters["w"].grad, expected, rtol=1e-5, atol=1e-6)
    module.export_model_for_inferencing(str(tmp_path / "inference.onnx"), ["y"])
    exported = onnx.load(str(tmp_path / "inference.onnx"))
    assert [d.dim_param or d.dim_value for d in exported.graph.output[0].type.tensor_type.shape.dim] == ["N", 4]


def test_a_corrected_declaration_keeps_its_metadata():
    from onnxtrain.ir.types import redeclare

    graph = _model().graph
    graph.value_info[0].metadata_props.add(key="pkg.torch.onnx.original_node_name", value="mul")
    _, corrected = infer_from_inputs(_model())
    redeclare(graph, corrected)
    assert [d.dim_param or d.dim_value for d in graph.value_info[0].type.tensor_type.shape.dim] == ["N", "T", 4]
    assert graph.value_info[0].metadata_props[0].value == "mul"


def test_the_model_is_left_as_it_was():
    model = _model()
    model.graph.output.append(helper.make_tensor_value_info("scalar", TensorProto.FLOAT, []))
    model.graph.node.append(helper.make_node("ReduceSum", ["y"], ["scalar"], keepdims=0))
    before = model.SerializeToString()
    infer_from_inputs(model)
    assert model.SerializeToString() == before


def test_a_symbol_the_exporter_put_on_two_axes_is_not_taken_for_their_equality(tmp_path):
    """The TorchScript exporter, given dynamic axes for its inputs only, declared a reflect-padded Conv1d's
    [batch, channels, time] output as ['Convout_dim_0', 8, 'Convout_dim_0']; inference cannot size the padded axes,
    so the declaration used to be kept and the target was refused unless its batch equalled its length."""
    pads = helper.make_node("Constant", [], ["pads"], value=numpy_helper.from_array(
        np.array([0, 0, 1, 0, 0, 1], np.int64)))
    nodes = [pads, helper.make_node("Pad", ["x", "pads"], ["padded"], mode="reflect"),
             helper.make_node("Conv", ["padded", "w"], ["out"])]
    w = np.random.default_rng(0).standard_normal((8, 4, 3)).astype(np.float32)
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 4, "t"])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT,
                                                             ["Convout_dim_0", 8, "Convout_dim_0"])],
                              initializer=[numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    infos, corrected = infer_from_inputs(model)
    assert "out" in corrected and "Convout_dim_0" not in infos["out"].shape
    paths = generate_artifacts(model, loss=LossType.MSELoss, artifact_directory=tmp_path)
    module = Module(paths["training"], CheckpointState.load_checkpoint(paths["checkpoint"]))
    x = np.random.default_rng(1).standard_normal((2, 4, 20)).astype(np.float32)
    assert np.isfinite(module(x, np.zeros((2, 8, 20), np.float32)))
