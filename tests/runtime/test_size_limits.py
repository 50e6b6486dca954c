"""A sequence longer than a model's position table: the failed run names the input, its length and the table's
(runtime/size_limits.py), for both ways transformers index the table, with the dimension read from the input's
shape or from an intermediate value's."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxtrain.api import CheckpointState, Module
from onnxtrain.artifacts import LossType, generate_artifacts
from onnxtrain.errors import ExecutionError
from onnxtrain.ir.types import infer_tensor_info
from onnxtrain.runtime.size_limits import SizeLimit, exceeded, size_limits

VOCAB, POSITIONS, WIDTH, CLASSES = 20, 8, 4, 3


def _classifier(positions: str) -> onnx.ModelProto:
    """ids [batch, sequence] -> token + position embeddings -> mean over the sequence -> Gemm. ``positions``:
    "slice" (a BERT: position ids [1, POSITIONS] sliced to the sequence length, read from the ids' shape) or
    "range" (a GPT-2: range(0, sequence) gathered, the length read from the token embeddings' shape)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=(VOCAB, WIDTH)).astype(np.float32), "tokens"),
             numpy_helper.from_array(rng.normal(size=(POSITIONS, WIDTH)).astype(np.float32), "positions"),
             numpy_helper.from_array(rng.normal(size=(CLASSES, WIDTH)).astype(np.float32), "fc"),
             numpy_helper.from_array(np.arange(POSITIONS, dtype=np.int64)[None], "position_ids"),
             numpy_helper.from_array(np.array([1], np.int64), "one"), numpy_helper.from_array(np.array([0], np.int64),
                                                                                           "zero"),
             numpy_helper.from_array(np.array(0, np.int64), "zero_scalar"),
             numpy_helper.from_array(np.array(1, np.int64), "one_scalar")]
    nodes = [helper.make_node("Gather", ["tokens", "ids"], ["t"])]
    if positions == "slice":
        nodes += [helper.make_node("Shape", ["ids"], ["shape"]), helper.make_node("Gather", ["shape", "one"], ["n"]),
                  helper.make_node("Slice", ["position_ids", "zero", "n", "one"], ["pid"]),
                  helper.make_node("Gather", ["positions", "pid"], ["p"])]
    else:
        nodes += [helper.make_node("Shape", ["t"], ["shape"]),
                  helper.make_node("Gather", ["shape", "one_scalar"], ["n"], axis=0),
                  helper.make_node("Range", ["zero_scalar", "n", "one_scalar"], ["pid"]),
                  helper.make_node("Gather", ["positions", "pid"], ["p"])]
    nodes += [helper.make_node("Add", ["t", "p"], ["e"]),
              helper.make_node("ReduceMean", ["e"], ["m"], axes=[1], keepdims=0),
              helper.make_node("Gemm", ["m", "fc"], ["logits"], transB=1)]
    graph = helper.make_graph(nodes, positions, [helper.make_tensor_value_info("ids", TensorProto.INT64,
                                                                               ["batch", "sequence"])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", CLASSES])],
                              initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("positions", ["slice", "range"])
def test_the_position_table_limits_the_sequence(positions):
    model = _classifier(positions)
    limits = size_limits(model.graph, infer_tensor_info(model))
    assert limits == (SizeLimit("ids", 1, POSITIONS, "positions" if positions == "range" else "position_ids"),)
    assert exceeded(limits, {"ids": np.zeros((2, POSITIONS), np.int64)}) == ""
    assert "'ids' is 9 long on axis 1" in exceeded(limits, {"ids": np.zeros((2, POSITIONS + 1), np.int64)})


def test_without_the_inferred_shapes_only_the_inputs_own_dimensions_count():
    assert size_limits(_classifier("range").graph) == ()   # the length is read from the token embeddings' shape
    assert len(size_limits(_classifier("slice").graph)) == 1


@pytest.mark.parametrize("positions", ["slice", "range"])
def test_a_training_step_on_a_sequence_longer_than_the_table_names_the_input(tmp_path, positions):
    generate_artifacts(_classifier(positions), requires_grad=["tokens", "positions", "fc"],
                       loss=LossType.CrossEntropyLoss, artifact_directory=tmp_path)
    state = CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    module = Module(tmp_path / "training_model.onnx", state, tmp_path / "eval_model.onnx")
    labels = np.array([0, 2])
    module(np.ones((2, POSITIONS), np.int64), labels)   # the longest sequence trains
    for mode in ("train", "eval"):
        getattr(module, mode)()
        with pytest.raises(ExecutionError, match=rf"input 'ids' is {POSITIONS + 3} long on axis 1, and the model "
                                                 rf"indexes a table of {POSITIONS} .* at most {POSITIONS}"):
            module(np.ones((2, POSITIONS + 3), np.int64), labels)
