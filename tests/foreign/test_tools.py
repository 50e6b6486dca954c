"""Models that went through a tool before training (tests/foreign/data/make_tools.py makes them offline):
simplifiers (onnxsim, onnxslim, onnxoptimizer's fuse passes) on torch exports, other converters (jax2onnx,
Keras 3's own export, paddle2onnx, onnxmltools with LightGBM, onnxconverter_common's float16), and onnx's own
model tools (compose.merge_models with add_prefix, utils.extract_model, version_converter) and onnxruntime's
quantize_dynamic, run here.

Each model that trains: gradients against float64 finite differences (and against the source framework's,
where an initializer holds a variable unchanged), three AdamW steps lower the loss, the eval and exported
models keep the dynamic axes. Each that cannot: a clear error, or a warning naming what the tool took away.
"""

from __future__ import annotations

import logging
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from onnxtrain import blocks
from onnxtrain.api import CheckpointState, Module
from onnxtrain.artifacts import LossType, generate_artifacts
from onnxtrain.artifacts.params import simplifier_names_hint
from tests.foreign.harness import DATA, Trained, finite_difference_errors

TOOLS = DATA / "tools"
LOST_RECORDS = "without the exporter's records"


def _feeds(name: str, batch: int = 3) -> list[np.ndarray]:
    rng = np.random.default_rng(batch)
    if name.startswith("cnn"):
        return [rng.standard_normal((batch, 3, 8, 8)).astype(np.float32)]
    if name.startswith("lstm"):
        return [rng.standard_normal((batch, 5, 4)).astype(np.float32)]
    if name.startswith("bert"):
        return [rng.integers(0, 50, (batch, 6)), np.ones((batch, 6), np.int64)]
    return [np.load(TOOLS / f"{name}.npz")["x"]]


def _target(path, feeds: list[np.ndarray]) -> np.ndarray:
    session = ort.InferenceSession(str(path))
    out = session.run(None, dict(zip([i.name for i in session.get_inputs()], feeds)))[0]
    return np.random.default_rng(7).standard_normal(out.shape).astype(np.float32)


def _input_dims(path) -> dict[str, list]:
    return {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim]
            for i in onnx.load(str(path)).graph.input if i.type.tensor_type.elem_type}


