"""import -> generate -> train -> export --format tflite|circle -> LiteRT, against onnxruntime on the exported ONNX."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from onnxtrain import artifacts, blocks
from onnxtrain.api import CheckpointState, Module, Optimizer
from onnxtrain.tflite import SourceRecord, import_model
from onnxtrain.tflite.export import export_flatbuffer
from onnxtrain.tflite.reader import read_flatbuffer
from tests.cli.conftest import run_cli
from tests.tflite.conftest import example_input, run_litert

pytest.importorskip("tflite")
pytest.importorskip("circle_schema")


def _digits(path):
    from sklearn.datasets import load_digits

    d = load_digits()
    np.savez(path, x=(d.images[:400] / 16).astype(np.float32)[..., None], y=d.target[:400].astype(np.int64))
    return np.load(path)


def _onnx_outputs(path, x):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


def _changed_slots(original: bytes, trained: bytes, record: SourceRecord) -> set[str]:
    """The weights whose bytes differ; fails if any byte outside the weights (and the identifier) differs."""
    a, b = np.frombuffer(original, np.uint8).copy(), np.frombuffer(trained, np.uint8).copy()
    changed = set()
    for name, slot in record.weights.items():
        span = slice(slot.offset, slot.offset + slot.nbytes)
        if not np.array_equal(a[span], b[span]):
            changed.add(name)
        a[span] = b[span] = 0
    a[4:8] = b[4:8] = 0
    assert np.array_equal(a, b), "bytes outside the weight buffers changed"
    return changed


@pytest.mark.parametrize("source,fmt", [("digits_cnn.tflite", "tflite"), ("digits_cnn.circle", "circle"),
                                        ("digits_cnn.tflite", "circle"), ("digits_cnn_fp16.tflite", "tflite")])
def test_cli_round_trip(model_path, tmp_path, source, fmt):
    data = _digits(tmp_path / "digits.npz")
    src = model_path(source)
    out = tmp_path / f"trained.{fmt}"
    steps = [("import", src, "-o", tmp_path / "model.onnx"),
             ("generate", tmp_path / "model.onnx", "-o", tmp_path / "art", "--loss", "ce", "--trainable-ops", "3"),
             ("train", tmp_path / "art", "--data", tmp_path / "digits.npz", "--epochs", "2", "--lr", "0.01",
              "--progress", "none"),
             ("export", tmp_path / "art", "--format", fmt, "-o", out),
             ("export", tmp_path / "art", "-o", tmp_path / "trained.onnx")]
    printed = {}
    for step in steps:
        proc = run_cli(*step, cwd=tmp_path)
        assert proc.returncode == 0, (step, proc.stderr)
        printed[step[-1]] = proc.stdout
    # the shape constants of the Flatten (SHAPE / STRIDED_SLICE / PACK / MEAN axes) are int32: kept as they were
    fp16 = "fp16" in source
    assert f"wrote 12 weight tensors into {out} ({fmt}){' (12 of them rounded to the file' if fp16 else ''}" \
           in printed[out]
    assert "; 5 non-float (integer or quantized) constant tensors left as they were" in printed[out]
    trained = out.read_bytes()
    assert trained[4:8] == {"tflite": b"TFL3", "circle": b"CIR0"}[fmt]
    x = data["x"][:64]
    ref = _onnx_outputs(tmp_path / "trained.onnx", x)
    reimported = import_model(out)  # our reader on the written file (LiteRT cannot read "CIR0")
    # float16 weights: LiteRT runs the rounded weights; so does the import of the written file
    np.testing.assert_allclose(run_litert(trained, x), _onnx_outputs_model(reimported, x), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_onnx_outputs_model(reimported, x), ref, rtol=1e-5 if not fp16 else 1e-2,
                               atol=1e-5 if not fp16 else 1e-2)
    # --trainable-ops 3 counts TFLite operators (onert_train's meaning): the two FULLY_CONNECTED layers train
    record = SourceRecord.from_model(onnx.load(tmp_path / "model.onnx"))
    assert _changed_slots(src.read_bytes(), trained, record) == set(record.trainable_weights(3))
    assert len(record.trainable_weights(3)) == 4


def _onnx_outputs_model(model, x):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {model.graph.input[0].name: x})[0]


@pytest.mark.parametrize("name", ["onert_mnist.tflite", "op_zoo.tflite", "mlp.circle"])
def test_python_round_trip(model_path, tmp_path, name):
    """Through the Python API; ONERT's MNIST model trained as its how-to does (MSE, Adam, batch 10)."""
    src = model_path(name)
    model = import_model(src, tmp_path / "model.onnx")
    artifacts.generate_artifacts(str(tmp_path / "model.onnx"), requires_grad=None, artifact_directory=tmp_path,
                                 loss=artifacts.LossType.MSELoss, optimizer=blocks.Adam())
    state = CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    module = Module(tmp_path / "training_model.onnx", state, tmp_path / "eval_model.onnx")
    optimizer = Optimizer(tmp_path / "optimizer_model.onnx", module)
    rng = np.random.default_rng(0)
    x = example_input(model, 50)
    classes = model.graph.output[0].type.tensor_type.shape.dim[1].dim_value
    y = np.eye(classes, dtype=np.float32)[rng.integers(0, classes, 50)]
    losses = []
    for _ in range(10):
        module.train()
        losses.append(float(module(x[:10], y[:10])))
        optimizer.step()
        module.lazy_reset_grad()
    assert losses[-1] < losses[0]
    CheckpointState.save_checkpoint(state, tmp_path / "trained.ckpt")
    out = tmp_path / f"trained.{src.suffix[1:]}"
    report = export_flatbuffer(tmp_path / "training_model.onnx", tmp_path / "eval_model.onnx",
                               str(tmp_path / "trained.ckpt"), out, source=model)  # the imported model has the file
    record = SourceRecord.from_model(model)
    assert report.format == record.format and report.written == list(record.weights)
    trained = {n for n, p in state.parameters if p.requires_grad}
    assert _changed_slots(src.read_bytes(), out.read_bytes(), record) == trained  # scalar constants stay
    module.export_model_for_inferencing(str(tmp_path / "trained.onnx"))
    xt = example_input(model, 7)
    # Trained weights are off the test models' 1/256 grid, so float32 summation order shows: on ONERT's MNIST
    # model onnxruntime and LiteRT differ by 3e-5, LiteRT's XNNPACK and reference kernels by 1.2e-5.
    np.testing.assert_allclose(run_litert(out.read_bytes(), xt), _onnx_outputs(tmp_path / "trained.onnx", xt),
                               rtol=1e-5, atol=1e-4)
    flat = read_flatbuffer(out.read_bytes())
    assert [op.code for op in flat.operators] == [op.code for op in read_flatbuffer(src.read_bytes()).operators]


