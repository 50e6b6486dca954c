"""Runs of `onnxtrain train` / `generate` against what a run leaves behind: metrics checked before a run starts,
stale runs of earlier artifacts, the log of a resumed epoch."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.cli.conftest import assert_one_line_error


def _cli(capsys, *args) -> subprocess.CompletedProcess:
    """`onnxtrain ARGS` in this process (faster than a subprocess; the same code)."""
    from onnxtrain.cli.main import main

    try:
        code = main([str(a) for a in args])
    except SystemExit as exit:
        code = exit.code
    out = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out.out, out.err)


def _tagger(path, classes: int = 5, sequence: int = 6) -> None:
    """A token tagger: ids [N, sequence] -> scores [N, sequence, classes] (class axis last)."""
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["embedding", "ids"], ["scores"])], "tagger",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["n", sequence])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["n", sequence, classes])],
        initializer=[numpy_helper.from_array(rng.normal(size=(20, classes)).astype(np.float32), "embedding")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)


def _linear(path, inputs: int = 4, outputs: int = 1) -> None:
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1)], "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", inputs])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", outputs])],
        initializer=[numpy_helper.from_array(rng.normal(size=(outputs, inputs)).astype(np.float32), "w"),
                     numpy_helper.from_array(np.zeros(outputs, np.float32), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)


def _regression_data(path, n: int = 64, inputs: int = 4) -> None:
    x = np.random.default_rng(1).normal(size=(n, inputs)).astype(np.float32)
    np.savez(path, x=x, y=x.sum(axis=1, keepdims=True))


def _records(path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def test_class_axis_last_measures_accuracy_on_the_last_axis(tmp_path, capsys):
    """Sequence labelling (--class-axis -1): the default accuracy failed at the first step with a numpy broadcast
    error (it read the classes on axis 1). It now reads them on the last axis, as the loss does, and equals the
    accuracy of the exported model recomputed in numpy; top-5 over 5 classes is refused before the run."""
    import onnxruntime as ort

    _tagger(tmp_path / "tagger.onnx")
    ids = np.random.default_rng(0).integers(0, 20, (40, 6))
    np.savez(tmp_path / "tags.npz", ids=ids, y=ids % 5)
    arts = tmp_path / "a"
    assert _cli(capsys, "generate", tmp_path / "tagger.onnx", "-o", arts, "--loss", "ce", "--class-axis", "-1"
                ).returncode == 0
    proc = _cli(capsys, "train", arts, "--data", tmp_path / "tags.npz", "--epochs", "2", "--progress", "none")
    assert proc.returncode == 0, proc.stderr
    assert [r for r in _records(arts / "run" / "metrics.jsonl") if "train_accuracy" in r]
    proc = _cli(capsys, "eval", arts, "--data", tmp_path / "tags.npz", "--json")
    assert proc.returncode == 0, proc.stderr
    measured = json.loads(proc.stdout)["accuracy"]
    assert _cli(capsys, "export", arts, "-o", tmp_path / "trained.onnx").returncode == 0
    session = ort.InferenceSession(str(tmp_path / "trained.onnx"), providers=["CPUExecutionProvider"])
    scores = session.run(None, {session.get_inputs()[0].name: ids})[0]
    assert scores.shape == (40, 6, 5)
    assert measured == pytest.approx(float(np.mean(scores.argmax(-1) == ids % 5)), abs=1e-6)
    proc = _cli(capsys, "train", arts, "--data", tmp_path / "tags.npz", "--restart", "--metrics", "top5_accuracy")
    assert_one_line_error(proc, "--metrics top5_accuracy does not fit", "with 5 classes every label is among the top 5")
    assert (arts / "run" / "last.ckpt").is_file() and not (arts / "run" / "previous").exists()


@pytest.mark.parametrize("args, fragments", [
    (["--metrics", "accuracy"], ["--metrics accuracy does not fit", "float32 targets"]),
    (["--metrics", "top5_accuracy"], ["--metrics top5_accuracy does not fit"]),
    (["--log", "{tmp}/missing/m.jsonl"], ["--log", "does not exist"]),
    (["--log", "{tmp}"], ["--log", "is a folder"]),
])
def test_a_restart_refused_up_front_keeps_the_previous_run_in_place(tmp_path, capsys, args, fragments):
    _linear(tmp_path / "m.onnx")
    _regression_data(tmp_path / "d.npz")
    arts = tmp_path / "a"
    assert _cli(capsys, "generate", tmp_path / "m.onnx", "-o", arts, "--loss", "mse").returncode == 0
    assert _cli(capsys, "train", arts, "--data", tmp_path / "d.npz", "--epochs", "1", "--progress", "none"
                ).returncode == 0
    args = [a.format(tmp=tmp_path) for a in args]
    assert_one_line_error(_cli(capsys, "train", arts, "--data", tmp_path / "d.npz", "--restart", *args), *fragments)
    assert (arts / "run" / "last.ckpt").is_file() and not (arts / "run" / "previous").exists()


def test_a_metric_that_fits_the_predictions_is_accepted(tmp_path, capsys):
    _linear(tmp_path / "m.onnx")
    _regression_data(tmp_path / "d.npz")
    assert _cli(capsys, "generate", tmp_path / "m.onnx", "-o", tmp_path / "a", "--loss", "mse").returncode == 0
    proc = _cli(capsys, "eval", tmp_path / "a", "--data", tmp_path / "d.npz", "--metrics", "mse,mae", "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    d = np.load(tmp_path / "d.npz")
    w = onnx.numpy_helper.to_array(onnx.load(tmp_path / "m.onnx").graph.initializer[0])
    error = d["x"].astype(np.float64) @ w.T.astype(np.float64) - d["y"]
    assert result["mse"] == pytest.approx(float(np.mean(error ** 2)), rel=1e-5)
    assert result["mae"] == pytest.approx(float(np.mean(np.abs(error))), rel=1e-5)


def test_generating_into_a_folder_with_a_run_sets_that_run_aside(tmp_path, capsys):
    """Artifacts of another model written over a trained folder: eval and export kept picking the old run's
    last.ckpt (an error, or silently the old weights when the shapes agreed) and --resume continued it."""
    _linear(tmp_path / "m4.onnx", inputs=4)
    _linear(tmp_path / "m3.onnx", inputs=3)
    _regression_data(tmp_path / "d4.npz", inputs=4)
    _regression_data(tmp_path / "d3.npz", inputs=3)
    arts = tmp_path / "a"
    assert _cli(capsys, "generate", tmp_path / "m4.onnx", "-o", arts, "--loss", "mse").returncode == 0
    assert _cli(capsys, "train", arts, "--data", tmp_path / "d4.npz", "--epochs", "1", "--progress", "none"
                ).returncode == 0
    assert "1 epoch done" in _cli(capsys, "info", arts).stdout
    proc = _cli(capsys, "generate", tmp_path / "m3.onnx", "-o", arts, "--loss", "mse")
    assert proc.returncode == 0 and "kept in" in proc.stdout
    assert not (arts / "run" / "last.ckpt").exists() and (arts / "run" / "previous" / "last.ckpt").is_file()
    proc = _cli(capsys, "eval", arts, "--data", tmp_path / "d3.npz")
    assert proc.returncode == 0 and str(arts / "checkpoint") in proc.stdout, proc.stderr
    assert_one_line_error(_cli(capsys, "train", arts, "--data", tmp_path / "d3.npz", "--resume"), "nothing to resume")


class _InterruptAt:
    """A Progress whose epoch sends this process SIGINT (Ctrl-C) after ``step`` steps of the first epoch."""

    def __init__(self, step: int):
        self.step, self.steps = step, 0

    def epoch(self, desc, total_batches, total_examples):
        outer = self

        class _Epoch:
            def __enter__(self):
                return self.update

            def update(self, n, loss):
                outer.steps += 1
                if outer.steps == outer.step:
                    os.kill(os.getpid(), signal.SIGINT)

            def __exit__(self, *exc):
                return None

        return _Epoch()


def test_a_resumed_epoch_logs_the_rate_it_started_with(tmp_path, capsys):
    """After a mid-epoch Ctrl-C and --resume, the epoch's record had the learning rate of the step it resumed at
    (with warm-up, 0.0 uninterrupted but 0.0086 resumed); another --seed or other data of the same size resumed
    without a word, into a shuffled order whose remaining batches repeat some examples and skip others."""
    from dataclasses import asdict

    from onnxtrain.cli.common import Artifacts, CliError
    from onnxtrain.cli.train import fit, resolve_options

    _linear(tmp_path / "m.onnx")
    _regression_data(tmp_path / "d.npz", n=64)
    d = np.load(tmp_path / "d.npz")
    data = (d["x"], d["y"])
    opts = resolve_options({"epochs": 2, "batch_size": 8, "lr": 0.01, "scheduler": "cosine", "warmup_steps": 4}, {})
    runs = {}
    for name, progress in (("straight", _InterruptAt(0)), ("interrupted", _InterruptAt(3))):
        assert _cli(capsys, "generate", tmp_path / "m.onnx", "-o", tmp_path / name, "--loss", "mse").returncode == 0
        arts = Artifacts.locate(str(tmp_path / name))
        result = fit(arts, data, None, opts, metrics=[], progress=progress, log=lambda s: None)
        assert result.interrupted == (name == "interrupted")
        if result.interrupted:  # the rest of the epoch is only the unseen examples with the same seed and data
            other_seed = resolve_options({"seed": 1}, asdict(opts))
            with pytest.raises(CliError, match="--seed 1 differs from that run's"):
                fit(arts, data, None, other_seed, metrics=[], resume=True, progress=_InterruptAt(0))
            with pytest.raises(CliError, match="the labels of the data differ"):
                fit(arts, (data[0], data[1][::-1]), None, opts, metrics=[], resume=True, progress=_InterruptAt(0))
            fit(arts, data, None, opts, metrics=[], resume=True, progress=_InterruptAt(0), log=lambda s: None)
        runs[name] = [(r["epoch"], r["step"], r["lr"], r["train_loss"])
                      for r in _records(tmp_path / name / "run" / "metrics.jsonl") if "train_loss" in r]
    assert runs["straight"][0][2] == 0.0  # warm-up starts from 0
    assert runs["interrupted"] == runs["straight"]


def test_examples_whose_every_label_is_ignored_are_left_out(tmp_path, capsys):
    """With --ignore-index, an eval batch of ignored labels only made the loss NaN (a mean over no labels), and a
    training batch of them stopped the run as a diverged loss."""
    _linear(tmp_path / "m.onnx", outputs=3)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 4)).astype(np.float32)
    y = rng.integers(0, 3, 40)
    y[:20] = -1  # a whole first eval batch of 16 is ignored
    np.savez(tmp_path / "d.npz", x=x, y=y)
    np.savez(tmp_path / "none.npz", x=x[:3], y=-np.ones(3, np.int64))
    arts = tmp_path / "a"
    assert _cli(capsys, "generate", tmp_path / "m.onnx", "-o", arts, "--loss", "ce", "--ignore-index", "-1"
                ).returncode == 0
    proc = _cli(capsys, "eval", arts, "--data", tmp_path / "d.npz", "--batch-size", "16", "--json")
    assert proc.returncode == 0, proc.stderr
    assert "20 examples whose every label is the ignore_index -1" in proc.stderr
    result = json.loads(proc.stdout)
    model = onnx.load(tmp_path / "m.onnx")
    w = onnx.numpy_helper.to_array(model.graph.initializer[0]).astype(np.float64)
    z, kept = x[20:].astype(np.float64) @ w.T, y[20:]
    log_softmax = z - z.max(1, keepdims=True)
    log_softmax -= np.log(np.exp(log_softmax).sum(1, keepdims=True))
    assert result["examples"] == 20
    assert result["loss"] == pytest.approx(float(-np.mean(log_softmax[np.arange(20), kept])), rel=1e-5)
    assert result["accuracy"] == pytest.approx(float(np.mean(z.argmax(1) == kept)))
    proc = _cli(capsys, "train", arts, "--data", tmp_path / "d.npz", "--batch-size", "1", "--epochs", "1",
                "--progress", "none")
    assert proc.returncode == 0, proc.stderr
    assert_one_line_error(_cli(capsys, "eval", arts, "--data", tmp_path / "none.npz"),
                          "every label is the loss's ignore_index -1")


def test_artifacts_with_every_parameter_frozen_are_not_trained(tmp_path, capsys):
    """`generate --frozen '*'` then `train` ran every step and saved checkpoints while changing nothing."""
    _linear(tmp_path / "m.onnx")
    _regression_data(tmp_path / "d.npz")
    arts = tmp_path / "a"
    assert _cli(capsys, "generate", tmp_path / "m.onnx", "-o", arts, "--loss", "mse", "--frozen", "*"
                ).returncode == 0
    assert_one_line_error(_cli(capsys, "train", arts, "--data", tmp_path / "d.npz"), "no trainable parameters",
                          "--requires-grad")
    assert not (arts / "run").exists()


def test_patience_stops_a_run_whose_validation_loss_stops_improving(tmp_path, capsys):
    """--patience N ends the run N epochs after its best validation loss (best.ckpt keeps that epoch); without
    it, every epoch runs. Validation targets of the opposite sign get worse as training fits the data."""
    _linear(tmp_path / "m.onnx")
    _regression_data(tmp_path / "train.npz", n=64)
    d = np.load(tmp_path / "train.npz")
    np.savez(tmp_path / "val.npz", x=d["x"], y=-d["y"])
    epochs = {}
    for patience in (0, 2):
        out = tmp_path / f"p{patience}"
        assert _cli(capsys, "generate", tmp_path / "m.onnx", "-o", out, "--loss", "mse").returncode == 0
        done = _cli(capsys, "train", out, "--data", tmp_path / "train.npz", "--val", tmp_path / "val.npz",
                    "--epochs", 8, "--batch-size", 8, "--lr", 0.05, "--patience", patience, "--progress", "none")
        assert done.returncode == 0, done.stderr
        records = _records(out / "run" / "metrics.jsonl")
        losses = [r["val_loss"] for r in records if "val_loss" in r]
        epochs[patience] = len(losses)
        best = int(np.argmin(losses)) + 1
        stops = [r for r in records if r.get("event") == "early_stop"]
        if patience:
            assert stops == [{**stops[0], "epoch": best + patience, "best_epoch": best}]
            assert f"stopped early: no lower validation loss for {patience} epochs" in done.stdout + done.stderr
        else:
            assert not stops
    assert epochs == {0: 8, 2: epochs[2]} and epochs[2] < 8
    bad = _cli(capsys, "train", tmp_path / "p2", "--data", tmp_path / "train.npz", "--patience", -1, "--restart")
    assert_one_line_error(bad, "--patience must be a non-negative integer")
