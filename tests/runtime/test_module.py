"""Module / Optimizer / CheckpointState behaviour on small models."""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx.reference import ReferenceEvaluator

from onnxtrain.api import CheckpointState, Module, Optimizer
from onnxtrain.artifacts import LossType, OptimType, generate_artifacts
from onnxtrain.errors import ArtifactError, CheckpointError, ExecutionError, InputError, NonFiniteError
from tests import models


@pytest.fixture
def mlp_dir(tmp_path):
    generate_artifacts(models.mlp(), loss=LossType.CrossEntropyLoss, optimizer=OptimType.AdamW,
                       artifact_directory=tmp_path, additional_output_names=["output"])
    return tmp_path


def load(folder, device="cpu", eval_model=True):
    state = CheckpointState.load_checkpoint(folder / "checkpoint")
    module = Module(folder / "training_model.onnx", state, folder / "eval_model.onnx" if eval_model else None,
                    device=device)
    return state, module


def batch(rng, n=5):
    return rng.standard_normal((n, 8)).astype(np.float32), rng.integers(0, 4, n).astype(np.int64)


def test_two_calls_without_reset_accumulate(mlp_dir, rng):
    state, module = load(mlp_dir)
    x, y = batch(rng)
    module(x, y)
    once = {n: p.grad for n, p in state.parameters.items()}
    module(x, y)  # no lazy_reset_grad: gradients add up
    for n, p in state.parameters.items():
        np.testing.assert_allclose(p.grad, 2 * once[n], rtol=1e-6, atol=1e-7)
    module.lazy_reset_grad()
    module(x, y)
    for n, p in state.parameters.items():
        np.testing.assert_allclose(p.grad, once[n], rtol=1e-6, atol=1e-7)
    assert any(np.abs(g).max() > 0 for g in once.values())


def test_returns_loss_and_additional_outputs(mlp_dir, rng):
    _, module = load(mlp_dir)
    x, y = batch(rng)
    loss, logits = module(x, y)
    assert loss.shape == () and logits.shape == (5, 4)
    module.eval()
    eval_loss, eval_logits = module(x, y)
    np.testing.assert_allclose(eval_loss, loss, rtol=1e-6)
    np.testing.assert_allclose(eval_logits, logits, rtol=1e-6)


def test_ortvalue_in_ortvalue_out(mlp_dir, rng):
    _, module = load(mlp_dir)
    x, y = batch(rng)
    loss, _ = module(ort.OrtValue.ortvalue_from_numpy(x), ort.OrtValue.ortvalue_from_numpy(y))
    assert isinstance(loss, ort.OrtValue)
    assert loss.shape() == [] and isinstance(float(loss.numpy()), float)  # a scalar, as with numpy feeds
    np.testing.assert_allclose(loss.numpy(), module(x, y)[0], rtol=1e-6)


def test_one_numpy_input_gives_numpy_outputs_in_a_tuple(mlp_dir, rng):
    """As the peer: OrtValues come back only when no input is a numpy array; several outputs are a tuple."""
    _, module = load(mlp_dir)
    x, y = batch(rng)
    out = module(ort.OrtValue.ortvalue_from_numpy(x), y)
    assert isinstance(out, tuple) and all(isinstance(o, np.ndarray) for o in out)
    assert out[0].shape == ()


@pytest.mark.parametrize("device", ["cuda", "cuda:0", "gpu", "tpu"])
def test_an_unknown_device_fails_when_the_module_is_made(mlp_dir, device):
    # the sessions open at the first step; the device must not wait for it
    with pytest.raises(ValueError, match=f"unknown device '{device}': expected 'cpu'"):
        load(mlp_dir, device=device)


def test_eval_without_eval_model_is_a_clear_error(mlp_dir, rng):
    _, module = load(mlp_dir, eval_model=False)
    module.eval()
    with pytest.raises(RuntimeError, match="no eval model"):
        module(*batch(rng))