def test_python_generated_artifacts_carry_the_source_and_count_tflite_operators(model_path, tmp_path):
    """generate_artifacts (Python) keeps the source record, as the CLI does: the export needs nothing else, and
    trainable_ops counts TFLite operators (onert_train's --num_of_trainable_ops)."""
    onnx_model = import_model(model_path("mlp.tflite"), tmp_path / "model.onnx")
    record = SourceRecord.from_model(onnx_model)
    paths = artifacts.generate_artifacts(str(tmp_path / "model.onnx"), trainable_ops=1,
                                         artifact_directory=tmp_path / "art", loss=artifacts.LossType.MSELoss,
                                         optimizer=blocks.SGD())
    state = CheckpointState.load_checkpoint(paths["checkpoint"])
    assert sorted(n for n, p in state.parameters if p.requires_grad) == sorted(record.trainable_weights(1))
    training = onnx.load(paths["training"])
    assert any(p.key == "onnxtrain.tflite.source" for p in training.metadata_props)
    out = tmp_path / "trained.tflite"
    proc = run_cli("export", tmp_path / "art", "--format", "tflite", "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes() == model_path("mlp.tflite").read_bytes()  # untrained: the same file


def test_trainable_ops_and_requires_grad_together_train_what_both_select(model_path, tmp_path):
    onnx_model = import_model(model_path("mlp.tflite"), tmp_path / "model.onnx")
    last_two = SourceRecord.from_model(onnx_model).trainable_weights(2)
    paths = artifacts.generate_artifacts(str(tmp_path / "model.onnx"), trainable_ops=2, requires_grad=last_two[:1],
                                         artifact_directory=tmp_path / "art", loss=artifacts.LossType.MSELoss,
                                         optimizer=blocks.SGD())
    state = CheckpointState.load_checkpoint(paths["checkpoint"])
    assert len(last_two) > 1 and [n for n, p in state.parameters if p.requires_grad] == last_two[:1]


def test_lora_adapters_are_merged_into_the_flatbuffer(model_path, tmp_path):
    """A flatbuffer has no place for adapters: the export folds them into the weights they adapt."""
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "data.npz", x=rng.normal(size=(64, 64)).astype(np.float32),
             y=rng.random((64, 10)).astype(np.float32))
    src = model_path("mlp.tflite")
    steps = [("import", src, "-o", tmp_path / "model.onnx"),
             ("generate", tmp_path / "model.onnx", "-o", tmp_path / "art", "--loss", "mse", "--lora-rank", "2",
              "--lora-targets", "*fc1_1/MatMul"),
             ("train", tmp_path / "art", "--data", tmp_path / "data.npz", "--epochs", "2", "--lr", "0.05",
              "--progress", "none"),
             ("export", tmp_path / "art", "--format", "tflite", "-o", tmp_path / "trained.tflite"),
             ("export", tmp_path / "art", "--merge-adapters", "-o", tmp_path / "trained.onnx")]
    for step in steps:
        proc = run_cli(*step, cwd=tmp_path)
        assert proc.returncode == 0, (step, proc.stderr)
    record = SourceRecord.from_model(onnx.load(tmp_path / "model.onnx"))
    changed = _changed_slots(src.read_bytes(), (tmp_path / "trained.tflite").read_bytes(), record)
    assert changed == {n for n in record.weights if n.endswith("fc1_1/MatMul")}  # the adapted weight only
    x = rng.normal(size=(5, 64)).astype(np.float32)
    np.testing.assert_allclose(run_litert((tmp_path / "trained.tflite").read_bytes(), x),
                               _onnx_outputs(tmp_path / "trained.onnx", x), rtol=1e-5, atol=1e-5)
