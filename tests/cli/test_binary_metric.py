"""A BCE-with-logits loss gets binary_accuracy by default (cross-entropy gets accuracy): in the progress lines,
the epoch and validation lines, and `onnxtrain eval`; per label for multi-label targets."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from tests.cli.test_runs import _cli, _linear, _records


def _multilabel(path, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    w = np.random.default_rng(99).normal(size=(3, 4))
    np.savez(path, x=x, y=(x @ w.T > 0).astype(np.float32))
    return x


def test_bce_reports_binary_accuracy_by_default(tmp_path, capsys):
    _linear(tmp_path / "m.onnx", outputs=3)
    _multilabel(tmp_path / "train.npz", 120, 0)
    x_val = _multilabel(tmp_path / "val.npz", 40, 1)
    arts = tmp_path / "a"
    assert _cli(capsys, "generate", tmp_path / "m.onnx", "-o", arts, "--loss", "bce").returncode == 0
    proc = _cli(capsys, "train", arts, "--data", tmp_path / "train.npz", "--val", tmp_path / "val.npz",
                "--epochs", "2", "--lr", "0.05", "--progress", "none")
    assert proc.returncode == 0, proc.stderr
    assert "metrics: binary_accuracy" in proc.stdout
    epoch_lines = [line for line in proc.stdout.splitlines() if line.startswith("epoch ")]
    assert len(epoch_lines) == 2
    assert all("train loss" in line and line.count("binary_accuracy") == 2 for line in epoch_lines), epoch_lines
    records = [r for r in _records(arts / "run" / "metrics.jsonl") if "train_loss" in r]
    assert all("train_binary_accuracy" in r and "val_binary_accuracy" in r for r in records)

    proc = _cli(capsys, "eval", arts, "--data", tmp_path / "val.npz", "--json")
    assert proc.returncode == 0, proc.stderr
    measured = json.loads(proc.stdout)["binary_accuracy"]
    assert measured == pytest.approx(records[-1]["val_binary_accuracy"], abs=1e-9)
    # per label, from the exported model's logits: logit > 0 against a 0/1 target
    import onnxruntime as ort

    assert _cli(capsys, "export", arts, "-o", tmp_path / "m_trained.onnx").returncode == 0
    session = ort.InferenceSession(str(tmp_path / "m_trained.onnx"), providers=["CPUExecutionProvider"])
    logits = session.run(None, {"x": x_val})[0]
    expected = float(np.mean((logits > 0) == (np.load(tmp_path / "val.npz")["y"] == 1)))
    assert measured == pytest.approx(expected, abs=1e-9)
    assert "binary_accuracy" in _cli(capsys, "eval", arts, "--data", tmp_path / "val.npz").stdout


def test_the_loss_is_recorded_and_regression_has_no_default_metric(tmp_path, capsys):
    from onnxtrain.cli.common import stored_loss

    _linear(tmp_path / "m.onnx", outputs=3)
    _multilabel(tmp_path / "d.npz", 40, 0)
    for loss, name, metric in (("bce", "BCEWithLogitsLoss", "binary_accuracy"), ("mse", "MSELoss", None)):
        arts = tmp_path / loss
        assert _cli(capsys, "generate", tmp_path / "m.onnx", "-o", arts, "--loss", loss).returncode == 0
        assert stored_loss(onnx.load(arts / "training_model.onnx")) == name
        out = json.loads(_cli(capsys, "eval", arts, "--data", tmp_path / "d.npz", "--json").stdout)
        assert (metric in out) if metric else set(out) == {"checkpoint", "data", "examples", "loss"}


def test_plain_progress_lines_show_the_running_metrics(capsys):
    import io

    from onnxtrain.cli.progress import Progress

    stream = io.StringIO()
    progress = Progress("plain", stream)
    with progress.epoch("epoch 1/1", 10, 40) as update:
        progress_epoch = update.__self__
        for _ in range(10):
            progress_epoch.last_print = -1e9  # no 2 s wait
            update(4, 0.5, {"binary_accuracy": 0.75})
    assert "loss 0.5000 binary_accuracy 75.0%" in stream.getvalue()


def test_an_unknown_metric_is_named_with_the_known_ones(tmp_path, capsys):
    """train said `--metrics must be a list of accuracy, ..., got ['acc', 'mse']`, eval named the metric."""
    from tests.cli.conftest import assert_one_line_error

    _linear(tmp_path / "m.onnx", outputs=3)
    _multilabel(tmp_path / "d.npz", 40, 0)
    assert _cli(capsys, "generate", tmp_path / "m.onnx", "-o", tmp_path / "a", "--loss", "bce").returncode == 0
    for command in ("train", "eval"):
        assert_one_line_error(_cli(capsys, command, tmp_path / "a", "--data", tmp_path / "d.npz", "--metrics",
                                   "acc,mse"), "unknown metric 'acc'", "available metrics: accuracy, top5_accuracy")


def test_bce_targets_outside_0_1_are_refused(tmp_path, capsys):
    """Regression targets fed to a bce-with-logits model trained without a word (binary_accuracy 68%)."""
    from tests.cli.conftest import assert_one_line_error

    _linear(tmp_path / "m.onnx", outputs=1)
    x = np.random.default_rng(0).normal(size=(30, 4)).astype(np.float32)
    np.savez(tmp_path / "reg.npz", x=x, y=x.sum(1, keepdims=True))
    np.savez(tmp_path / "ok.npz", x=x, y=(x.sum(1, keepdims=True) > 0).astype(np.int64))
    assert _cli(capsys, "generate", tmp_path / "m.onnx", "-o", tmp_path / "a", "--loss", "bce").returncode == 0
    for command in ("train", "eval"):
        assert_one_line_error(_cli(capsys, command, tmp_path / "a", "--data", tmp_path / "reg.npz"),
                              "--data", "reg.npz", "bce-with-logits loss are probabilities in [0, 1]")
    assert_one_line_error(_cli(capsys, "train", tmp_path / "a", "--data", tmp_path / "ok.npz", "--val",
                               tmp_path / "reg.npz"), "--val", "reg.npz")
    proc = _cli(capsys, "train", tmp_path / "a", "--data", tmp_path / "ok.npz", "--progress", "none")
    assert proc.returncode == 0 and "binary_accuracy" in proc.stdout, proc.stderr  # 0/1 class indices are fine
