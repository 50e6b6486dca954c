"""`onnxtrain train --resume` goes on with the run's own training options (epochs, batch size, learning rate,
schedule, seed), as given to the `train` command that started it, unless the command line says otherwise."""

from __future__ import annotations

from tests.cli.conftest import assert_one_line_error
from tests.cli.test_runs import _cli, _linear, _records, _regression_data
from tests.cli.test_step_checkpoints import _same_state

TRAIN = ["--epochs", "3", "--batch-size", "8", "--lr", "0.05", "--scheduler", "cosine", "--seed", "3",
         "--progress", "none"]  # 52 examples: 7 steps per epoch, 21 in all


def test_resume_without_the_options_continues_the_run_as_started(tmp_path, capsys):
    """Resumed without repeating the options, a run went on with the defaults: lr 1e-3, no schedule, 5 epochs of
    32 (an error mid-epoch, but silently at an epoch boundary). It now ends exactly as the run never stopped."""
    _linear(tmp_path / "m.onnx")
    _regression_data(tmp_path / "d.npz", n=52)
    runs = {}
    for name in ("straight", "resumed"):
        arts = tmp_path / name
        assert _cli(capsys, "generate", tmp_path / "m.onnx", "-o", arts, "--loss", "mse").returncode == 0
        proc = _cli(capsys, "train", arts, "--data", tmp_path / "d.npz", *TRAIN, "--save-every-steps", "7")
        assert proc.returncode == 0, proc.stderr
        runs[name] = arts
    arts = runs["resumed"]
    proc = _cli(capsys, "train", arts, "--data", tmp_path / "d.npz", "--resume", arts / "run" / "step-7.ckpt",
                "--progress", "none")  # the end of epoch 1
    assert proc.returncode == 0, proc.stderr
    assert "3 epochs of 7 batches of 8; lr 0.05 (cosine)" in proc.stdout
    _same_state(arts / "run" / "last.ckpt", runs["straight"] / "run" / "last.ckpt")
    resumed = [r for r in _records(arts / "run" / "metrics.jsonl") if r.get("event") == "resume"]
    assert resumed[-1]["options"]["lr"] == 0.05 and resumed[-1]["options"]["seed"] == 3

    # the command line still overrides them: a finished run trains further with --epochs
    assert_one_line_error(_cli(capsys, "train", arts, "--data", tmp_path / "d.npz", "--resume"),
                          "already finished 3 epochs")
    proc = _cli(capsys, "train", arts, "--data", tmp_path / "d.npz", "--resume", "--epochs", "4", "--lr", "0.01",
                "--progress", "none")
    assert proc.returncode == 0, proc.stderr
    assert "4 epochs of 7 batches of 8; lr 0.01 (cosine)" in proc.stdout
