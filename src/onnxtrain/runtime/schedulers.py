"""Learning-rate schedulers: each ``step()`` sets the optimizer's learning rate for the next update."""

from __future__ import annotations

import math

from onnxtrain.runtime.optimizer import Optimizer

__all__ = ["LRScheduler", "LinearLRScheduler", "CosineLRScheduler", "StepLRScheduler"]


class LRScheduler:
    """Base class: ``lr_at(step)`` is the learning rate after ``step`` scheduler steps."""

    def __init__(self, optimizer: Optimizer, initial_lr: float):
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"optimizer must be an onnxtrain Optimizer, got {type(optimizer).__name__}")
        self.optimizer, self.initial_lr, self.count = optimizer, float(initial_lr), 0
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
        if warmup_step_count < 0 or total_step_count <= 0 or warmup_step_count > total_step_count:
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
        if total_step_count <= 0 or not 0 <= warmup_step_count <= total_step_count:
            raise ValueError(f"need 0 <= warmup_step_count <= total_step_count and total_step_count > 0, got "
                             f"warmup_step_count={warmup_step_count}, total_step_count={total_step_count}")
        self.total, self.warmup, self.min_lr = total_step_count, warmup_step_count, min_lr
        super().__init__(optimizer, initial_lr)

    def lr_at(self, step: int) -> float:
        if step < self.warmup:
            return self.initial_lr * step / self.warmup
        progress = min(1.0, (step - self.warmup) / max(1, self.total - self.warmup))
        return self.min_lr + 0.5 * (self.initial_lr - self.min_lr) * (1 + math.cos(math.pi * progress))


class StepLRScheduler(LRScheduler):
    """Multiply the learning rate by ``gamma`` every ``step_size`` steps (torch.optim.lr_scheduler.StepLR)."""

    def __init__(self, optimizer: Optimizer, step_size: int, initial_lr: float, gamma: float = 0.1):
        if step_size <= 0:
            raise ValueError(f"step_size must be positive, got {step_size}")
        self.step_size, self.gamma = step_size, gamma
        super().__init__(optimizer, initial_lr)

    def lr_at(self, step: int) -> float:
        return self.initial_lr * self.gamma ** (step // self.step_size)
