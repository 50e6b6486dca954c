"""`onnxtrain train --save-every-steps N --keep-last K` and `--resume CKPT`: checkpoints between epochs, and a run
resumed from one that ends exactly as the run that was never stopped."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tests.cli.conftest import assert_one_line_error
from tests.cli.test_runs import _cli, _linear, _records, _regression_data

TRAIN = ["--epochs", "3", "--batch-size", "8", "--lr", "0.01", "--scheduler", "cosine", "--warmup-steps", "4",
         "--val-split", "0.2", "--progress", "none"]  # 52 training examples: 7 steps per epoch, 21 in all


def _state(path):
    """Every tensor (parameters and AdamW moments), the optimizer step and the run's progress of a checkpoint."""
    from onnxtrain.checkpoint.format import load_checkpoint

    data = load_checkpoint(path)
    return data.tensors(), data.step, json.loads(data.properties["onnxtrain.progress"])


def _same_state(a, b) -> None:
    (ta, step_a, pa), (tb, step_b, pb) = _state(a), _state(b)
    assert step_a == step_b and ta.keys() == tb.keys()
    for key in ta:
        np.testing.assert_array_equal(ta[key], tb[key], err_msg=key)
    assert pa["global_step"] == pb["global_step"] and pa["epoch"] == pb["epoch"]


def _epochs(arts) -> list[tuple]:
    return [(r["epoch"], r["step"], r["lr"], r["train_loss"], r["val_loss"])
            for r in _records(arts / "run" / "metrics.jsonl") if "train_loss" in r]


@pytest.fixture
def setup(tmp_path, capsys):
    _linear(tmp_path / "m.onnx")
    _regression_data(tmp_path / "d.npz", n=65)

    def generate(name: str):
        arts = tmp_path / name
        assert _cli(capsys, "generate", tmp_path / "m.onnx", "-o", arts, "--loss", "mse").returncode == 0
        return arts

    straight = generate("straight")
    proc = _cli(capsys, "train", straight, "--data", tmp_path / "d.npz", *TRAIN)
    assert proc.returncode == 0, proc.stderr
    assert not list((straight / "run").glob("step-*.ckpt"))  # none without --save-every-steps
    return tmp_path, generate, straight


def test_step_checkpoints_are_written_kept_and_resumed_exactly(setup, capsys):
    tmp_path, generate, straight = setup
    arts = generate("stepped")
    proc = _cli(capsys, "train", arts, "--data", tmp_path / "d.npz", *TRAIN, "--save-every-steps", "3",
                "--keep-last", "2")
    assert proc.returncode == 0, proc.stderr
    assert "2 step checkpoints up to step-21.ckpt" in proc.stdout
    # saved at steps 3, 6, 9, ..., 21 (21: the last epoch's end); only the two newest are left
    assert sorted(p.name for p in (arts / "run").glob("step-*")) == ["step-18.ckpt", "step-21.ckpt"]
    _same_state(arts / "run" / "step-21.ckpt", straight / "run" / "last.ckpt")
    assert _epochs(arts) == _epochs(straight)
    assert "run (steps): step-18.ckpt, step-21.ckpt" in _cli(capsys, "info", arts).stdout
    progress = _state(arts / "run" / "step-18.ckpt")[2]
    assert (progress["epoch"], progress["batch"], progress["global_step"]) == (2, 4, 18)  # mid-epoch 3

    # back to step 18: parameters, AdamW moments, step count, learning rate and the epoch's sums go on from there
    proc = _cli(capsys, "train", arts, "--data", tmp_path / "d.npz", *TRAIN, "--resume",
                arts / "run" / "step-18.ckpt")
    assert proc.returncode == 0, proc.stderr
    assert "the run's later files are kept in" in proc.stdout
    _same_state(arts / "run" / "last.ckpt", straight / "run" / "last.ckpt")
    assert _epochs(arts) == _epochs(straight)  # the log holds each epoch once
    assert (arts / "run" / "previous" / "last.ckpt").is_file()
    assert [p.name for p in (arts / "run").glob("step-*")] == ["step-18.ckpt"]  # step-21 is of the run set aside
    assert_one_line_error(_cli(capsys, "train", arts, "--data", tmp_path / "d.npz", *TRAIN, "--resume",
                               arts / "run" / "previous" / "step-21.ckpt"), "which resuming empties")
    _same_state(arts / "run" / "best.ckpt", straight / "run" / "best.ckpt")


class _Crash(Exception):
    pass