def _check_trains(path, folder, feeds: list[np.ndarray], target: np.ndarray, **kwargs) -> Trained:
    """Generate with AdamW, check finite differences and that three steps lower the loss; returns the run."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # the warnings are checked in tests of their own
        run = Trained(str(path), folder, LossType.MSELoss, blocks.AdamW(), **kwargs)
    run.optimizer.set_learning_rate(0.01)
    assert run.trainable
    errors = finite_difference_errors(run, [*feeds, target], per_parameter=2)
    bad = {k: v for k, v in errors.items() if v > 1.0}
    assert not bad, bad
    losses = run.train(4, *feeds, target)
    assert losses[3] < losses[0], losses
    return run


SIMPLIFIED = ["cnn_eval_onnxsim", "cnn_eval_onnxslim", "cnn_eval_onnxoptimizer", "cnn_dynamo_onnxsim",
              "lstm_dynamo_onnxslim", "bert_train_onnxslim"]


@pytest.mark.parametrize("name", SIMPLIFIED)
def test_simplified_models_train(tmp_path, name):
    path = TOOLS / f"{name}.onnx"
    feeds = _feeds(name)
    run = _check_trains(path, tmp_path, feeds, _target(path, feeds))
    source = _input_dims(path)
    assert any(isinstance(d, str) for dims in source.values() for d in dims), source
    for artifact in (run.paths["eval"], run.export()):
        dims = _input_dims(artifact)
        assert {k: dims[k] for k in source} == source
    other = _feeds(name, batch=2)   # another batch size with the same artifacts
    assert np.isfinite(run.train(1, *other, _target(path, other))[0])


@pytest.mark.parametrize("name", ["jax_mlp", "jax_cnn", "keras_cnn", "paddle_cnn"])
def test_other_converters_match_their_framework(tmp_path, name):
    """jax2onnx (flax.nnx), Keras 3's model.export(format="onnx") (torch backend) and paddle2onnx: loss and
    gradients equal the framework's (jax.grad, torch autograd through Keras, Paddle's) for each initializer that
    holds a variable, reshaped or transposed as the converter stores it."""
    path, ref = TOOLS / f"{name}.onnx", dict(np.load(TOOLS / f"{name}.npz"))
    run = _check_trains(path, tmp_path, [ref["x"]], ref["y"])
    fresh = Trained(str(path), tmp_path / "fresh", LossType.MSELoss, blocks.AdamW())
    loss, grads = fresh.gradients(ref["x"], ref["y"])
    assert abs(loss - float(ref["loss"])) <= 1e-5 * abs(float(ref["loss"])), (loss, float(ref["loss"]))
    held = [k.removeprefix("grad:") for k in ref if k.startswith("grad:")]
    assert len(held) >= 3 and set(held) <= set(run.trainable), (held, run.trainable)
    for init in held:
        want = ref[f"grad:{init}"]
        assert np.linalg.norm(grads[init] - want) <= 1e-4 * np.linalg.norm(want) + 1e-7, init


@pytest.mark.parametrize("name", ["cnn_dynamo_onnxsim", "lstm_dynamo_onnxslim"])
def test_dynamo_export_without_its_records_warns(tmp_path, name):
    with pytest.warns(UserWarning, match=LOST_RECORDS) as record:
        generate_artifacts(str(TOOLS / f"{name}.onnx"), loss=LossType.MSELoss, optimizer=blocks.AdamW(),
                           artifact_directory=tmp_path)
    text = next(str(w.message) for w in record if LOST_RECORDS in str(w.message))
    assert "onnxsim" in text and "optimize=False" in text
    assert ("rewritten by onnxsim" in text) == (name == "cnn_dynamo_onnxsim")


@pytest.mark.parametrize("name", ["cnn_dynamo", "cnn_eval_onnxsim", "keras_cnn"])
def test_no_lost_records_warning_where_none_were_lost(tmp_path, name):
    """The dynamo export as written keeps its records; TorchScript exports (keras's too) never had any."""
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        generate_artifacts(str(TOOLS / f"{name}.onnx"), loss=LossType.MSELoss, optimizer=blocks.AdamW(),
                           artifact_directory=tmp_path)
    assert not [w for w in record if LOST_RECORDS in str(w.message)]


def _float_initializers(path) -> list[str]:
    return [t.name for t in onnx.load(str(path)).graph.initializer if t.data_type == onnx.TensorProto.FLOAT]


@pytest.mark.parametrize(("name", "made"), [("cnn_eval_onnxsim", "_v_"),
                                            ("cnn_eval_onnxslim", "/bn/BatchNormalization_output_0_weight"),
                                            ("cnn_eval_onnxoptimizer", "'2"),
                                            ("bert_train_onnxslim", "Transpose_output_0")])
def test_simplifier_names_are_explained(name, made):
    hint = simplifier_names_hint(_float_initializers(TOOLS / f"{name}.onnx"))
    assert made in hint and "BatchNorm" in hint and "train the model as the exporter wrote it" in hint


def test_exporter_names_get_no_simplifier_hint():
    assert simplifier_names_hint(_float_initializers(TOOLS / "cnn_eval.onnx")) == ""
    assert simplifier_names_hint(["onnx::Conv_12", "val_51", "fc.weight", "dense/kernel:0"]) == ""


def test_torch_name_folded_by_simplifier_error_names_the_tool(tmp_path):
    with pytest.raises(ValueError, match=r"'c1.weight' is not an initializer.*model simplifier.*'_v_"):
        generate_artifacts(str(TOOLS / "cnn_eval_onnxsim.onnx"), requires_grad=["c1.weight", "bn.weight"],
                           loss=LossType.MSELoss, optimizer=blocks.AdamW(), artifact_directory=tmp_path)


def _head() -> onnx.ModelProto:
    """A Linear + Tanh on the CNN's 5 outputs, written with onnx.helper."""
    weight = np.random.default_rng(3).standard_normal((5, 2)).astype(np.float32)
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("MatMul", ["z", "fc.weight"], ["h"]), onnx.helper.make_node("Tanh", ["h"], ["y"])],
        "head", [onnx.helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, ["batch", 5])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", 2])],
        [onnx.numpy_helper.from_array(weight, "fc.weight")])
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)], ir_version=8)


