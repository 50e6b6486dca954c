"""InPlaceUpdate (runtime/passes/in_place.py): a chunked optimizer graph bound in place holds one copy of the
parameters and of each state, trains exactly as the double-buffered update, leaves everything unchanged when a
step is skipped (the runtime checks the gradients before the run), and refuses a graph whose input could be read
after it is overwritten."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from onnxtrain import blocks
from onnxtrain.api import CheckpointState, Module, Optimizer
from onnxtrain.artifacts import LossType, generate_artifacts
from onnxtrain.errors import PassError
from onnxtrain.runtime import update as update_module
from onnxtrain.runtime.passes import InPlaceUpdate
from tests import models

OPTIMIZERS = {"adamw": blocks.AdamW, "adamw_clip_decay": lambda: blocks.AdamW(weight_decay=0.01, max_norm=0.5),
              "sgd": blocks.SGD, "sgd_momentum": lambda: blocks.SGD(momentum=0.9)}
# Copies of each trainable parameter in the runtime's arrays: double-buffered (parameters and states twice) and
# in place (once each), plus one gradient vector.
COPIES = {"double": {"adamw": 7, "adamw_clip_decay": 7, "sgd": 3, "sgd_momentum": 5},
          "in_place": {"adamw": 4, "adamw_clip_decay": 4, "sgd": 2, "sgd_momentum": 3}}


def _train(folder, chunk, monkeypatch, steps=3, poison_step=None):
    monkeypatch.setattr(update_module, "CHUNK", chunk)
    state = CheckpointState.load_checkpoint(folder / "checkpoint")
    module = Module(folder / "training_model.onnx", state)
    opt = Optimizer(folder / "optimizer_model.onnx", module)
    rng = np.random.default_rng(3)
    snapshot = None
    for k in range(steps):
        x = rng.standard_normal((5, 8)).astype(np.float32)
        if k == poison_step:
            snapshot = _everything(state, module.training_run.update_graph)
        module(x, rng.integers(0, 4, 5).astype(np.int64))
        if k == poison_step:  # a finite loss with a non-finite gradient: only the update graph can tell
            state.values.gradient(state.values.names()[0])[...] = np.inf
        with pytest.warns(RuntimeWarning, match="skipped") if k == poison_step else _nothing():
            opt.step()
        module.lazy_reset_grad()
    return module.training_run.update_graph, state, snapshot


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _everything(state, update):
    """Copies of every parameter and optimizer state vector, and the step."""
    out = {n: state.values.value(n).copy() for n in state.values.names()}
    out.update({s: storage.current.copy() for s, storage in update.states.items()})
    out["step"] = state.step
    return out


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_in_place_trains_as_the_double_buffered_update_with_one_copy(tmp_path, monkeypatch, optimizer):
    generate_artifacts(models.mlp(), loss=LossType.CrossEntropyLoss, optimizer=OPTIMIZERS[optimizer](),
                       artifact_directory=tmp_path)
    whole, whole_state, _ = _train(tmp_path, 1 << 20, monkeypatch)
    chunked, chunked_state, _ = _train(tmp_path, 32, monkeypatch)
    assert (whole.in_place, chunked.in_place) == (False, True)
    trainable = whole_state.values.parameter_count()
    for kind, state in (("double", whole_state), ("in_place", chunked_state)):
        memory = state.values.memory()
        assert memory["params"] + memory["grads"] + memory["optimizer_states"] == \
            COPIES[kind][optimizer] * 4 * trainable, kind
    initial = CheckpointState.load_checkpoint(tmp_path / "checkpoint").parameters
    for name, p in whole_state.parameters.items():
        got = chunked_state.parameters[name].data
        np.testing.assert_allclose(got, p.data, rtol=1e-6, atol=1e-7, err_msg=name)
        assert not np.allclose(got, initial[name].data), name
    assert chunked_state.step == whole_state.step == 3


@pytest.mark.parametrize("optimizer", ["adamw", "sgd_momentum"])
def test_a_skipped_step_in_place_changes_nothing(tmp_path, monkeypatch, optimizer):
    generate_artifacts(models.mlp(), loss=LossType.CrossEntropyLoss, optimizer=OPTIMIZERS[optimizer](),
                       artifact_directory=tmp_path)
    update, state, before = _train(tmp_path, 32, monkeypatch, steps=3, poison_step=2)
    assert update.in_place
    after = _everything(state, update)
    assert len(update.states) == (2 if optimizer == "adamw" else 1)
    assert before.keys() == after.keys() and before["step"] == after["step"] == 2
    for key in before:
        np.testing.assert_array_equal(after[key], before[key], err_msg=key)


def test_in_place_does_not_fuse_and_the_training_call_leaves_the_parameters_alone(tmp_path, monkeypatch):
    """An update computed in place during the training call could not be thrown away: the parameters change
    only in optimizer.step(), as the peer's API says."""
    generate_artifacts(models.mlp(), loss=LossType.CrossEntropyLoss, optimizer=blocks.AdamW(),
                       artifact_directory=tmp_path)
    monkeypatch.setattr(update_module, "CHUNK", 32)
    state = CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    module = Module(tmp_path / "training_model.onnx", state)
    opt = Optimizer(tmp_path / "optimizer_model.onnx", module)
    x, y = np.ones((5, 8), np.float32), np.arange(5, dtype=np.int64) % 4
    for _ in range(3):
        before = state.values.flat_parameters(trainable_only=True).copy()
        module(x, y)
        np.testing.assert_array_equal(state.values.flat_parameters(trainable_only=True), before)
        opt.set_learning_rate(0.0)  # changed between the training call and the step: applies to this step
        opt.step()
        np.testing.assert_array_equal(state.values.flat_parameters(trainable_only=True), before)
        opt.set_learning_rate(1e-2)
        module.lazy_reset_grad()
    module(x, y)
    opt.step()
    assert not np.array_equal(state.values.flat_parameters(trainable_only=True), before)
    assert module.training_run.update_graph.in_place