class _CrashAt:
    """A Progress that raises (as a killed process stops) after ``step`` steps of the run."""

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
                    raise _Crash

            def __exit__(self, *exc):
                return None

        return _Epoch()


def test_after_a_crash_resume_continues_from_the_newest_step_checkpoint(setup, capsys):
    """Without step checkpoints a run killed mid-epoch lost the whole epoch; now last.ckpt follows them."""
    import onnx

    from onnxtrain.cli.common import Artifacts
    from onnxtrain.cli.train import fit, load_for, resolve_options
    from onnxtrain.data import data_spec

    tmp_path, generate, straight = setup
    spec = data_spec(onnx.load(straight / "training_model.onnx"))
    x, y = load_for(str(tmp_path / "d.npz"), spec)
    opts = resolve_options({"epochs": 3, "batch_size": 8, "lr": 0.01}, {})
    runs = {}
    for name, save_every in (("straight", 0), ("crashed", 4)):
        target = generate(f"fit_{name}")
        artifacts = Artifacts.locate(str(target))
        if save_every:
            with pytest.raises(_Crash):
                fit(artifacts, (x, y), None, opts, metrics=[], progress=_CrashAt(14), log=lambda s: None,
                    save_every_steps=save_every)  # 9 steps per epoch: dies in step 14, after step 12 was saved
            assert _state(target / "run" / "last.ckpt")[2]["global_step"] == 12
            assert os.path.samefile(target / "run" / "last.ckpt", target / "run" / "step-12.ckpt")
            fit(artifacts, (x, y), None, opts, metrics=[], resume=True, progress=_CrashAt(0), log=lambda s: None,
                save_every_steps=save_every)
        else:
            fit(artifacts, (x, y), None, opts, metrics=[], progress=_CrashAt(0), log=lambda s: None)
        runs[name] = target
    _same_state(runs["crashed"] / "run" / "last.ckpt", runs["straight"] / "run" / "last.ckpt")


def test_step_checkpoint_options_and_bad_resume_paths_are_one_line_errors(setup, capsys):
    tmp_path, generate, straight = setup
    data = ["--data", tmp_path / "d.npz", "--progress", "none"]
    assert_one_line_error(_cli(capsys, "train", straight, *data, "--restart", "--save-every-steps", "-1"),
                          "--save-every-steps must be a non-negative integer, got -1")
    assert_one_line_error(_cli(capsys, "train", straight, *data, "--restart", "--keep-last", "2"),
                          "--keep-last applies to the step checkpoints of --save-every-steps")
    assert_one_line_error(_cli(capsys, "train", straight, *data, "--resume", tmp_path / "nope.ckpt"),
                          "--resume: checkpoint not found:", "nope.ckpt")
    assert_one_line_error(_cli(capsys, "train", straight, *data, "--resume", straight / "checkpoint", "--epochs",
                               "5"), "has no training progress record", "start a run without --resume")
    other = tmp_path / "l1"  # the same parameters, another loss: it loaded and trained on without a word
    assert _cli(capsys, "generate", tmp_path / "m.onnx", "-o", other, "--loss", "l1").returncode == 0
    assert_one_line_error(_cli(capsys, "train", other, *data, "--epochs", "5", "--resume",
                               straight / "run" / "last.ckpt"), "is a checkpoint of a run of other artifacts")
    (tmp_path / "broken.ckpt").write_bytes(b"\x00" * 10)
    err = assert_one_line_error(_cli(capsys, "train", straight, *data, "--resume", tmp_path / "broken.ckpt"))
    assert "broken.ckpt" in err
    assert (straight / "run" / "last.ckpt").is_file() and not (straight / "run" / "previous").exists()


def test_update_in_backward_ends_as_the_usual_run(setup, capsys):
    """`train --update-in-backward`: the same epochs and the same final checkpoint as the usual optimizer step."""
    tmp_path, generate, straight = setup
    arts = generate("in_backward")
    proc = _cli(capsys, "train", arts, "--data", tmp_path / "d.npz", *TRAIN, "--update-in-backward")
    assert proc.returncode == 0, proc.stderr
    for ours, usual in zip(_epochs(arts), _epochs(straight), strict=True):
        np.testing.assert_allclose(ours, usual, rtol=1e-6)
    (ta, step_a, _), (tb, step_b, _) = _state(arts / "run" / "last.ckpt"), _state(straight / "run" / "last.ckpt")
    assert step_a == step_b == 21 and ta.keys() == tb.keys()
    for key in ta:
        np.testing.assert_allclose(ta[key], tb[key], rtol=1e-5, atol=1e-7, err_msg=key)