def test_merged_models_train_under_their_prefixes(tmp_path):
    """onnx.compose: two models with the same parameter name (fc.weight) chained after add_prefix."""
    body = onnx.compose.add_prefix(onnx.load(str(TOOLS / "cnn_eval.onnx")), "body/")
    head = onnx.compose.add_prefix(_head(), "head/")
    merged = onnx.compose.merge_models(body, head, io_map=[("body/out", "head/z")])
    path = tmp_path / "merged.onnx"
    onnx.save(merged, path)
    feeds = _feeds("cnn")
    run = _check_trains(path, tmp_path / "art", feeds, _target(path, feeds))
    assert {"body/fc.weight", "head/fc.weight", "body/bn.weight"} <= set(run.trainable)


def test_extracted_sub_model_trains(tmp_path):
    source, path = TOOLS / "cnn_eval.onnx", tmp_path / "features.onnx"
    onnx.utils.extract_model(str(source), str(path), ["x"], ["/ReduceMean_output_0"])
    feeds = _feeds("cnn")
    run = _check_trains(path, tmp_path / "art", feeds, _target(path, feeds))
    assert "c2.weight" in run.trainable and "fc.weight" not in run.trainable


def test_version_converted_model_trains(tmp_path):
    """opset 17 -> 21 (onnx.version_converter); down-conversion stops in the converter itself (no adapter
    from BatchNormalization 15)."""
    path = tmp_path / "op21.onnx"
    onnx.save(onnx.version_converter.convert_version(onnx.load(str(TOOLS / "cnn_eval.onnx")), 21), path)
    feeds = _feeds("cnn")
    _check_trains(path, tmp_path / "art", feeds, _target(path, feeds))


def test_dynamically_quantized_model_warns_and_trains_its_float_parameters(tmp_path, caplog):
    from onnxruntime.quantization import QuantType, quantize_dynamic

    path = tmp_path / "quantized.onnx"
    quantize_dynamic(str(TOOLS / "cnn_eval.onnx"), str(path), weight_type=QuantType.QInt8)
    feeds = _feeds("cnn")
    with caplog.at_level(logging.WARNING, logger="onnxtrain"):
        run = Trained(str(path), tmp_path / "art", LossType.MSELoss, blocks.AdamW())
    assert "DynamicQuantizeLinear" in caplog.text and "quantize it after training" in caplog.text
    assert "c1.weight" not in run.trainable and "fc.weight" not in run.trainable   # integers cannot train
    assert np.isfinite(run.train(1, *feeds, _target(path, feeds))[0])
    with pytest.raises(ValueError, match=r"'c1.weight'.*the integers 'c1.weight_quantized'"):
        generate_artifacts(str(path), requires_grad=["c1.weight"], loss=LossType.MSELoss,
                           optimizer=blocks.AdamW(), artifact_directory=tmp_path / "named")


def test_dynamically_quantized_gemm_weight_is_named_in_the_error(tmp_path):
    from onnxruntime.quantization import QuantType, quantize_dynamic

    path = tmp_path / "quantized.onnx"
    quantize_dynamic(str(TOOLS / "cnn_eval.onnx"), str(path), weight_type=QuantType.QInt8)
    with pytest.raises(ValueError, match=r"'fc.weight'.*the integers 'fc.weight_Transposed_quantized'"):
        generate_artifacts(str(path), requires_grad=["fc.weight"], loss=LossType.MSELoss,
                           optimizer=blocks.AdamW(), artifact_directory=tmp_path / "named")


