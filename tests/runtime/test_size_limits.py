"""A sequence longer than a model's position table: the failed run names the input, its length and the table's
(runtime/size_limits.py), for both ways transformers index the table, with the dimension read from the input's
shape or from an intermediate value's."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from onnxtrain.api import CheckpointState, Module
from onnxtrain.artifacts import LossType, generate_artifacts
from onnxtrain.errors import ExecutionError
from onnxtrain.ir.types import infer_tensor_info
from onnxtrain.runtime.size_limits import SizeLimit, exceeded, size_limits
from tests.models import POSITIONS
from tests.models import position_classifier as _classifier


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


def test_generate_artifacts_records_the_limits_for_the_javascript_runtime(tmp_path):
    """Both models' training metadata hold the limits (js/ explains a failed run from them; it has no shape
    inference); the length read from an intermediate value's shape needs the inferred shapes generation has."""
    from onnxtrain.conventions import TrainingMeta

    for positions, table in (("slice", "position_ids"), ("range", "positions")):
        generate_artifacts(_classifier(positions), requires_grad=["tokens", "positions", "fc"],
                           loss=LossType.CrossEntropyLoss, artifact_directory=tmp_path / positions)
        for name in ("training_model.onnx", "eval_model.onnx"):
            meta = TrainingMeta.from_model(onnx.load(tmp_path / positions / name))
            assert meta.size_limits == [{"input": "ids", "axis": 1, "limit": POSITIONS, "table": table}]
