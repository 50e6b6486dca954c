"""onnxruntime-training 1.15's ``CheckpointState`` indexing, which scripts of that release use: ``state[name]`` is
the parameter of that name, else the property; ``state[name] = value`` sets a parameter, else adds a property;
``name in state`` looks at both (1.16 moved these to ``state.parameters`` and ``state.properties``)."""

from __future__ import annotations

import numpy as np
import pytest

from onnxtrain.api import CheckpointState, Parameter
from onnxtrain.artifacts import LossType, OptimType, generate_artifacts
from tests import models


@pytest.fixture
def state(tmp_path):
    generate_artifacts(models.mlp(), loss=LossType.CrossEntropyLoss, optimizer=OptimType.AdamW,
                       artifact_directory=tmp_path)
    return CheckpointState.load_checkpoint(tmp_path / "checkpoint")


def test_properties_by_index_round_trip_through_a_checkpoint(state, tmp_path):
    state["epoch"] = 3
    state["best_accuracy"] = 0.75
    state["user"] = "device-1"
    assert "epoch" in state and "nope" not in state
    assert state["epoch"] == 3
    CheckpointState.save_checkpoint(state, tmp_path / "saved")
    loaded = CheckpointState.load_checkpoint(tmp_path / "saved")
    assert (loaded["epoch"], loaded["best_accuracy"], loaded["user"]) == (3, 0.75, "device-1")
    assert dict(loaded.properties) == {"epoch": 3, "best_accuracy": 0.75, "user": "device-1"}


def test_parameters_by_index(state):
    assert "fc1.weight" in state
    parameter = state["fc1.weight"]
    assert isinstance(parameter, Parameter) and parameter.requires_grad
    state["fc1.bias"] = np.full(16, 2.0, np.float32)
    np.testing.assert_array_equal(state.parameters["fc1.bias"].data, np.full(16, 2.0))
    assert "fc1.bias" not in state.properties  # a parameter's name sets the parameter, not a property
    with pytest.raises(ValueError, match="'fc1.bias' has shape"):
        state["fc1.bias"] = np.ones(3, np.float32)


def test_unknown_names_and_bad_property_values_are_named(state):
    with pytest.raises(KeyError, match="no parameter or property named 'nope'.*fc1.weight"):
        state["nope"]
    with pytest.raises(TypeError, match="property 'history' must be an int, float or str"):
        state["history"] = [1, 2]


def test_the_state_itself_is_not_iterable(state):
    with pytest.raises(TypeError, match="iterate state.parameters"):
        list(state)
    assert [name for name, _ in state.parameters][:1] == ["fc1.weight"]