@pytest.mark.parametrize("bad, message", [
    (lambda x, y: (x,), r"takes 2 inputs \(input: float32\[batch, 8\], labels: int64\[batch\]\), got 1"),
    (lambda x, y: (x.astype(np.float64), y), r"'input' expects dtype float32, got float64"),
    (lambda x, y: (x[:, :5], y), r"'input' expects shape float32\[batch, 8\], got \[5, 5\]"),
    (lambda x, y: (x[None], y), r"'input' expects rank 2"),
    (lambda x, y: (x, y[:3]), r"'labels' has batch=3 on axis 0, but an earlier input has batch=5"),
])
def test_bad_inputs_name_the_input(mlp_dir, rng, bad, message):
    _, module = load(mlp_dir)
    with pytest.raises(InputError, match=message):
        module(*bad(*batch(rng)))


def test_optimizer_step_changes_trainable_parameters_only(tmp_path, rng):
    generate_artifacts(models.mlp(), requires_grad=["fc2.*"], frozen_params=["fc1.*"],
                       loss=LossType.CrossEntropyLoss, optimizer=OptimType.SGD, artifact_directory=tmp_path)
    state, module = load(tmp_path)
    before = {n: p.data for n, p in state.parameters.items()}
    assert [n for n, p in state.parameters.items() if p.requires_grad] == ["fc2.weight", "fc2.bias"]
    opt = Optimizer(tmp_path / "optimizer_model.onnx", module)
    opt.set_learning_rate(0.1)
    module(*batch(rng))
    grads = {n: state.parameters[n].grad for n in ("fc2.weight", "fc2.bias")}
    opt.step()
    for n, p in state.parameters.items():
        if n.startswith("fc1"):
            np.testing.assert_array_equal(p.data, before[n])
            assert p.grad is None
        else:
            np.testing.assert_allclose(p.data, before[n] - 0.1 * grads[n], rtol=1e-6, atol=1e-7)
    assert state.step == 1 and opt.get_learning_rate() == pytest.approx(0.1)


def test_batchnorm_running_stats_update_in_training_and_drive_eval(tmp_path, rng):
    generate_artifacts(models.conv_bn(), loss=LossType.CrossEntropyLoss, optimizer=OptimType.AdamW,
                       artifact_directory=tmp_path, additional_output_names=["output"])
    state, module = load(tmp_path)
    assert sorted(state.buffers) == ["bn.running_mean", "bn.running_var"]
    with pytest.raises(ValueError, match="buffer 'bn.running_mean' is float32\\[4\\]"):
        state.buffers["bn.running_mean"] = np.zeros(3, np.float32)
    x = (rng.standard_normal((6, 2, 6, 6)) * 2 + 1).astype(np.float32)
    y = rng.integers(0, 3, 6).astype(np.int64)
    module(x, y)
    mean = state.buffers["bn.running_mean"]
    assert np.abs(mean).max() > 1e-3, "running mean was not updated"
    # the update is momentum * old + (1 - momentum) * batch mean of the conv output
    conv = ReferenceEvaluator(onnx.helper.make_model(onnx.helper.make_graph(
        [onnx.helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1])], "c",
        [onnx.helper.make_tensor_value_info("x", 1, None), onnx.helper.make_tensor_value_info("w", 1, None)],
        [onnx.helper.make_tensor_value_info("c", 1, None)]), opset_imports=[onnx.helper.make_opsetid("", 17)]))
    c = conv.run(None, {"x": x, "w": state.parameters["conv.weight"].data})[0]
    np.testing.assert_allclose(mean, 0.1 * c.mean(axis=(0, 2, 3)), rtol=1e-4, atol=1e-6)
    # the variance as torch updates it: with the unbiased batch variance (ddof=1), not ONNX's biased one
    var = state.buffers["bn.running_var"]
    np.testing.assert_allclose(var, 0.9 + 0.1 * c.var(axis=(0, 2, 3), ddof=1), rtol=1e-5)
    assert np.abs(var - (0.9 + 0.1 * c.var(axis=(0, 2, 3)))).max() > 1e-4
    # eval mode uses the running statistics: changing them changes the eval output
    module.eval()
    _, out1 = module(x, y)
    state.buffers["bn.running_mean"] = mean + 1.0
    _, out2 = module(x, y)
    assert np.abs(out1 - out2).max() > 1e-3


