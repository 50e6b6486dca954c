"""Optimizer blocks: the update rule of one flat parameter vector, written with standard ONNX ops.

The optimizer graph works on every trainable parameter at once, concatenated into one flat vector (the
runtime keeps parameters, gradients and states in flat buffers and hands each parameter a view), so an
update is about a dozen ops in all, not a dozen per parameter. Inputs: ``learning_rate`` (float scalar),
``step`` (int64 scalar, 1 for the first update), ``params``, ``gradients`` and one input per state
(``exp_avg``...). Outputs: ``params.out`` and ``<state>.out``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from onnxtrain.blocks.base import Block

__all__ = ["Optimizer", "AdamW", "Adam", "SGD", "OptimizerInputs"]


@dataclass
class OptimizerInputs:
    """Names of the scalar and flat-vector values an update rule reads."""

    learning_rate: str
    step: str           # float copy of the int64 step count
    params: str
    gradients: str
    states: dict[str, str]


class Optimizer(Block):
    """Base class: ``state_names`` lists the per-parameter state vectors; ``update`` emits the math.

    Args:
        max_norm: if set, gradients are scaled so that their global L2 norm is at most ``max_norm``.
    """

    state_names: tuple[str, ...] = ()

    def __init__(self, max_norm: float | None = None):
        super().__init__()
        self.max_norm = max_norm

    def config(self) -> dict:
        """Hyper-parameters recorded in the optimizer model's metadata."""
        return {k: v for k, v in vars(self).items() if not k.startswith("_")}

    def scalar(self, value: float) -> str:
        return self.builder.const(np.asarray(value, dtype=np.float32))

    def clip(self, g: str) -> str:
        """Scale ``g`` by min(1, max_norm / (||g|| + 1e-6)), as torch.nn.utils.clip_grad_norm_."""
        if self.max_norm is None:
            return g
        op = self.op
        norm = op.Sqrt(self.builder.reduce("ReduceSumSquare", g, None, keepdims=False))
        coef = op.Min(op.Div(self.scalar(self.max_norm), op.Add(norm, self.scalar(1e-6))), self.scalar(1.0))
        return op.Mul(g, coef)

    def build(self, inputs: OptimizerInputs) -> tuple[str, dict[str, str]]:
        return self.update(inputs.params, self.clip(inputs.gradients), inputs.states, inputs.learning_rate,
                           inputs.step)

    def update(self, p: str, g: str, states: dict[str, str], lr: str, step: str) -> tuple[str, dict[str, str]]:
        raise NotImplementedError


class AdamW(Optimizer):
    """Adam with decoupled weight decay (Loshchilov & Hutter, 2019).

    ``mode="hf"`` (default, as onnxruntime-training's AdamW): eps is added to sqrt(v) and the bias
    correction scales the step size, weight decay is applied after the update. ``mode="torch"``:
    torch.optim.AdamW (decay first, eps added to the bias-corrected sqrt(v)).
    """

    state_names = ("exp_avg", "exp_avg_sq")

    def __init__(self, bias_correction: bool = True, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.0, max_norm: float | None = None, mode: str = "hf"):
        super().__init__(max_norm)
        if mode not in ("hf", "torch"):
            raise ValueError(f"AdamW mode must be 'hf' or 'torch', got {mode!r}")
        self.bias_correction, self.betas, self.eps = bias_correction, tuple(betas), eps
        self.weight_decay, self.mode = weight_decay, mode

    def update(self, p, g, states, lr, step):
        op, s = self.op, self.scalar
        b1, b2 = self.betas
        # The peer's kernel computes 1 - beta in float32 from the float32 beta (1 - 0.999f differs from
        # 0.001f by 1.3e-5 relative); torch computes it in double. Follow each one's arithmetic.
        c1, c2 = (1 - float(np.float32(b1)), 1 - float(np.float32(b2))) if self.mode == "hf" else (1 - b1, 1 - b2)
        m = op.Add(op.Mul(states["exp_avg"], s(b1)), op.Mul(g, s(c1)))                   # m = b1 m + (1-b1) g
        v = op.Add(op.Mul(states["exp_avg_sq"], s(b2)), op.Mul(op.Mul(g, g), s(c2)))       # v = b2 v + (1-b2) g^2
        bc1 = op.Sub(s(1.0), op.Pow(s(b1), step)) if self.bias_correction else s(1.0)      # 1 - b1^t
        bc2 = op.Sub(s(1.0), op.Pow(s(b2), step)) if self.bias_correction else s(1.0)      # 1 - b2^t
        if self.mode == "hf":
            step_size = op.Div(op.Mul(lr, op.Sqrt(bc2)), bc1)
            p = op.Sub(p, op.Mul(op.Div(m, op.Add(op.Sqrt(v), s(self.eps))), step_size))
            if self.weight_decay:
                p = op.Mul(p, op.Sub(s(1.0), op.Mul(lr, s(self.weight_decay))))
        else:
            if self.weight_decay:
                p = op.Mul(p, op.Sub(s(1.0), op.Mul(lr, s(self.weight_decay))))
            denom = op.Add(op.Div(op.Sqrt(v), op.Sqrt(bc2)), s(self.eps))
            p = op.Sub(p, op.Mul(op.Div(m, denom), op.Div(lr, bc1)))
        return p, {"exp_avg": m, "exp_avg_sq": v}


class Adam(AdamW):
    """Adam with L2 weight decay added to the gradient (torch.optim.Adam)."""

    def __init__(self, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
                 max_norm: float | None = None):
        super().__init__(True, betas, eps, 0.0, max_norm, mode="torch")
        self.l2 = weight_decay

    def update(self, p, g, states, lr, step):
        if self.l2:
            g = self.op.Add(g, self.op.Mul(p, self.scalar(self.l2)))
        return super().update(p, g, states, lr, step)


class SGD(Optimizer):
    """Stochastic gradient descent with optional momentum, dampening, Nesterov and weight decay (torch.optim.SGD)."""

    def __init__(self, momentum: float = 0.0, dampening: float = 0.0, nesterov: bool = False,
                 weight_decay: float = 0.0, max_norm: float | None = None):
        super().__init__(max_norm)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("SGD: Nesterov momentum requires momentum > 0 and dampening = 0")
        self.momentum, self.dampening, self.nesterov, self.weight_decay = momentum, dampening, nesterov, weight_decay
        self.state_names = ("momentum_buffer",) if momentum else ()

    def update(self, p, g, states, lr, step):
        op, s = self.op, self.scalar
        if self.weight_decay:
            g = op.Add(g, op.Mul(p, s(self.weight_decay)))                                  # g += wd p
        new_states = {}
        if self.momentum:
            buf = op.Add(op.Mul(states["momentum_buffer"], s(self.momentum)), op.Mul(g, s(1 - self.dampening)))
            buf = op.Where(op.Equal(step, s(1.0)), g, buf)                                 # first step: buf = g
            new_states["momentum_buffer"] = buf
            g = op.Add(g, op.Mul(buf, s(self.momentum))) if self.nesterov else buf
        return op.Sub(p, op.Mul(g, lr)), new_states