def _graph(nodes, inputs, outputs):
    vi = [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [4]) for n in inputs]
    out = [helper.make_tensor_value_info(n, onnx.TensorProto.BOOL if n == "ok" else onnx.TensorProto.FLOAT,
                                         [] if n == "ok" else [4]) for n in outputs]
    return helper.make_model(helper.make_graph(nodes, "g", vi, out), opset_imports=[helper.make_opsetid("", 17)])


def test_the_finiteness_flag_is_dropped_with_the_nodes_only_it_needs():
    """In place, the runtime checks the gradients before the run: the graph no longer reduces them."""
    nodes = [helper.make_node("Sub", ["p", "g"], ["p.out"]),
             helper.make_node("ReduceSum", ["g"], ["s"], keepdims=0),
             helper.make_node("IsNaN", ["s"], ["nan"]),
             helper.make_node("Not", ["nan"], ["ok"])]
    model = InPlaceUpdate([("p", "p.out")], drop=["ok"])(_graph(nodes, ["p", "g"], ["p.out", "ok"])).model
    assert [n.op_type for n in model.graph.node] == ["Sub"]
    assert [o.name for o in model.graph.output] == ["p.out"]


def test_a_reader_that_could_run_after_the_write_is_refused():
    """``p`` also feeds another output: onnxruntime could run that read after ``p.out`` overwrote ``p``."""
    nodes = [helper.make_node("Sub", ["p", "g"], ["p.out"]), helper.make_node("Mul", ["p", "g"], ["other"])]
    with pytest.raises(PassError, match="Mul node 'other' reads 'p' but does not feed 'p.out'"):
        InPlaceUpdate([("p", "p.out")])(_graph(nodes, ["p", "g"], ["p.out", "other"]))


def test_an_output_that_is_an_input_passed_through_is_refused():
    with pytest.raises(PassError, match="output 'p' is not computed by a node"):
        InPlaceUpdate([("p", "p")])(_graph([], ["p"], ["p"]))