def test_export_for_inference_matches_eval(tmp_path, rng):
    generate_artifacts(models.conv_bn(dropout=True), loss=LossType.CrossEntropyLoss, optimizer=OptimType.AdamW,
                       artifact_directory=tmp_path, additional_output_names=["output"])
    state, module = load(tmp_path)
    opt = Optimizer(tmp_path / "optimizer_model.onnx", module)
    x = rng.standard_normal((4, 2, 6, 6)).astype(np.float32)
    y = rng.integers(0, 3, 4).astype(np.int64)
    for _ in range(3):
        module(x, y)
        opt.step()
        module.lazy_reset_grad()
    module.eval()
    _, expected = module(x, y)
    module.export_model_for_inferencing(tmp_path / "inference.onnx", ["output"])
    exported = onnx.load(tmp_path / "inference.onnx")
    onnx.checker.check_model(exported, full_check=True)
    assert [i.name for i in exported.graph.input] == ["input"]
    assert [o.name for o in exported.graph.output] == ["output"]
    assert {n.op_type for n in exported.graph.node}.isdisjoint({"SoftmaxCrossEntropyLoss"})
    assert all(not any(a.name == "training_mode" and a.i for a in n.attribute) for n in exported.graph.node)
    assert {i.name for i in exported.graph.initializer} >= {"conv.weight", "fc.weight", "bn.running_mean"}
    session = ort.InferenceSession(str(tmp_path / "inference.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, {"input": x})[0], expected, rtol=1e-5, atol=1e-6)


def test_reference_backend_agrees_with_onnxruntime(mlp_dir, rng):
    x, y = batch(rng)
    results = []
    for device in ("cpu", "reference"):
        state, module = load(mlp_dir, device=device)
        opt = Optimizer(mlp_dir / "optimizer_model.onnx", module)
        losses = []
        for _ in range(5):
            losses.append(float(module(x, y)[0]))
            opt.step()
            module.lazy_reset_grad()
        results.append((losses, state.parameters["fc1.weight"].data))
    np.testing.assert_allclose(results[0][0], results[1][0], rtol=1e-5)
    np.testing.assert_allclose(results[0][1], results[1][1], rtol=1e-4, atol=1e-6)


def test_nonfinite_loss_skips_the_update(mlp_dir, rng):
    state, module = load(mlp_dir)
    opt = Optimizer(mlp_dir / "optimizer_model.onnx", module)
    x, y = batch(rng)
    x[0, 0] = np.nan
    before = state.parameters["fc1.weight"].data
    with pytest.warns(RuntimeWarning, match="not finite"):
        module(x, y)
    with pytest.warns(RuntimeWarning, match="skipped"):
        opt.step()
    np.testing.assert_array_equal(state.parameters["fc1.weight"].data, before)
    assert opt.skipped_steps == 1 and state.step == 0
    module.lazy_reset_grad()
    module(*batch(rng))  # a good batch afterwards trains normally
    opt.step()
    assert np.isfinite(state.parameters["fc1.weight"].data).all() and state.step == 1


def test_nonfinite_loss_can_raise(mlp_dir, rng):
    state = CheckpointState.load_checkpoint(mlp_dir / "checkpoint")
    module = Module(mlp_dir / "training_model.onnx", state, on_nonfinite="raise")
    x, y = batch(rng)
    x[:] = np.inf
    with pytest.raises(NonFiniteError, match="not finite"):
        module(x, y)


def test_contiguous_parameters_round_trip(mlp_dir):
    state, module = load(mlp_dir)
    flat = module.get_contiguous_parameters(trainable_only=True).numpy()
    assert flat.size == module.get_parameters_size() == 8 * 16 + 16 + 16 * 4 + 4
    module.copy_buffer_to_parameters(ort.OrtValue.ortvalue_from_numpy(np.arange(flat.size, dtype=np.float32)))
    np.testing.assert_array_equal(state.parameters["fc1.weight"].data.ravel(), np.arange(128, dtype=np.float32))
    with pytest.raises(ValueError, match="flat buffer of 212 elements"):
        module.copy_buffer_to_parameters(np.zeros(3, np.float32))


def test_parameters_and_properties(mlp_dir):
    state, _ = load(mlp_dir)
    p = state.parameters["fc1.weight"]
    assert repr(p) == "Parameter(name='fc1.weight', shape=(16, 8), dtype=float32, requires_grad=True)"
    state.parameters["fc1.bias"] = np.ones(16, np.float32)
    np.testing.assert_array_equal(state.parameters["fc1.bias"].data, np.ones(16))
    with pytest.raises(ValueError, match="shape"):
        state.parameters["fc1.bias"] = np.ones(3, np.float32)
    with pytest.raises(KeyError, match="no parameter named 'nope'"):
        state.parameters["nope"]
    state.properties["epoch"] = 3
    state.properties["name"] = "user-1"
    state.properties["lr"] = 0.5
    with pytest.raises(TypeError):
        state.properties["bad"] = [1]
    assert dict(state.properties) == {"epoch": 3, "name": "user-1", "lr": 0.5}


def test_properties_take_numpy_scalars_and_bools_as_the_peer_does(mlp_dir, tmp_path):
    """Metric-logging scripts store numpy scalars (``(pred == y).sum()``) and flags; they load back as Python
    numbers (a bool as 1 or 0, as the peer stores it). An int beyond int64 is refused when set, not at saving."""
    state, _ = load(mlp_dir)
    pred = np.array([1, 2, 3])
    state.properties["correct"] = (pred == np.array([1, 2, 0])).sum()
    state.properties["accuracy"] = np.float32(0.75)
    state.properties["done"] = True
    state.properties["tag"] = np.str_("run-7")
    with pytest.raises(ValueError, match="'seed' = 18446744073709551615 does not fit in int64"):
        state.properties["seed"] = 2**64 - 1
    with pytest.raises(TypeError, match="'vec' must be an int, float or str"):
        state.properties["vec"] = np.arange(3)
    CheckpointState.save_checkpoint(state, tmp_path / "c")
    back = dict(CheckpointState.load_checkpoint(tmp_path / "c").properties)
    assert back == {"correct": 2, "accuracy": 0.75, "done": 1, "tag": "run-7"}
    assert [type(v) for v in back.values()] == [int, float, int, str]


def test_parameter_data_and_grad_are_read_only_copies(mlp_dir, rng):
    """Editing ``.data`` in place would change nothing (it is a copy), so it raises instead of being lost;
    assigning ``.data`` is how a value is written."""
    state, module = load(mlp_dir)
    module(*batch(rng))
    p = state.parameters["fc2.bias"]
    with pytest.raises(ValueError, match="read-only"):
        p.data[:] = 0
    with pytest.raises(ValueError, match="read-only"):
        p.grad[:] = 0
    p.data = np.zeros(4, np.float32)
    np.testing.assert_array_equal(state.parameters["fc2.bias"].data, np.zeros(4))


def test_a_frozen_scalar_parameter_keeps_its_shape(tmp_path, rng):
    """A 0-d frozen parameter (a fixed temperature) stays 0-d in the runtime; it used to become [1] and the Module
    refused its own checkpoint."""
    model = models.mlp()
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.array(2.0, np.float32), "temperature"))
    out = model.graph.output[0].name
    model.graph.node[-1].output[0] = "logits"
    model.graph.node.append(onnx.helper.make_node("Mul", ["logits", "temperature"], [out]))
    generate_artifacts(model, requires_grad=["fc2.weight"], frozen_params=["temperature"],
                       loss=LossType.CrossEntropyLoss, optimizer=OptimType.SGD, artifact_directory=tmp_path)
    state, module = load(tmp_path)
    assert state.parameters["temperature"].data.shape == ()
    assert np.isfinite(module(*batch(rng)))


