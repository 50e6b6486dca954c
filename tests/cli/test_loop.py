"""onnxtrain.runtime.loop: batching, metrics, train_epoch / evaluate on the demo CNN."""

from __future__ import annotations

import numpy as np
import pytest

from onnxtrain.api import CheckpointState, Module, Optimizer
from onnxtrain.artifacts import LossType, OptimType, generate_artifacts
from onnxtrain.demo.model import build_cnn
from onnxtrain.errors import InputError, NonFiniteError
from onnxtrain.runtime import loop


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    folder = tmp_path_factory.mktemp("loop")
    generate_artifacts(build_cnn(0), loss=LossType.CrossEntropyLoss, optimizer=OptimType.AdamW,
                       artifact_directory=folder, additional_output_names=["logits"])
    return folder


def _module(folder):
    state = CheckpointState.load_checkpoint(folder / "checkpoint")
    module = Module(folder / "training_model.onnx", state, folder / "eval_model.onnx")
    optimizer = Optimizer(folder / "optimizer_model.onnx", module)
    optimizer.set_learning_rate(3e-3)
    return module, optimizer


def _digits(n=200):
    from sklearn.datasets import load_digits

    d = load_digits()
    return (d.images[:n] / 16).astype(np.float32)[:, None], d.target[:n].astype(np.int64)


def test_batches_cover_every_example_and_resume_exactly():
    x, y = np.arange(10)[:, None], np.arange(10)
    full = list(loop.batches(x, y, 3, shuffle=True, seed=1, epoch=2))
    assert [len(b[1]) for b in full] == [3, 3, 3, 1]
    assert sorted(np.concatenate([b[1] for b in full])) == list(range(10))
    resumed = list(loop.batches(x, y, 3, shuffle=True, seed=1, epoch=2, skip=2))
    assert all(np.array_equal(a[1], b[1]) for a, b in zip(full[2:], resumed))
    other_epoch = np.concatenate([b[1] for b in loop.batches(x, y, 3, shuffle=True, seed=1, epoch=3)])
    assert not np.array_equal(other_epoch, np.concatenate([b[1] for b in full]))
    assert [len(b[1]) for b in loop.batches(x, y, 3, drop_last=True)] == [3, 3, 3]
    assert loop.num_batches(10, 3) == 4 and loop.num_batches(10, 3, drop_last=True) == 3
    with pytest.raises(ValueError):
        list(loop.batches(x, y[:5], 3))


@pytest.mark.parametrize("name, pred, y, expected", [
    ("accuracy", [[0.1, 0.9], [0.8, 0.2], [0.3, 0.7]], [1, 1, 1], 2 / 3),
    ("top5_accuracy", [[0.0, 1, 2, 3, 4, 5]], [0], 0.0),
    ("top5_accuracy", [[0.0, 1, 2, 3, 4, 5]], [1], 1.0),
    ("binary_accuracy", [[2.0], [-1.0]], [[1.0], [1.0]], 0.5),
    ("mse", [[1.0], [3.0]], [[0.0], [1.0]], 2.5),
    ("mae", [[1.0], [3.0]], [[0.0], [1.0]], 1.5),
])
def test_metrics(name, pred, y, expected):
    total, count = loop.METRICS[name](np.asarray(pred), np.asarray(y))
    assert total / count == pytest.approx(expected)


def test_top5_needs_more_than_five_classes():
    totals = loop.Totals()
    with pytest.raises(InputError, match="with 5 classes every label is among the top 5"):
        totals.add(0.0, 2, np.zeros((2, 5), np.float32), np.array([0, 4]), ["top5_accuracy"])


def test_check_metrics():
    assert loop.check_metrics(["accuracy"], "logits") == ["accuracy"]
    with pytest.raises(ValueError, match="unknown metric 'f1'"):
        loop.check_metrics(["f1"], "logits")
    with pytest.raises(ValueError, match="additional_output_names"):
        loop.check_metrics(["accuracy"], None)


