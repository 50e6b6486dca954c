"""Optimizer transforms: the steps an update rule is composed of, as optax's ``chain``.

Each transform reads and writes an :class:`UpdateState` (the parameters, the update direction, the scalar
factors of the step size, the optimizer states) and declares the state vectors it carries from step to step.
Aliases in optim.py only compose them::

    AdamW(mode="torch") = chain(clip_by_global_norm, decay_weights, scale_by_adam, scale_by_learning_rate)

Every value is a flat vector of all trainable parameters (or a float scalar), so a transform is a few vector
ops whatever the model. The step size is kept as scalar factors until ``ScaleByLearningRate`` applies it, so
the learning rate and the bias corrections cost one vector multiplication in all, as in a hand-written rule.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from onnxtrain.ir.builder import GraphBuilder

__all__ = ["UpdateState", "Transform", "Chain", "ClipByGlobalNorm", "AddL2", "DecayWeights", "ScaleByAdam",
           "ScaleByAdamPeer", "TraceMomentum", "ScaleByLearningRate", "UpdateFunction"]


@dataclass
class UpdateState:
    """What flows through a chain.

    Attributes:
        builder: the graph the update is built into.
        learning_rate, step: the scalar inputs (``step`` is a float, 1 for the first update).
        params: the parameter vector (transforms applied after ``ScaleByLearningRate`` see the new one).
        direction: the update direction (the gradients at the start of the chain).
        states: the optimizer states as the step found them, by name.
        new_states: the states the step leaves, by name (every declared state must be set).
        factors, divisors: scalars the step size is multiplied and divided by.
    """

    builder: GraphBuilder
    learning_rate: str
    step: str
    params: str
    direction: str
    states: dict[str, str]
    new_states: dict[str, str] = field(default_factory=dict)
    factors: list[str] = field(default_factory=list)
    divisors: list[str] = field(default_factory=list)

    @property
    def op(self):
        return self.builder.op

    def scalar(self, value: float) -> str:
        return self.builder.const(np.asarray(value, dtype=np.float32))


class Transform:
    """One step of an update rule; ``state_names`` are the state vectors it carries between steps."""

    state_names: tuple[str, ...] = ()

    def apply(self, u: UpdateState) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement apply()")


class Chain:
    """Transforms applied in order (optax's ``chain``)."""

    def __init__(self, transforms: Sequence[Transform]):
        self.transforms = list(transforms)

    @property
    def state_names(self) -> tuple[str, ...]:
        return tuple(s for t in self.transforms for s in t.state_names)

    def build(self, u: UpdateState) -> tuple[str, dict[str, str]]:
        """Emit the update; returns (new parameters, new states by name)."""
        for t in self.transforms:
            t.apply(u)
        missing = [s for s in self.state_names if s not in u.new_states]
        if missing:
            raise ValueError(f"the optimizer chain declares the states {missing} but no transform set their new "
                             f"values; set u.new_states[name] in the transform that declares them")
        return u.params, u.new_states


class ClipByGlobalNorm(Transform):
    """Scale the direction by min(1, max_norm / (||g|| + 1e-6)), as torch.nn.utils.clip_grad_norm_."""

    def __init__(self, max_norm: float):
        self.max_norm = max_norm

    def apply(self, u: UpdateState) -> None:
        op, s = u.op, u.scalar
        norm = op.Sqrt(u.builder.reduce("ReduceSumSquare", u.direction, None, keepdims=False))
        coef = op.Min(op.Div(s(self.max_norm), op.Add(norm, s(1e-6))), s(1.0))
        u.direction = op.Mul(u.direction, coef)


class AddL2(Transform):
    """L2 regularisation coupled to the gradient: g += weight_decay * p (torch.optim.Adam and SGD)."""

    def __init__(self, weight_decay: float):
        self.weight_decay = weight_decay

    def apply(self, u: UpdateState) -> None:
        u.direction = u.op.Add(u.direction, u.op.Mul(u.params, u.scalar(self.weight_decay)))


class DecayWeights(Transform):
    """Decoupled weight decay (Loshchilov & Hutter, 2019): p *= 1 - lr * weight_decay. Before
    ``ScaleByLearningRate`` it decays the old parameters (torch.optim.AdamW), after it the new ones (the peer)."""

    def __init__(self, weight_decay: float):
        self.weight_decay = weight_decay

    def apply(self, u: UpdateState) -> None:
        op, s = u.op, u.scalar
        u.params = op.Mul(u.params, op.Sub(s(1.0), op.Mul(u.learning_rate, s(self.weight_decay))))


class ScaleByAdam(Transform):
    """Adam's direction (Kingma & Ba, 2015), as torch.optim.Adam/AdamW: m / (sqrt(v) / sqrt(1 - b2^t) + eps),
    the step size divided by 1 - b1^t."""

    state_names = ("exp_avg", "exp_avg_sq")

    def __init__(self, betas: tuple[float, float], eps: float, bias_correction: bool = True):
        self.betas, self.eps, self.bias_correction = tuple(betas), eps, bias_correction

    def one_minus_betas(self) -> tuple[float, float]:
        b1, b2 = self.betas
        return 1 - b1, 1 - b2  # in double, as torch

    def moments(self, u: UpdateState) -> tuple[str, str, str, str]:
        """(m, v, 1 - b1^t, 1 - b2^t), recording m and v as the new states."""
        op, s, g = u.op, u.scalar, u.direction
        (b1, b2), (c1, c2) = self.betas, self.one_minus_betas()
        m = op.Add(op.Mul(u.states["exp_avg"], s(b1)), op.Mul(g, s(c1)))                 # m = b1 m + (1-b1) g
        v = op.Add(op.Mul(u.states["exp_avg_sq"], s(b2)), op.Mul(op.Mul(g, g), s(c2)))     # v = b2 v + (1-b2) g^2
        bc1 = op.Sub(s(1.0), op.Pow(s(b1), u.step)) if self.bias_correction else s(1.0)    # 1 - b1^t
        bc2 = op.Sub(s(1.0), op.Pow(s(b2), u.step)) if self.bias_correction else s(1.0)    # 1 - b2^t
        u.new_states.update(exp_avg=m, exp_avg_sq=v)
        return m, v, bc1, bc2

    def apply(self, u: UpdateState) -> None:
        op, s = u.op, u.scalar
        m, v, bc1, bc2 = self.moments(u)
        u.direction = op.Div(m, op.Add(op.Div(op.Sqrt(v), op.Sqrt(bc2)), s(self.eps)))
        u.divisors.append(bc1)


class ScaleByAdamPeer(ScaleByAdam):
    """Adam's direction as onnxruntime-training's AdamW kernel: m / (sqrt(v) + eps), the step size multiplied
    by sqrt(1 - b2^t) / (1 - b1^t) (epsilon outside the bias correction)."""

    def one_minus_betas(self) -> tuple[float, float]:
        # The peer's kernel computes 1 - beta in float32 from the float32 beta (1 - 0.999f differs from 0.001f
        # by 1.3e-5 relative).
        b1, b2 = self.betas
        return 1 - float(np.float32(b1)), 1 - float(np.float32(b2))

    def apply(self, u: UpdateState) -> None:
        op, s = u.op, u.scalar
        m, v, bc1, bc2 = self.moments(u)
        u.direction = op.Div(m, op.Add(op.Sqrt(v), s(self.eps)))
        u.factors.append(op.Sqrt(bc2))
        u.divisors.append(bc1)


class TraceMomentum(Transform):
    """Heavy-ball or Nesterov momentum with dampening, as torch.optim.SGD (the first step's buffer is g)."""

    state_names = ("momentum_buffer",)

    def __init__(self, momentum: float, dampening: float = 0.0, nesterov: bool = False):
        self.momentum, self.dampening, self.nesterov = momentum, dampening, nesterov

    def apply(self, u: UpdateState) -> None:
        op, s, g = u.op, u.scalar, u.direction
        buf = op.Add(op.Mul(u.states["momentum_buffer"], s(self.momentum)), op.Mul(g, s(1 - self.dampening)))
        buf = op.Where(op.Equal(u.step, s(1.0)), g, buf)                                  # first step: buf = g
        u.new_states["momentum_buffer"] = buf
        u.direction = op.Add(g, op.Mul(buf, s(self.momentum))) if self.nesterov else buf


class ScaleByLearningRate(Transform):
    """Apply the update: p -= direction * (lr * factors / divisors)."""

    def apply(self, u: UpdateState) -> None:
        op = u.op
        step_size = u.learning_rate
        for f in u.factors:
            step_size = op.Mul(step_size, f)
        for d in u.divisors:
            step_size = op.Div(step_size, d)
        u.params = op.Sub(u.params, op.Mul(u.direction, step_size))
        u.factors, u.divisors = [], []


class UpdateFunction(Transform):
    """A whole update rule written as one function ``update(p, g, states, lr, step) -> (p, new_states)`` (the
    extension point of ``blocks.Optimizer`` subclasses that override ``update``; they declare their states
    themselves)."""

    def __init__(self, update: Callable):
        self.update = update

    def apply(self, u: UpdateState) -> None:
        u.params, new_states = self.update(u.params, u.direction, u.states, u.learning_rate, u.step)
        u.new_states.update(new_states)