@pytest.mark.parametrize("device", ["cpu", "reference"])
def test_a_failure_inside_the_engine_is_a_clear_error_and_loses_nothing(tmp_path, rng, device, capfd):
    """Labels past the number of classes pass every check before the run when the graphs do not declare the
    class count (artifacts of an older onnxtrain: their declarations are removed here) and fail inside the engine:
    the error names the step, and the state is as before, so training goes on with good data. onnxruntime does
    not print the failure itself as well (its log line would repeat the error's message)."""
    generate_artifacts(models.mlp(), loss=LossType.CrossEntropyLoss, optimizer=OptimType.AdamW,
                       artifact_directory=tmp_path)
    for name in ("training_model.onnx", "eval_model.onnx"):
        model = onnx.load(tmp_path / name)
        assert len(model.graph.value_info) == 1  # the scores the loss reads: 4 classes
        del model.graph.value_info[:]
        onnx.save(model, tmp_path / name)
    state, module = load(tmp_path, device=device)
    optimizer = Optimizer(tmp_path / "optimizer_model.onnx", module)
    x, y = batch(rng)
    module(x, y)
    optimizer.step()
    module.lazy_reset_grad()
    before = {n: p.data for n, p in state.parameters.items()}
    bad = np.full_like(y, 7)  # the model has 4 classes
    with pytest.raises(ExecutionError, match="the training step failed.*class labels"):
        module(x, bad)
    module.eval()
    with pytest.raises(ExecutionError, match="the eval step failed"):
        module(x, bad)
    assert "onnxruntime" not in capfd.readouterr().err
    module.train()
    for name, value in before.items():
        np.testing.assert_array_equal(state.parameters[name].data, value)
    loss = module(x, y)
    optimizer.step()
    assert np.isfinite(loss) and state.step == 2