def test_train_epoch_learns_and_evaluate_matches_predict(cnn):
    module, optimizer = _module(cnn)
    x, y = _digits()
    before = loop.evaluate(module, loop.batches(x, y, 64), metrics=["accuracy"])
    steps = []
    for epoch in range(3):
        result = loop.train_epoch(module, optimizer, loop.batches(x, y, 32, shuffle=True, epoch=epoch),
                                  metrics=["accuracy"], on_step=lambda n, loss: steps.append(n))
        assert result.num_examples == 200 and result.steps == 7 and not result.stopped
    after = loop.evaluate(module, loop.batches(x, y, 64), metrics=["accuracy"])
    assert after.loss < before.loss and after.metrics["accuracy"] > before.metrics["accuracy"] + 0.3
    assert sum(steps) == 600
    pred = loop.predict(module, x, y, batch_size=64)  # batches of 64, 64, 64, 8: outputs must not alias
    assert pred.shape == (200, 10)
    assert np.mean(pred.argmax(1) == y) == pytest.approx(after.metrics["accuracy"])


def test_should_stop_and_totals_continue_an_epoch(cnn):
    module, optimizer = _module(cnn)
    x, y = _digits(96)
    first = loop.train_epoch(module, optimizer, loop.batches(x, y, 32), should_stop=lambda: True)
    assert first.stopped and first.steps == 1
    rest = loop.train_epoch(module, optimizer, loop.batches(x, y, 32, skip=1), totals=first.totals)
    assert rest.steps == 3 and rest.num_examples == 96


def test_nonfinite_loss_raises(cnn):
    module, optimizer = _module(cnn)
    x, y = _digits(32)
    x[0, 0, 0, 0] = np.nan
    with pytest.raises(NonFiniteError):
        loop.train_epoch(module, optimizer, loop.batches(x, y, 32))


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_epoch_loss_is_a_mean_per_example_whatever_the_batch_size(tmp_path, reduction):
    from onnxtrain.blocks import CrossEntropyLoss

    generate_artifacts(build_cnn(0), loss=CrossEntropyLoss(reduction=reduction), optimizer=OptimType.AdamW,
                       artifact_directory=tmp_path, additional_output_names=["logits"])
    x, y = _digits(60)
    module, _ = _module(tmp_path)
    assert module.training_run.meta.loss_reduction == reduction
    seen = []
    losses = [loop.evaluate(module, loop.batches(x, y, size), on_step=lambda n, loss: seen.append(loss)).loss
              for size in (7, 60)]
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
    assert seen[-1] == pytest.approx(losses[1], rel=1e-6)  # the whole set in one batch: its mean per example


def test_ignored_labels_count_neither_in_the_loss_nor_in_accuracy(tmp_path):
    """With the loss's ignore_index, each batch's mean is over the labels not ignored: the epoch loss weights it by
    their number (it weighted by examples, so it depended on the batch size), and accuracy counts only them (an
    ignored label counted as a miss)."""
    from onnxtrain.blocks import CrossEntropyLoss

    generate_artifacts(build_cnn(0), loss=CrossEntropyLoss(ignore_index=-100), optimizer=OptimType.AdamW,
                       artifact_directory=tmp_path, additional_output_names=["logits"])
    module, _ = _module(tmp_path)
    x, y = _digits(30)
    y[[1, 2, 3, 7, 20]] = -100          # the first batch of 4 keeps one label, the others keep all or most
    results = [loop.evaluate(module, loop.batches(x, y, size), metrics=["accuracy"]) for size in (4, 30)]
    logits = loop.predict(module, x, y)
    keep = y != -100
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    expected_loss = -np.mean(log_p[keep, y[keep]])
    expected_accuracy = np.mean(logits[keep].argmax(axis=1) == y[keep])
    for result in results:
        assert result.loss == pytest.approx(expected_loss, rel=1e-5)
        assert result.metrics["accuracy"] == pytest.approx(expected_accuracy, abs=1e-9)
        assert result.num_examples == 30
