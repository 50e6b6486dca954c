"""SequencesToSplit: torch.split exported as SplitToSequence + SequenceAt (dynamo) trains as a Split."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from onnxtrain.artifacts import LossType, generate_artifacts
from onnxtrain.artifacts.passes import SequencesToSplit
from onnxtrain.autodiff.check import check_gradients, run_model
from onnxtrain.checkpoint import load_checkpoint

FLOAT = onnx.TensorProto.FLOAT


def _model(split: np.ndarray | None, keepdims: int = 1, positions=(0, -1)) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 6)).astype(np.float64), "w")]
    split_inputs = []
    if split is not None:
        inits.append(numpy_helper.from_array(split, "split"))
        split_inputs = ["split"]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("SplitToSequence", ["h", *split_inputs], ["seq"], axis=1, keepdims=keepdims)]
    outs = []
    for k, p in enumerate(positions):
        inits.append(numpy_helper.from_array(np.array(p, dtype=np.int64), f"p{k}"))
        nodes.append(helper.make_node("SequenceAt", ["seq", f"p{k}"], [f"y{k}"]))
        outs.append(f"y{k}")
    nodes.append(helper.make_node("Mul", outs, ["output"]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.DOUBLE, ["b", 4])],
                              [helper.make_tensor_value_info("output", onnx.TensorProto.DOUBLE,
                                                             ["b", "n"] if keepdims else ["b"])],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    return model


CASES = {"sizes": (np.array([3, 3], np.int64), 1), "chunk": (np.array(2, np.int64), 1), "pieces": (None, 0)}


@pytest.mark.parametrize("case", list(CASES))
def test_same_values_and_correct_gradients(case):
    split, keepdims = CASES[case]
    model = _model(split, keepdims)
    result = SequencesToSplit()(model)
    assert result.modified
    ops = {n.op_type for n in result.model.graph.node}
    assert "SplitToSequence" not in ops and "SequenceAt" not in ops and "Split" in ops
    x = np.random.default_rng(1).standard_normal((3, 4))
    np.testing.assert_allclose(run_model(result.model, {"x": x})[0], run_model(model, {"x": x})[0], rtol=1e-12)
    free = onnx.ModelProto()
    free.CopyFrom(result.model)          # differentiate with respect to the weight, fed as an input
    w = numpy_helper.to_array(next(i for i in free.graph.initializer if i.name == "w"))
    kept = [i for i in free.graph.initializer if i.name != "w"]
    del free.graph.initializer[:]
    free.graph.initializer.extend(kept)
    free.graph.input.append(helper.make_tensor_value_info("w", onnx.TensorProto.DOUBLE, [4, 6]))
    report = check_gradients(free, {"x": x, "w": w}, ["x", "w"])
    assert report.ok, report


def test_a_sequence_read_otherwise_is_left_alone():
    model = _model(np.array([3, 3], np.int64))
    model.graph.node.append(helper.make_node("SequenceLength", ["seq"], ["n"]))
    assert not SequencesToSplit()(model).modified


def test_generate_artifacts_trains_through_a_dynamo_style_split(tmp_path):
    model = _model(np.array([3, 3], np.int64), positions=(0, 1))
    for t in model.graph.initializer:
        if t.data_type == onnx.TensorProto.DOUBLE:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float32), t.name))
    model.graph.input[0].type.tensor_type.elem_type = FLOAT
    model.graph.output[0].type.tensor_type.elem_type = FLOAT
    generate_artifacts(model, loss=LossType.MSELoss, artifact_directory=tmp_path)
    assert list(load_checkpoint(tmp_path / "checkpoint").trainable) == ["w"]


def test_sizes_computed_at_run_time_split_the_same_way():
    """CvT's torch.split(x, [1, height * width], 1), exported by dynamo: the sizes are read from the input's shape,
    so they are no constant; their count is static, so the Split reads them at run time (no gradient rule for
    SequenceAt stopped generation)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.array(v, np.int64), name)
             for name, v in (("one", [1]), ("axis1", [1]), ("p0", 0), ("p1", 1))]
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Gather", ["shape", "axis1"], ["width"]),
             helper.make_node("Sub", ["width", "one"], ["rest"]),
             helper.make_node("Concat", ["one", "rest"], ["sizes"], axis=0),
             helper.make_node("SplitToSequence", ["x", "sizes"], ["seq"], axis=1),
             helper.make_node("SequenceAt", ["seq", "p0"], ["cls"]),
             helper.make_node("SequenceAt", ["seq", "p1"], ["tokens"]),
             helper.make_node("Mul", ["cls", "tokens"], ["output"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.DOUBLE, ["b", "n"])],
                              [helper.make_tensor_value_info("output", onnx.TensorProto.DOUBLE, ["b", None])],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    result = SequencesToSplit()(model)
    assert result.modified and {"SplitToSequence", "SequenceAt"}.isdisjoint(n.op_type for n in result.model.graph.node)
    for width in (4, 7):
        x = rng.standard_normal((3, width))
        np.testing.assert_allclose(run_model(result.model, {"x": x})[0], x[:, :1] * x[:, 1:], rtol=1e-12)
        report = check_gradients(result.model, {"x": x}, ["x"])
        assert report.ok, report
