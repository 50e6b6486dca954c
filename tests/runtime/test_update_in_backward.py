"""Optimizer(..., update_in_backward=True) (runtime/passes/update_in_backward.py): every training call updates
each chunk of the parameters as soon as the backward has its gradient. It trains exactly as the usual loop
(``module(x, y); optimizer.step(); module.lazy_reset_grad()``), keeps no gradient vector, updates nothing after a
NaN loss, keeps a chunk whose gradient is not finite while updating the others, and refuses an optimizer that
needs every gradient before it can update any (global-norm clipping)."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxtrain import blocks
from onnxtrain import conventions as names
from onnxtrain.api import CheckpointState, Module, Optimizer
from onnxtrain.artifacts import LossType, generate_artifacts
from onnxtrain.errors import ArtifactError
from onnxtrain.runtime import update as update_module
from tests import models

OPTIMIZERS = {"adamw": lambda: blocks.AdamW(weight_decay=0.01), "sgd_momentum": lambda: blocks.SGD(momentum=0.9)}


def _small_chunks(monkeypatch) -> None:
    """Chunks of 32 elements: parameters split over several chunks and chunks over several parameters."""
    monkeypatch.setattr(update_module, "CHUNK", 32)
    monkeypatch.setattr(update_module, "IN_BACKWARD_CHUNK", 32)


def _batches(kind: str, steps: int):
    rng = np.random.default_rng(3)
    for _ in range(steps):
        if kind == "mlp":
            yield rng.standard_normal((5, 8)).astype(np.float32), rng.integers(0, 4, 5).astype(np.int64)
        else:
            yield rng.integers(0, models.VOCAB, (3, 5)).astype(np.int64), rng.integers(0, 3, 3).astype(np.int64)


def _train(folder, kind: str, in_backward: bool, steps: int = 4):
    state = CheckpointState.load_checkpoint(folder / "checkpoint")
    module = Module(folder / "training_model.onnx", state, folder / "eval_model.onnx")
    optimizer = Optimizer(folder / "optimizer_model.onnx", module, update_in_backward=in_backward)
    optimizer.set_learning_rate(0.05)
    losses = []
    for x, y in _batches(kind, steps):
        losses.append(float(module(x, y)))
        optimizer.step()
        module.lazy_reset_grad()
    return state, module, losses


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("kind, chunks", [("mlp", "small"), ("embeddings", "small"), ("mlp", "default")])
def test_updating_in_the_backward_trains_as_the_usual_loop(tmp_path, monkeypatch, kind, chunks, optimizer):
    if chunks == "small":
        _small_chunks(monkeypatch)
    model = models.mlp() if kind == "mlp" else models.position_classifier("slice")
    generate_artifacts(model, loss=LossType.CrossEntropyLoss, optimizer=OPTIMIZERS[optimizer](),
                       artifact_directory=tmp_path)
    usual, _, usual_losses = _train(tmp_path, kind, in_backward=False)
    state, module, losses = _train(tmp_path, kind, in_backward=True)
    assert module.training_run.updates_in_backward
    np.testing.assert_allclose(losses, usual_losses, rtol=1e-6)
    initial = CheckpointState.load_checkpoint(tmp_path / "checkpoint").parameters
    for name, p in usual.parameters.items():
        assert not np.array_equal(p.data, initial[name].data), name
        np.testing.assert_allclose(state.parameters[name].data, p.data, rtol=1e-5, atol=1e-7, err_msg=name)
    assert state.step == usual.step == 4
    # the gradients are intermediates of the graph: none is an output but an embedding's, scattered into its buffer
    in_backward = module.training_run._in_backward
    gradients = {names.grad_output_name(p): p for p in state.values.names() if state.values.is_trainable(p)}
    kept = sorted(gradients[o.name] for o in in_backward.model.graph.output if o.name in gradients)
    assert kept == sorted(in_backward.scattered) == ([] if kind == "mlp" else ["positions", "tokens"])
    graph = in_backward.model.graph
    assert not any(names.GRADIENTS + "#" in o.name and "finite" not in o.name for o in graph.output)
    onnx.checker.check_model(module.training_run._in_backward.model, full_check=True)
    assert {o.domain for o in module.training_run._in_backward.model.opset_import} <= {"", "ai.onnx"}


def test_a_nan_loss_updates_nothing(tmp_path, monkeypatch):
    _small_chunks(monkeypatch)
    generate_artifacts(models.mlp(), loss=LossType.CrossEntropyLoss, optimizer=blocks.AdamW(),
                       artifact_directory=tmp_path)
    state, module, _ = _train(tmp_path, "mlp", in_backward=True, steps=2)
    optimizer_states = module.training_run.update_graph.states
    before = {n: state.values.value(n).copy() for n in state.values.names()}
    moments = {s: v.current.copy() for s, v in optimizer_states.items()}
    x = np.full((5, 8), np.nan, np.float32)
    with pytest.warns(RuntimeWarning, match="no parameter was updated"):
        module(x, np.zeros(5, np.int64))
    for name, value in before.items():
        np.testing.assert_array_equal(state.values.value(name), value, err_msg=name)
    for s, value in moments.items():
        np.testing.assert_array_equal(optimizer_states[s].current, value, err_msg=s)
    assert state.step == 2


def _sqrt_model() -> onnx.ModelProto:
    """output = x @ W^T + sqrt(s): with s = 0 the loss is finite and s's gradient infinite."""
    rng = np.random.default_rng(0)
    weights = {"W": rng.standard_normal((4, 8)).astype(np.float32), "s": np.zeros(4, np.float32)}
    nodes = [helper.make_node("Gemm", ["input", "W"], ["h"], transB=1), helper.make_node("Sqrt", ["s"], ["r"]),
             helper.make_node("Add", ["h", "r"], ["output"])]
    graph = helper.make_graph(nodes, "sqrt", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["b", 8])],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["b", 4])],
                              initializer=[numpy_helper.from_array(v, k) for k, v in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_chunk_whose_gradient_is_not_finite_keeps_its_values_and_is_named(tmp_path, monkeypatch):
    _small_chunks(monkeypatch)  # W (32 elements) and s (4) in two chunks
    generate_artifacts(_sqrt_model(), loss=LossType.MSELoss, optimizer=blocks.AdamW(), artifact_directory=tmp_path)
    state = CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    module = Module(tmp_path / "training_model.onnx", state)
    optimizer = Optimizer(tmp_path / "optimizer_model.onnx", module, update_in_backward=True)
    w = state.values.value("W").copy()
    loss = module(np.ones((2, 8), np.float32), np.zeros((2, 4), np.float32))
    assert np.isfinite(loss)
    assert not np.array_equal(state.values.value("W"), w)  # updated in the call
    np.testing.assert_array_equal(state.values.value("s"), np.zeros(4, np.float32))
    with pytest.warns(RuntimeWarning, match=r"gradients of \['s'\] are not finite \(those parameters unchanged"):
        optimizer.step()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        optimizer.step()  # reported once


def test_an_optimizer_that_needs_every_gradient_first_is_refused(tmp_path, monkeypatch):
    _small_chunks(monkeypatch)
    generate_artifacts(models.mlp(), loss=LossType.CrossEntropyLoss, optimizer=blocks.AdamW(max_norm=1.0),
                       artifact_directory=tmp_path)
    state = CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    module = Module(tmp_path / "training_model.onnx", state)
    with pytest.raises(ArtifactError, match="update_in_backward=True cannot .* combines every chunk"):
        Optimizer(tmp_path / "optimizer_model.onnx", module, update_in_backward=True)
    Optimizer(tmp_path / "optimizer_model.onnx", module)  # the usual update still works


def test_update_in_backward_needs_onnxruntime(tmp_path):
    generate_artifacts(models.mlp(), loss=LossType.CrossEntropyLoss, optimizer=blocks.AdamW(),
                       artifact_directory=tmp_path)
    state = CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    module = Module(tmp_path / "training_model.onnx", state, device="reference")
    with pytest.raises(ArtifactError, match="runs on onnxruntime"):
        Optimizer(tmp_path / "optimizer_model.onnx", module, update_in_backward=True)


def test_accumulating_loops_are_told_and_gradients_cannot_be_added_to(tmp_path):
    generate_artifacts(models.mlp(), loss=LossType.CrossEntropyLoss, optimizer=blocks.AdamW(),
                       artifact_directory=tmp_path)
    state = CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    module = Module(tmp_path / "training_model.onnx", state)
    Optimizer(tmp_path / "optimizer_model.onnx", module, update_in_backward=True)
    (x, y), = _batches("mlp", 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        module(x, y)
        module.lazy_reset_grad()
        module(x, y)  # a reset in between: no warning
    with pytest.warns(RuntimeWarning, match="without lazy_reset_grad.* nothing is accumulated"):
        module(x, y)
    with pytest.raises(RuntimeError, match="update_in_backward=True.*keeps none to add to"):
        module.add_to_gradients(np.zeros(module.get_parameters_size(), np.float32))


def _deep_mlp(layers: int = 64, width: int = 512) -> onnx.ModelProto:
    """``layers`` Gemm + Relu of width x width (1 MiB of weights each), then a 4-class Gemm."""
    rng = np.random.default_rng(0)
    nodes, weights, x = [], {}, "input"
    for k in range(layers):
        weights[f"w{k}"] = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
        nodes += [helper.make_node("Gemm", [x, f"w{k}"], [f"h{k}"], transB=1),
                  helper.make_node("Relu", [f"h{k}"], [f"a{k}"])]
        x = f"a{k}"
    weights["head"] = (rng.standard_normal((4, width)) / np.sqrt(width)).astype(np.float32)
    nodes.append(helper.make_node("Gemm", [x, "head"], ["output"], transB=1))
    graph = helper.make_graph(nodes, "deep", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["b", width])],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["b", 4])],
                              initializer=[numpy_helper.from_array(v, k) for k, v in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_no_gradient_vector_is_resident(tmp_path):
    """The resident peak (VmHWM) of a fresh process training 64 layers of 1 MiB: most of a gradient vector (64 MiB)
    lower with update_in_backward, whose gradients live a chunk at a time (the usual loop writes them all; 348 vs
    300 MiB measured, the rest being the 4 MiB chunks' temporaries)."""
    import subprocess
    import sys

    generate_artifacts(_deep_mlp(), loss=LossType.CrossEntropyLoss, optimizer=blocks.AdamW(),
                       artifact_directory=tmp_path)
    script = (
        "import sys, numpy as np\nfrom onnxtrain.api import CheckpointState, Module, Optimizer\n"
        "def hwm():\n"
        "    return next(int(l.split()[1]) >> 10 for l in open('/proc/self/status') if l.startswith('VmHWM'))\n"
        "d = sys.argv[1]\nstate = CheckpointState.load_checkpoint(d + '/checkpoint')\n"
        "module = Module(d + '/training_model.onnx', state)\n"
        "opt = Optimizer(d + '/optimizer_model.onnx', module, update_in_backward=sys.argv[2] == '1')\n"
        "rng = np.random.default_rng(0)\n"
        "for _ in range(3):\n"
        "    module(rng.standard_normal((16, 512)).astype(np.float32), rng.integers(0, 4, 16))\n"
        "    opt.step()\n    module.lazy_reset_grad()\n"
        "print(hwm())\n")
    peaks = {flag: int(subprocess.run([sys.executable, "-c", script, str(tmp_path), flag], capture_output=True,
                                      text=True, check=True).stdout.split()[-1]) for flag in ("0", "1")}
    assert peaks["0"] - peaks["1"] >= 32, f"peak {peaks['0']} MiB with the usual loop, {peaks['1']} in the backward"
