"""The epoch loop shared by the command line, the demo and the federated client.

    for epoch in range(epochs):
        result = train_epoch(module, optimizer, batches(x, y, 32, shuffle=True, seed=0, epoch=epoch),
                             metrics=["accuracy"])
        print(result.loss, result.metrics["accuracy"], result.num_examples)
    print(evaluate(module, batches(x_val, y_val, 256), metrics=["accuracy"]).metrics)

Metrics read the predictions that the artifacts return after the loss (generate them with
``additional_output_names=[<model output>]``); the first additional output is taken as the predictions.
Loss values are means over examples (each batch's mean loss weighted by its size; a loss generated with
``reduction="sum"`` is summed over the batches, then divided by the number of examples; a class loss with an
``ignore_index`` is a mean over the labels not ignored, weighted by their number, and the class metrics count only
those labels). Nothing here imports
anything beyond numpy and the runtime, so a federated client can call it as it is.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from onnxtrain.errors import InputError, NonFiniteError
from onnxtrain.runtime.module import Module
from onnxtrain.runtime.optimizer import Optimizer
from onnxtrain.runtime.schedulers import LRScheduler

__all__ = ["METRICS", "Inputs", "Totals", "EpochResult", "batches", "num_batches", "train_epoch", "evaluate",
           "predict", "check_metrics", "format_metrics"]


class Inputs:
    """The data of a model with several inputs (``input_ids``, ``attention_mask``...), by name in the model's order,
    indexed together: ``inputs[idx]`` selects the same examples of every array, as ``x[idx]`` does for one."""

    def __init__(self, arrays: dict[str, np.ndarray]):
        if not arrays:
            raise ValueError("Inputs needs at least one array")
        self.arrays = dict(arrays)

    def __len__(self) -> int:
        return len(next(iter(self.arrays.values())))

    def __getitem__(self, index) -> Inputs:
        return Inputs({name: a[index] for name, a in self.arrays.items()})

    def __repr__(self) -> str:
        return "Inputs(" + ", ".join(f"{n}: {a.dtype}{list(a.shape)}" for n, a in self.arrays.items()) + ")"


Batch = tuple["np.ndarray | Inputs", np.ndarray]


def _call(module: Module, x: np.ndarray | Inputs, y: np.ndarray):
    return module(*x.arrays.values(), y) if isinstance(x, Inputs) else module(x, y)


# -- metrics: (predictions, labels) -> (sum, count); the metric is sum / count over an epoch ---------------------
def _class_indices(pred: np.ndarray, y: np.ndarray) -> None:
    if y.dtype.kind not in "iu" or pred.ndim != y.ndim + 1:
        raise ValueError(f"it compares class scores (one more axis than the labels) with integer class indices, "
                         f"these labels are {y.dtype}")


def _class_axis(pred: np.ndarray, y: np.ndarray) -> int:
    """1 for [N, C, ...] scores (torch's layout), -1 for [N, ..., C] (a tagger's or language model's, class_axis=-1)
    when only that layout matches the labels."""
    if pred.shape[:1] + pred.shape[2:] != y.shape and pred.shape[:-1] == y.shape:
        return -1
    return 1


def _kept(y: np.ndarray, ignore_index: int | None) -> np.ndarray | bool:
    """The labels that count: all of them, or those that are not the loss's ignore_index."""
    return True if ignore_index is None else y != ignore_index


def _accuracy(pred: np.ndarray, y: np.ndarray, ignore_index: int | None = None) -> tuple[float, int]:
    """Class scores on axis 1 (or the last axis, see _class_axis) (argmax) against class indices; labels equal to
    ``ignore_index`` do not count."""
    _class_indices(pred, y)
    kept = _kept(y, ignore_index)
    hits = (np.argmax(pred, axis=_class_axis(pred, y)) == y) & kept
    return float(np.sum(hits)), int(np.sum(kept) if ignore_index is not None else y.size)


def _top5(pred: np.ndarray, y: np.ndarray, ignore_index: int | None = None) -> tuple[float, int]:
    _class_indices(pred, y)
    axis = _class_axis(pred, y)
    if pred.shape[axis] <= 5:
        raise ValueError(f"with {pred.shape[axis]} classes every label is among the top 5, so it is always 100%")
    top = np.moveaxis(np.argpartition(-pred, 4, axis=axis), axis, 1)[:, :5]
    kept = _kept(y, ignore_index)
    hits = np.any(top == np.expand_dims(y, 1), axis=1) & kept
    return float(np.sum(hits)), int(np.sum(kept) if ignore_index is not None else y.size)


def _binary_accuracy(pred: np.ndarray, y: np.ndarray) -> tuple[float, int]:
    """Logits (> 0 is the positive class) against 0/1 targets."""
    return float(np.sum((pred.reshape(y.shape) > 0) == (y > 0.5))), int(y.size)


def _mse(pred: np.ndarray, y: np.ndarray) -> tuple[float, int]:
    d = pred.reshape(y.shape).astype(np.float64) - y
    return float(np.sum(d * d)), int(y.size)


def _mae(pred: np.ndarray, y: np.ndarray) -> tuple[float, int]:
    return float(np.sum(np.abs(pred.reshape(y.shape).astype(np.float64) - y))), int(y.size)


METRICS: dict[str, Callable[[np.ndarray, np.ndarray], tuple[float, int]]] = {
    "accuracy": _accuracy, "top5_accuracy": _top5, "binary_accuracy": _binary_accuracy, "mse": _mse, "mae": _mae,
}
_CLASS_METRICS = frozenset({"accuracy", "top5_accuracy"})  # they take the loss's ignore_index


def check_metrics(names: Sequence[str], predictions: str | None) -> list[str]:
    """Validate metric names; metrics need a predictions output in the artifacts."""
    unknown = [m for m in names if m not in METRICS]
    if unknown:
        raise ValueError(f"unknown metric {unknown[0]!r}; available metrics: {', '.join(METRICS)}")
    if names and predictions is None:
        raise ValueError(f"the metric {names[0]!r} needs the model's predictions, but the artifacts return only the "
                         "loss; generate them with additional_output_names=[<model output>] "
                         "(onnxtrain generate --additional-outputs NAME)")
    return list(names)


@dataclass
class Totals:
    """Running sums over part of an epoch; ``merge`` continues an interrupted epoch."""

    loss_sum: float = 0.0
    num_examples: int = 0
    steps: int = 0
    metric_sums: dict[str, list[float]] = field(default_factory=dict)  # name -> [sum, count]
    loss_weight: float = 0.0   # what the batch losses are weighted by: examples, or labels not ignored

    def add(self, loss: float, n: int, pred: np.ndarray | None, y: np.ndarray, metrics: Sequence[str],
            ignore_index: int | None = None) -> None:
        """Count one batch of ``n`` examples whose mean loss is ``loss``. With the loss's ``ignore_index``, the loss
        is a mean over the labels that are not ignored, and is weighted by their number (a batch with none
        counts nothing), as the class metrics count only those labels."""
        weight = n if ignore_index is None else int(np.sum(y != ignore_index))
        if weight:
            self.loss_sum += loss * weight
            self.loss_weight += weight
        self.num_examples += n
        self.steps += 1
        for name in metrics:
            try:
                total, count = (METRICS[name](pred, y, ignore_index) if name in _CLASS_METRICS
                                else METRICS[name](pred, y))
            except ValueError as exc:   # a metric that does not fit the task (accuracy on multi-label targets)
                raise InputError(f"the metric {name!r} does not fit predictions of shape {list(np.shape(pred))} and "
                                 f"labels of shape {list(np.shape(y))} ({exc}); choose metrics that fit the loss: "
                                 "accuracy and top5_accuracy for class scores, binary_accuracy for one logit per "
                                 "label, mse and mae for regression") from None
            acc = self.metric_sums.setdefault(name, [0.0, 0])
            acc[0] += total
            acc[1] += count

    @property
    def loss(self) -> float:
        weight = self.loss_weight or self.num_examples   # totals saved before loss_weight existed: examples
        return self.loss_sum / weight if weight else float("nan")

    def metrics(self) -> dict[str, float]:
        return {k: (s / c if c else float("nan")) for k, (s, c) in self.metric_sums.items()}


@dataclass
class EpochResult:
    """One pass over a data set: mean loss, metrics, number of examples (for weighting) and timing."""

    loss: float
    metrics: dict[str, float]
    num_examples: int
    steps: int
    seconds: float
    stopped: bool = False          # should_stop() ended the pass early
    totals: Totals = field(default_factory=Totals)

    @property
    def examples_per_second(self) -> float:
        return self.num_examples / self.seconds if self.seconds > 0 else float("nan")


def batches(x: np.ndarray | Inputs, y: np.ndarray, batch_size: int, *, shuffle: bool = False, seed: int = 0,
            epoch: int = 0, drop_last: bool = False, skip: int = 0) -> Iterator[Batch]:
    """Mini-batches of (x, y). The shuffle order depends only on (seed, epoch), so an interrupted epoch can be
    resumed exactly by skipping the ``skip`` batches already done."""
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    if len(x) != len(y):
        raise ValueError(f"x has {len(x)} examples but y has {len(y)}")
    n = len(x)
    order = np.random.default_rng([seed, epoch]).permutation(n) if shuffle else None
    stop = n - n % batch_size if drop_last else n
    for start in range(skip * batch_size, stop, batch_size):
        if order is None:
            yield x[start:start + batch_size], y[start:start + batch_size]
        else:
            idx = order[start:start + batch_size]
            yield x[idx], y[idx]


def num_batches(n: int, batch_size: int, drop_last: bool = False) -> int:
    """How many batches :func:`batches` yields for ``n`` examples."""
    return n // batch_size if drop_last else -(-n // batch_size)


def _summed_loss(module: Module) -> bool:
    return module.training_run.meta.loss_reduction == "sum"


def _ignore_index(module: Module, summed: bool) -> int | None:
    """The class loss's ignore_index when its mean is over the labels that are not ignored, else None."""
    labels = module.training_run.train_labels
    return None if summed else next((c.ignore_index for c in labels.values() if c.ignore_index is not None), None)


def _split_outputs(out) -> tuple[float, np.ndarray | None]:
    """A Module call returns the loss alone, or (loss, *additional outputs); the first extra is the predictions."""
    if isinstance(out, (list, tuple)):
        return float(out[0]), (out[1] if len(out) > 1 else None)
    return float(out), None


def train_epoch(module: Module, optimizer: Optimizer, data: Iterable[Batch], *, scheduler: LRScheduler | None = None,
                metrics: Sequence[str] = (), on_step: Callable[[int, float], None] | None = None,
                should_stop: Callable[[], bool] | None = None, totals: Totals | None = None) -> EpochResult:
    """One pass of optimizer steps over ``data``: forward + backward, ``optimizer.step()``, reset the gradients.

    Args:
        on_step: called after each step with (batch size, the batch's mean loss per example), e.g. to advance a
            progress bar.
        should_stop: polled after each step; True ends the epoch early (``result.stopped``), e.g. on Ctrl-C.
        totals: the sums of the part of this epoch already done (to resume an interrupted epoch).

    Raises:
        NonFiniteError: a batch's loss is NaN or infinite; the parameters are left as they were before it.
    """
    totals = totals if totals is not None else Totals()
    summed = _summed_loss(module)
    ignore_index = _ignore_index(module, summed)
    module.train()
    start = time.perf_counter()
    stopped = False
    for x, y in data:
        loss, pred = _split_outputs(_call(module, x, y))
        if not np.isfinite(loss):  # a Module with on_nonfinite="skip" only warns; a loop must not go on
            raise NonFiniteError(f"the training loss is {loss} at step {totals.steps + 1} of the epoch")
        optimizer.step()
        module.lazy_reset_grad()
        if scheduler is not None:
            scheduler.step()
        loss = loss / len(x) if summed else loss
        totals.add(loss, len(x), pred, y, metrics, ignore_index)
        if on_step is not None:
            on_step(len(x), loss)
        if should_stop is not None and should_stop():
            stopped = True
            break
    seconds = time.perf_counter() - start
    return EpochResult(totals.loss, totals.metrics(), totals.num_examples, totals.steps, seconds, stopped, totals)


def evaluate(module: Module, data: Iterable[Batch], *, metrics: Sequence[str] = (),
             on_step: Callable[[int, float], None] | None = None) -> EpochResult:
    """The eval graph over ``data`` (no parameter changes); the Module is left in eval mode."""
    totals = Totals()
    summed = _summed_loss(module)
    ignore_index = _ignore_index(module, summed)
    module.eval()
    start = time.perf_counter()
    for x, y in data:
        loss, pred = _split_outputs(_call(module, x, y))
        loss = loss / len(x) if summed else loss
        totals.add(loss, len(x), pred, y, metrics, ignore_index)
        if on_step is not None:
            on_step(len(x), loss)
    seconds = time.perf_counter() - start
    return EpochResult(totals.loss, totals.metrics(), totals.num_examples, totals.steps, seconds, False, totals)


def predict(module: Module, x: np.ndarray | Inputs, y: np.ndarray, batch_size: int = 256) -> np.ndarray:
    """The predictions (first additional output) of the eval graph for every example, concatenated."""
    module.eval()
    outs = []
    for xb, yb in batches(x, y, batch_size):
        _, pred = _split_outputs(_call(module, xb, yb))
        if pred is None:
            raise ValueError("predict() needs artifacts generated with additional_output_names=[<model output>]")
        outs.append(pred)
    return np.concatenate(outs)


def format_metrics(loss: float, metrics: dict[str, float]) -> str:
    """``loss 0.1234 accuracy 97.5%``: one epoch's figures for a log line."""
    parts = [f"loss {loss:.4f}"]
    for name, value in metrics.items():
        parts.append(f"{name} {100 * value:.1f}%" if name.endswith("accuracy") else f"{name} {value:.4g}")
    return " ".join(parts)
