"""Progress of an epoch: a tqdm bar on a terminal, plain periodic lines elsewhere (or without tqdm)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress", "PROGRESS_MODES"]

PROGRESS_MODES = ("auto", "bar", "plain", "none")


def _tqdm():
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm


class Progress:
    """`with progress.epoch("epoch 1/5", batches, examples) as update: update(n, loss)` per step (with the running
    metrics too: `update(n, loss, {"accuracy": 0.9})`).

    Args:
        mode: "bar" (tqdm), "plain" (a line every tenth of an epoch, at most every 2 s), "none", or "auto"
            (a bar when tqdm is installed and the stream is a terminal, else plain).
    """

    def __init__(self, mode: str = "auto", stream: TextIO | None = None):
        if mode not in PROGRESS_MODES:
            raise ValueError(f"unknown progress mode {mode!r}; expected one of {', '.join(PROGRESS_MODES)}")
        self.stream = stream or sys.stderr
        tqdm = _tqdm()
        if mode == "auto":
            mode = "bar" if tqdm is not None and self.stream.isatty() else "plain"
        elif mode == "bar" and tqdm is None:
            print("onnxtrain: note: tqdm is not installed (pip install tqdm); showing plain progress lines",
                  file=self.stream)
            mode = "plain"
        self.mode = mode

    def epoch(self, desc: str, total_batches: int, total_examples: int) -> _Epoch:
        return _Epoch(self, desc, total_batches, total_examples)


class _Epoch:
    def __init__(self, progress: Progress, desc: str, total_batches: int, total_examples: int):
        self.p, self.desc = progress, desc
        self.total_batches, self.total_examples = total_batches, total_examples
        self.batches = self.examples = 0
        self.loss_sum = 0.0
        self.bar = None

    def __enter__(self):
        self.start = self.last_print = time.perf_counter()
        if self.p.mode == "bar":
            self.bar = _tqdm()(total=self.total_examples, desc=self.desc, unit="ex", leave=False, file=self.p.stream,
                               dynamic_ncols=True)
        return self.update

    def update(self, n: int, loss: float, metrics: dict[str, float] | None = None) -> None:
        """One step of ``n`` examples with mean loss ``loss``; ``metrics``: the epoch's running metrics so far."""
        from onnxtrain.runtime.loop import format_metrics

        self.batches += 1
        self.examples += n
        self.loss_sum += loss * n
        mean = self.loss_sum / self.examples
        figures = format_metrics(mean, metrics or {})
        if self.bar is not None:
            self.bar.set_postfix_str(figures, refresh=False)
            self.bar.update(n)
        elif self.p.mode == "plain":
            now = time.perf_counter()
            tenth = max(1, self.total_batches // 10)
            if (self.batches % tenth == 0 and now - self.last_print >= 2.0) and self.batches < self.total_batches:
                rate = self.examples / max(now - self.start, 1e-9)
                print(f"  {self.desc}: {self.batches}/{self.total_batches} batches, {figures}, "
                      f"{rate:,.0f} examples/s", file=self.p.stream, flush=True)
                self.last_print = now

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.close()