def test_export_keeps_the_outputs_the_loss_does_not_read(tmp_path, rng):
    """A model returning logits and their softmax, trained on the logits: the inference model exports both."""
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["logits"]),
         helper.make_node("Softmax", ["logits"], ["probs"], axis=-1)],
        "two_outputs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", 4]) for n in ("logits", "probs")],
        [numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "w"),
         numpy_helper.from_array(np.zeros(4, np.float32), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    generate_artifacts(model, requires_grad=["w", "b"], loss=LossType.CrossEntropyLoss, optimizer=OptimType.AdamW,
                       artifact_directory=tmp_path)
    state, module = load(tmp_path)
    optimizer = Optimizer(tmp_path / "optimizer_model.onnx", module)
    x, y = batch(rng)
    for _ in range(3):
        module(x, y)
        optimizer.step()
        module.lazy_reset_grad()
    module.export_model_for_inferencing(tmp_path / "both.onnx")  # default: the model's outputs
    module.export_model_for_inferencing(tmp_path / "probs.onnx", ["probs"])
    w, b = state.parameters["w"].data, state.parameters["b"].data
    logits = x @ w + b
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    both = ort.InferenceSession(str(tmp_path / "both.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(both[0], logits, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(both[1], probs, rtol=1e-5, atol=1e-6)
    only = ort.InferenceSession(str(tmp_path / "probs.onnx"), providers=["CPUExecutionProvider"])
    assert [o.name for o in only.get_outputs()] == ["probs"]
    np.testing.assert_allclose(only.run(None, {"x": x})[0], probs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("label, position, message", [
    # onnxruntime reads -1 as the last class without an error
    (-1, 3, r"class label -1 at index \[3\]; SoftmaxCrossEntropyLoss labels must be class indices, 0 to 3; the "
            r"loss has no ignore_index"),
    # generate_artifacts declares the class count of the scores the loss reads (4 here)
    (4, 2, r"class label 4 at index \[2\]; SoftmaxCrossEntropyLoss labels must be class indices, 0 to 3$"),
])
def test_a_label_outside_the_classes_is_refused_before_the_run(mlp_dir, rng, label, position, message):
    _, module = load(mlp_dir)
    x, y = batch(rng)
    y[position] = label
    with pytest.raises(InputError, match=r"training step: input 'labels' holds the " + message):
        module(x, y)
    module.eval()
    with pytest.raises(InputError, match=r"eval step: input 'labels' holds the " + message):
        module(x, y)


@pytest.mark.parametrize("outputs", [None, ["output"]])  # the scores also a graph output: declared there
def test_labels_equal_to_ignore_index_pass_and_others_are_named(tmp_path, rng, outputs):
    from onnxtrain import blocks

    generate_artifacts(models.mlp(), loss=blocks.CrossEntropyLoss(ignore_index=-100), optimizer=OptimType.AdamW,
                       artifact_directory=tmp_path, additional_output_names=outputs)
    _, module = load(tmp_path)
    x, y = batch(rng)
    y[1] = -100
    assert np.isfinite(module(x, y)[0] if outputs else module(x, y))
    y[2] = -7
    with pytest.raises(InputError, match=r"class label -7 at index \[2\].*or equal ignore_index=-100"):
        module(x, y)
    y[2] = 4  # the class count is declared through the pass that reads the scores' shape in the forward
    with pytest.raises(InputError, match=r"class label 4 at index \[2\].*class indices, 0 to 3 or equal "
                                         r"ignore_index=-100"):
        module(x, y)


def test_labels_read_through_a_reshape_with_a_declared_class_count(tmp_path):
    """Labels reshaped before the loss are traced back to the input; a declared class count bounds them."""
    from onnxtrain.runtime.backends.base import TensorMeta
    from onnxtrain.runtime.inputs import ClassLabels, check_inputs, class_label_inputs

    generate_artifacts(models.mlp(), loss=LossType.CrossEntropyLoss, optimizer=OptimType.AdamW,
                       artifact_directory=tmp_path)
    model = onnx.load(tmp_path / "training_model.onnx")
    del model.graph.value_info[:]  # as an older onnxtrain wrote it: the class count is not declared
    loss = next(n for n in model.graph.node if n.op_type == "SoftmaxCrossEntropyLoss")
    model.graph.node.insert(0, onnx.helper.make_node("Reshape", [loss.input[1], "flat_shape"], ["flat_labels"]))
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.array([-1], np.int64), "flat_shape"))
    loss.input[1] = "flat_labels"
    assert class_label_inputs(model) == {"labels": ClassLabels("SoftmaxCrossEntropyLoss", loss.input[0], None, None)}
    model.graph.value_info.append(onnx.helper.make_tensor_value_info(loss.input[0], onnx.TensorProto.FLOAT, ["N", 4]))
    labels = class_label_inputs(model)
    assert labels == {"labels": ClassLabels("SoftmaxCrossEntropyLoss", loss.input[0], 4, None)}
    meta = [TensorMeta("labels", np.dtype(np.int64), ("N",))]
    check_inputs(meta, [np.array([0, 3, 1])], "training step", labels)
    with pytest.raises(InputError, match=r"class label 4 at index \[1\]; .* class indices, 0 to 3"):
        check_inputs(meta, [np.array([0, 4, 1])], "training step", labels)


def test_a_checkpoint_of_another_model_with_the_same_names_is_refused_on_loading(mlp_dir, tmp_path):
    """Same parameter names, another class count: the Module names the parameter and both shapes, instead of
    onnxruntime failing at the first step."""
    other = tmp_path / "six_classes"
    generate_artifacts(models.mlp(classes=6), loss=LossType.CrossEntropyLoss, optimizer=OptimType.AdamW,
                       artifact_directory=other)
    state = CheckpointState.load_checkpoint(other / "checkpoint")
    with pytest.raises(CheckpointError, match=r"'fc2.weight' has shape \(6, 16\) in the checkpoint, \(4, 16\) in "
                                              r"the training model"):
        Module(mlp_dir / "training_model.onnx", state, mlp_dir / "eval_model.onnx")
    with pytest.raises(CheckpointError, match=r"'fc2.weight' has shape \(6, 16\) in the checkpoint, \(4, 16\) in "
                                              r"the eval model"):
        Module(other / "training_model.onnx", state, mlp_dir / "eval_model.onnx")


def test_the_eval_model_given_as_the_training_model_is_named(mlp_dir):
    state = CheckpointState.load_checkpoint(mlp_dir / "checkpoint")
    with pytest.raises(ArtifactError, match="no gradient output for .*'fc1.weight'.*is it the eval model"):
        Module(mlp_dir / "eval_model.onnx", state)


@pytest.mark.parametrize("bad, error, message", [
    (float("nan"), ValueError, "must be finite in float32 .*, got nan"),
    (float("inf"), ValueError, "must be finite in float32 .*, got inf"),
    (1e300, ValueError, r"must be finite in float32 \(at most 3.403e\+38\), got 1e\+300"),
    (-0.1, ValueError, "must not be negative, got -0.1"),
    ("0.1", TypeError, "must be a number, got str '0.1'"),
    (None, TypeError, "must be a number, got NoneType"),
])
def test_a_learning_rate_that_would_corrupt_the_parameters_is_refused(mlp_dir, rng, bad, error, message):
    """A NaN learning rate with finite gradients would make every trained parameter NaN at the next step."""
    state, module = load(mlp_dir)
    optimizer = Optimizer(mlp_dir / "optimizer_model.onnx", module)
    optimizer.set_learning_rate(np.float32(0.01))
    with pytest.raises(error, match=message):
        optimizer.set_learning_rate(bad)
    assert optimizer.get_learning_rate() == pytest.approx(0.01)
    module(*batch(rng))
    optimizer.step()
    assert all(np.isfinite(p.data).all() for p in state.parameters.values())


def test_running_variance_follows_torch_at_small_dynamic_batches(tmp_path, rng):
    """A BatchNorm1d with a dynamic batch: torch updates the running variance with the unbiased variance of the
    batch (4 examples: 4/3 of ONNX's biased one), at every batch size the artifacts run."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4, momentum=0.5), torch.nn.Linear(4, 2))
    path = tmp_path / "bn.onnx"
    torch.onnx.export(net.train(), (torch.randn(4, 3),), path, dynamo=False, input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}}, do_constant_folding=False,
                      training=torch.onnx.TrainingMode.TRAINING)
    generate_artifacts(str(path), loss=LossType.MSELoss, optimizer=OptimType.SGD, artifact_directory=tmp_path / "a")
    state, module = load(tmp_path / "a")
    with torch.no_grad():
        for name, p in net.named_parameters():
            p.copy_(torch.from_numpy(state.parameters[name].data))
        for name, b in net.named_buffers():
            if name in dict(state.buffers):
                b.copy_(torch.from_numpy(state.buffers[name]))
    for batch in (4, 2, 7):
        x = rng.standard_normal((batch, 3)).astype(np.float32)
        module(x, np.zeros((batch, 2), np.float32))
        with torch.no_grad():
            net(torch.from_numpy(x))
        np.testing.assert_allclose(state.buffers["1.running_var"], net[1].running_var.numpy(), rtol=1e-5)
        np.testing.assert_allclose(state.buffers["1.running_mean"], net[1].running_mean.numpy(), rtol=1e-5,
                                   atol=1e-7)


def test_an_eval_model_of_other_artifacts_is_refused_when_the_module_is_made(mlp_dir, tmp_path):
    """It used to be accepted: eval calls then failed inside onnxruntime ("Missing Input: conv.weight") and
    export_model_for_inferencing wrote a model onnxruntime could not open."""
    other = tmp_path / "cnn"
    generate_artifacts(models.conv_bn(), loss=LossType.CrossEntropyLoss, optimizer=OptimType.AdamW,
                       artifact_directory=other)
    state = CheckpointState.load_checkpoint(mlp_dir / "checkpoint")
    with pytest.raises(ArtifactError, match=r"the eval model does not belong to the training model's artifacts: "
                                            r"it reads \['conv.weight'"):
        Module(mlp_dir / "training_model.onnx", state, other / "eval_model.onnx")


def test_an_eval_model_of_another_loss_over_the_same_parameters_is_refused(mlp_dir, tmp_path):
    """Its inputs and parameters are the training model's, but it computes another loss."""
    from onnxtrain import blocks

    other = tmp_path / "other"
    generate_artifacts(models.mlp(), loss=blocks.CrossEntropyLoss(reduction="sum"), optimizer=OptimType.AdamW,
                       artifact_directory=other, additional_output_names=["output"])
    state = CheckpointState.load_checkpoint(mlp_dir / "checkpoint")
    with pytest.raises(ArtifactError, match=r"does not belong .*metadata differs from the training model's in "
                                            r"\[.*'loss_reduction'\]"):
        Module(mlp_dir / "training_model.onnx", state, other / "eval_model.onnx")


def test_an_empty_batch_and_a_single_output_name_are_handled(mlp_dir, tmp_path):
    state, module = load(mlp_dir)
    with pytest.raises(InputError, match=r"input 'input' holds no examples \(shape \[0, 8\]\)"):
        module(np.zeros((0, 8), np.float32), np.zeros(0, np.int64))
    module.export_model_for_inferencing(tmp_path / "one.onnx", "output")   # a name, not its letters
    assert [o.name for o in onnx.load(tmp_path / "one.onnx").graph.output] == ["output"]


def test_a_skipped_step_leaves_the_running_statistics_as_they_were(tmp_path, rng):
    """A batch whose loss is NaN skips the optimizer step; its BatchNorm statistics used to replace the running
    ones all the same (NaN from then on, in every eval), and onnxruntime's kernel wrote them into the checkpoint's
    buffers as it ran."""
    generate_artifacts(models.conv_bn(), loss=LossType.CrossEntropyLoss, optimizer=OptimType.AdamW,
                       artifact_directory=tmp_path)
    state, module = load(tmp_path)
    optimizer = Optimizer(tmp_path / "optimizer_model.onnx", module)
    x, y = rng.standard_normal((6, 2, 6, 6)).astype(np.float32), rng.integers(0, 3, 6).astype(np.int64)
    module(x, y)
    optimizer.step()
    module.lazy_reset_grad()
    before = {name: state.buffers[name].copy() for name in state.buffers}
    bad = x * 3
    bad[0, 0, 0, 0] = np.nan
    with pytest.warns(RuntimeWarning, match="not finite"):
        assert np.isnan(module(bad, y))
    for name in state.buffers:
        np.testing.assert_array_equal(state.buffers[name], before[name], err_msg=name)
    module(x, y)   # the next finite batch updates them again
    assert not np.array_equal(state.buffers["bn.running_mean"], before["bn.running_mean"])


def test_an_export_over_the_protobuf_limit_writes_its_weights_beside_it_once(mlp_dir, tmp_path, monkeypatch, rng):
    """Over 2 GB the weights go to PATH.data, written from the arrays (no TensorProto copies); exporting again
    replaces the file instead of appending a second copy to it (onnx.save_model appends)."""
    import onnxruntime as ort

    from onnxtrain.runtime import export

    state, module = load(mlp_dir)
    module.export_model_for_inferencing(tmp_path / "small.onnx", ["output"])
    monkeypatch.setattr(export, "PROTO_LIMIT", (64 << 20) + 100)   # this MLP's weights are "over" it
    big = tmp_path / "big.onnx"
    for _ in range(2):
        module.export_model_for_inferencing(big, ["output"])
    weights = sum(p.data.nbytes for _, p in state.parameters.items() if p.data.size >= 64)  # the rest stay inline
    assert os.path.getsize(str(big) + ".data") == weights
    onnx.checker.check_model(str(big), full_check=True)
    x = rng.standard_normal((3, 8)).astype(np.float32)
    run = lambda p: ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]  # noqa: E731
    np.testing.assert_array_equal(run(big), run(tmp_path / "small.onnx"))
    with pytest.raises(FileNotFoundError, match="the folder .*missing does not exist"):
        module.export_model_for_inferencing(tmp_path / "missing" / "m.onnx", ["output"])