def test_float16_model_needs_optimizer_none_and_gets_float32_gradients(tmp_path):
    """onnxconverter_common.float16 with keep_io_types=True: float16 weights, float32 inputs and outputs."""
    path = TOOLS / "cnn_eval_float16.onnx"
    with pytest.raises(TypeError, match=r"float32 parameters.*float16.*optimizer=None"):
        generate_artifacts(str(path), loss=LossType.MSELoss, optimizer=blocks.AdamW(),
                           artifact_directory=tmp_path / "adamw")
    feeds = _feeds("cnn")
    target = _target(path, feeds)
    paths = generate_artifacts(str(path), loss=LossType.MSELoss, optimizer=None, artifact_directory=tmp_path / "f16")
    state = CheckpointState.load_checkpoint(paths["checkpoint"])
    module = Module(paths["training"], state, paths["eval"])
    module.train()
    module(*feeds, target)
    wide = Trained(str(TOOLS / "cnn_eval.onnx"), tmp_path / "f32", LossType.MSELoss)
    _, want = wide.gradients(*feeds, target)
    for name, grad in want.items():
        got = state.parameters[name].grad.astype(np.float32)
        assert np.linalg.norm(got - grad) <= 2e-2 * np.linalg.norm(grad) + 1e-3, name


@pytest.mark.parametrize(("name", "op"), [("lightgbm_regressor", "TreeEnsembleRegressor"),
                                          ("lightgbm_classifier", "TreeEnsembleClassifier")])
def test_tree_models_are_refused_naming_the_op(tmp_path, name, op):
    with pytest.raises(ValueError, match=rf"ai\.onnx\.ml::{op}.*no gradient.*tree ensembles"):
        generate_artifacts(str(TOOLS / f"{name}.onnx"), loss=LossType.MSELoss, optimizer=blocks.AdamW(),
                           artifact_directory=tmp_path)
    assert not list(tmp_path.iterdir())   # nothing half-written


def test_weights_stored_quantized_are_named_when_requires_grad_none_trains_the_rest(tmp_path, caplog):
    """quantize_dynamic stores BERT's embedding tables as integers read by DequantizeLinear and a Gather: nothing
    quantizes a trained value there, so no warning said the embeddings had left the trained set."""
    rng = np.random.default_rng(0)
    h = onnx.helper
    nodes = [h.make_node("DequantizeLinear", ["emb_quantized", "emb_scale", "emb_zero"], ["emb"]),
             h.make_node("Gather", ["emb", "ids"], ["e"]), h.make_node("MatMul", ["e", "w"], ["y"])]
    inits = [onnx.numpy_helper.from_array(rng.integers(-127, 127, (10, 4)).astype(np.int8), "emb_quantized"),
             onnx.numpy_helper.from_array(np.array(0.02, np.float32), "emb_scale"),
             onnx.numpy_helper.from_array(np.array(0, np.int8), "emb_zero"),
             onnx.numpy_helper.from_array(rng.normal(size=(4, 3)).astype(np.float32), "w")]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("ids", onnx.TensorProto.INT64, ["n", 5])],
                         [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n", 5, 3])], initializer=inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)
    with caplog.at_level(logging.WARNING, logger="onnxtrain"):
        generate_artifacts(model, loss=LossType.MSELoss, optimizer=blocks.AdamW(), artifact_directory=tmp_path / "a")
    assert "1 weights are stored quantized" in caplog.text and "'emb_quantized'" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="onnxtrain"):
        generate_artifacts(model, requires_grad=["w"], loss=LossType.MSELoss, optimizer=blocks.AdamW(),
                           artifact_directory=tmp_path / "b")
    assert "stored quantized" not in caplog.text   # the user chose what trains
