"""Learning-rate schedulers: each ``step()`` sets the optimizer's learning rate for the next update."""

from __future__ import annotations

import math
import numbers

from onnxtrain.runtime.optimizer import Optimizer

__all__ = ["LRScheduler", "LinearLRScheduler", "CosineLRScheduler", "StepLRScheduler"]


def _count(name: str, value, minimum: int) -> int:
    """A step count: an integer (Python or numpy, not a bool) of at least ``minimum``."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return int(value)


def _rate(name: str, value, positive: bool = False) -> float:
    """A learning rate or factor: a finite real number, not negative (or positive)."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise ValueError(f"{name} must be a finite {'positive' if positive else 'non-negative'} number, got {value}")
    return float(value)


class LRScheduler:
    """Base class: ``lr_at(step)`` is the learning rate after ``step`` scheduler steps."""

    def __init__(self, optimizer: Optimizer, initial_lr: float):
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"optimizer must be an onnxtrain Optimizer, got {type(optimizer).__name__}")
        self.optimizer, self.initial_lr, self.count = optimizer, _rate("initial_lr", initial_lr), 0
        optimizer.set_learning_rate(self.lr_at(0))

    def lr_at(self, step: int) -> float:
        raise NotImplementedError

    def step(self) -> None:
        self.count += 1
        self.optimizer.set_learning_rate(self.lr_at(self.count))


class LinearLRScheduler(LRScheduler):
    """Linear warm-up from 0 to ``initial_lr`` over ``warmup_step_count`` steps, then linear decay to 0 at
    ``total_step_count`` (the documented semantics; onnxruntime-training 1.19 swapped the two counts)."""

    def __init__(self, optimizer: Optimizer, warmup_step_count: int, total_step_count: int, initial_lr: float):
        warmup_step_count = _count("warmup_step_count", warmup_step_count, 0)
        total_step_count = _count("total_step_count", total_step_count, 1)
        if warmup_step_count > total_step_count:
            raise ValueError(f"need 0 <= warmup_step_count <= total_step_count and total_step_count > 0, got "
                             f"warmup_step_count={warmup_step_count}, total_step_count={total_step_count}")
        self.warmup, self.total = warmup_step_count, total_step_count
        super().__init__(optimizer, initial_lr)

    def lr_at(self, step: int) -> float:
        if step < self.warmup:
            return self.initial_lr * step / self.warmup
        return self.initial_lr * max(0.0, (self.total - step) / max(1, self.total - self.warmup))


class CosineLRScheduler(LRScheduler):
    """Optional linear warm-up, then cosine decay from ``initial_lr`` to ``min_lr`` at ``total_step_count``."""

    def __init__(self, optimizer: Optimizer, total_step_count: int, initial_lr: float, warmup_step_count: int = 0,
                 min_lr: float = 0.0):
        total_step_count = _count("total_step_count", total_step_count, 1)
        warmup_step_count = _count("warmup_step_count", warmup_step_count, 0)
        if warmup_step_count > total_step_count:
            raise ValueError(f"need 0 <= warmup_step_count <= total_step_count and total_step_count > 0, got "
                             f"warmup_step_count={warmup_step_count}, total_step_count={total_step_count}")
        self.total, self.warmup, self.min_lr = total_step_count, warmup_step_count, _rate("min_lr", min_lr)
        super().__init__(optimizer, initial_lr)

    def lr_at(self, step: int) -> float:
        if step < self.warmup:
            return self.initial_lr * step / self.warmup
        progress = min(1.0, (step - self.warmup) / max(1, self.total - self.warmup))
        return self.min_lr + 0.5 * (self.initial_lr - self.min_lr) * (1 + math.cos(math.pi * progress))


class StepLRScheduler(LRScheduler):
    """Multiply the learning rate by ``gamma`` every ``step_size`` steps (torch.optim.lr_scheduler.StepLR)."""

    def __init__(self, optimizer: Optimizer, step_size: int, initial_lr: float, gamma: float = 0.1):
        self.step_size, self.gamma = _count("step_size", step_size, 1), _rate("gamma", gamma, positive=True)
        super().__init__(optimizer, initial_lr)

    def lr_at(self, step: int) -> float:
        try:
            return self.initial_lr * self.gamma ** (step // self.step_size)
        except OverflowError:  # gamma > 1 for long enough: the optimizer refuses it, naming the value
            return math.inf
