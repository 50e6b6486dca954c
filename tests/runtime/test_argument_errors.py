"""Mistakes in the runtime API's arguments get an error that names the argument and what to pass, not a Python
or numpy error from inside (each case failed before with AttributeError, numpy's "read-only", os's TypeError, or
was silently read by truthiness)."""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest

from onnxtrain.api import CheckpointState, Module, Optimizer
from onnxtrain.artifacts import LossType, OptimType, generate_artifacts
from onnxtrain.errors import InputError
from tests import models


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    out = tmp_path_factory.mktemp("artifacts")
    generate_artifacts(models.mlp(), loss=LossType.CrossEntropyLoss, optimizer=OptimType.AdamW,
                       artifact_directory=out)
    return out


@pytest.fixture
def run(artifacts):
    state = CheckpointState.load_checkpoint(artifacts / "checkpoint")
    module = Module(artifacts / "training_model.onnx", state)
    return state, module, Optimizer(artifacts / "optimizer_model.onnx", module)


def _batch():
    rng = np.random.default_rng(0)
    return rng.standard_normal((3, 8)).astype(np.float32), np.array([0, 1, 3], np.int64)


def test_save_checkpoint_arguments(run, tmp_path):
    state, _, _ = run
    with pytest.raises(TypeError, match=r"state must be a CheckpointState, got str"):
        CheckpointState.save_checkpoint(str(tmp_path / "a"), str(tmp_path / "b"))
    with pytest.raises(TypeError, match=r"arguments are swapped"):
        CheckpointState.save_checkpoint(str(tmp_path / "a"), state)
    with pytest.raises(TypeError, match=r"include_optimizer_state must be True or False, got str 'no'"):
        CheckpointState.save_checkpoint(state, tmp_path / "c", include_optimizer_state="no")
    assert not list(tmp_path.iterdir())  # nothing written
    CheckpointState.save_checkpoint(state, tmp_path / "c", include_optimizer_state=np.bool_(True))  # numpy's bool


@pytest.mark.parametrize("uri, error, message", [
    (None, TypeError, r"checkpoint_uri must be a path \(str or os.PathLike\), got NoneType"),
    (3, TypeError, r"checkpoint_uri must be a path .*, got int"),
    ("", ValueError, r"checkpoint_uri is empty"),
])
def test_checkpoint_paths(run, uri, error, message):
    state, _, _ = run
    with pytest.raises(error, match=r"load_checkpoint: " + message):
        CheckpointState.load_checkpoint(uri)
    with pytest.raises(error, match=r"save_checkpoint: " + message):
        CheckpointState.save_checkpoint(state, uri)


def test_trainable_only_must_be_a_bool(run):
    _, module, _ = run
    for call in (lambda: module.get_contiguous_parameters(trainable_only="no"),
                 lambda: module.get_parameters_size(trainable_only=None),
                 lambda: module.copy_buffer_to_parameters(module.get_contiguous_parameters(), trainable_only="no")):
        with pytest.raises(TypeError, match=r"trainable_only must be True or False"):
            call()


def test_python_lists_are_named(run):
    state, module, _ = run
    x, y = _batch()
    with pytest.raises(InputError, match=r"expects dtype float32, got float64 .*it is a Python list, which numpy "
                                         r"reads as float64: pass np.asarray\(value, dtype=np.float32\)"):
        module(x.tolist(), y)
    with pytest.raises(TypeError, match=r"it is a Python list"):
        module.copy_buffer_to_parameters(module.get_contiguous_parameters().numpy().tolist())
    with pytest.raises(TypeError, match=r"it is a Python list"):
        state.parameters["fc1.bias"].data = [0.0] * 16
    with pytest.raises(InputError) as caught:  # an array of the wrong dtype: no such hint
        module(x.astype(np.float64), y)
    assert "Python" not in str(caught.value)


def test_parameter_data_is_a_read_only_copy(run):
    state, module, optimizer = run
    data = state.parameters["fc1.weight"].data
    for edit in (lambda: data.__setitem__((0, 0), 5.0), lambda: data.__iadd__(1), lambda: data[0].fill(0)):
        with pytest.raises(ValueError, match=r"parameter 'fc1.weight''s .data is a read-only copy.*"
                                             r"state.parameters\[name\].data = new_array"):
            edit()
    # what is computed or copied from it is a plain, writeable array, shown as one
    for value in (data * 2, data.copy(), copy.deepcopy(data), np.asarray(data) + 0):
        assert type(value) is np.ndarray and value.flags.writeable
    assert repr(data).startswith("array(")
    module(*_batch())
    with pytest.raises(ValueError, match=r"'fc1.weight''s .grad is a read-only copy"):
        state.parameters["fc1.weight"].grad[0, 0] = 1.0
    state.parameters["fc1.weight"].data = data * 0  # the way to set it
    assert not state.parameters["fc1.weight"].data.any()


def test_step_without_a_training_call_warns(run):
    _, module, optimizer = run
    with pytest.warns(RuntimeWarning, match=r"no training call since the last step"):
        optimizer.step()
    module(*_batch())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        optimizer.step()
        module.lazy_reset_grad()
    with pytest.warns(RuntimeWarning, match=r"no training call since the last step"):
        optimizer.step()
