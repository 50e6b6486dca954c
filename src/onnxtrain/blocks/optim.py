"""Optimizer blocks: the update rule of one flat parameter vector, written with standard ONNX ops.

Each optimizer is a chain of transforms (transforms.py, as optax's aliases): the classes here only pick and
order them.

The optimizer graph works on every trainable parameter at once, concatenated into one flat vector (the
runtime keeps parameters, gradients and states in flat buffers and hands each parameter a view), so an
update is about a dozen ops in all, not a dozen per parameter. Inputs: ``learning_rate`` (float scalar),
``step`` (int64 scalar, 1 for the first update), ``params``, ``gradients`` and one input per state
(``exp_avg``...). Outputs: ``params.out`` and ``<state>.out``.
"""

from __future__ import annotations

from dataclasses import dataclass

from onnxtrain.blocks.base import Block, BuildContext
from onnxtrain.blocks.transforms import (
    AddL2,
    Chain,
    ClipByGlobalNorm,
    DecayWeights,
    ScaleByAdam,
    ScaleByAdamPeer,
    ScaleByLearningRate,
    TraceMomentum,
    Transform,
    UpdateFunction,
    UpdateState,
)

__all__ = ["Optimizer", "AdamW", "Adam", "SGD", "OptimizerInputs"]


@dataclass
class OptimizerInputs:
    """Names of the scalar and flat-vector values an update rule reads, and the graph they are in."""

    context: BuildContext
    learning_rate: str
    step: str           # float copy of the int64 step count
    params: str
    gradients: str
    states: dict[str, str]


class Optimizer(Block):
    """Base class: an update rule as a chain of transforms (transforms.py).

    Subclasses return their chain from :meth:`transforms`; a subclass may instead write the whole rule as one
    ``update(p, g, states, lr, step) -> (p, new_states)`` and list its states in a ``state_names`` class
    attribute (which overrides the property here).

    Args:
        max_norm: if set, gradients are scaled so that their global L2 norm is at most ``max_norm``.
    """

    def __init__(self, max_norm: float | None = None):
        super().__init__()
        self.max_norm = max_norm

    def config(self) -> dict:
        """Hyper-parameters recorded in the optimizer model's metadata."""
        return {k: v for k, v in vars(self).items() if not k.startswith("_")}

    def clipping(self) -> list[Transform]:
        """Global-norm clipping first, if ``max_norm`` is set."""
        return [] if self.max_norm is None else [ClipByGlobalNorm(self.max_norm)]

    @property
    def state_names(self) -> tuple[str, ...]:
        """The state vectors the chain carries from step to step, in the order the transforms declare them."""
        return Chain(self.transforms()).state_names

    def transforms(self) -> list[Transform]:
        """The chain of this update rule (by default: clipping, then ``update``)."""
        return [*self.clipping(), UpdateFunction(self.update)]

    def build(self, inputs: OptimizerInputs) -> tuple[str, dict[str, str]]:
        """Emit the update into the graph being built; returns (new parameters, new states by name)."""
        state = UpdateState(inputs.context.builder, inputs.learning_rate, inputs.step, inputs.params, inputs.gradients,
                            dict(inputs.states))
        with self._building_into(inputs.context):  # an update() written by hand emits through self.op
            return Chain(self.transforms()).build(state)

    def update(self, p: str, g: str, states: dict[str, str], lr: str, step: str) -> tuple[str, dict[str, str]]:
        raise NotImplementedError(f"{type(self).__name__} must implement transforms() or update()")


class AdamW(Optimizer):
    """Adam with decoupled weight decay (Loshchilov & Hutter, 2019).

    ``mode="hf"`` (default, as onnxruntime-training's AdamW): eps is added to sqrt(v) and the bias
    correction scales the step size, weight decay is applied after the update. ``mode="torch"``:
    torch.optim.AdamW (decay first, eps added to the bias-corrected sqrt(v)). The two are two chains.
    """

    def __init__(self, bias_correction: bool = True, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.0, max_norm: float | None = None, mode: str = "hf"):
        super().__init__(max_norm)
        if mode not in ("hf", "torch"):
            raise ValueError(f"AdamW mode must be 'hf' or 'torch', got {mode!r}")
        self.bias_correction, self.betas, self.eps = bias_correction, tuple(betas), eps
        self.weight_decay, self.mode = weight_decay, mode

    def transforms(self) -> list[Transform]:
        decay = [DecayWeights(self.weight_decay)] if self.weight_decay else []
        if self.mode == "hf":
            adam = ScaleByAdamPeer(self.betas, self.eps, self.bias_correction)
            return [*self.clipping(), adam, ScaleByLearningRate(), *decay]
        adam = ScaleByAdam(self.betas, self.eps, self.bias_correction)
        return [*self.clipping(), *decay, adam, ScaleByLearningRate()]


class Adam(AdamW):
    """Adam with L2 weight decay added to the gradient (torch.optim.Adam)."""

    def __init__(self, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
                 max_norm: float | None = None):
        super().__init__(True, betas, eps, 0.0, max_norm, mode="torch")
        self.l2 = weight_decay

    def transforms(self) -> list[Transform]:
        l2 = [AddL2(self.l2)] if self.l2 else []
        return [*self.clipping(), *l2, ScaleByAdam(self.betas, self.eps, self.bias_correction),
                ScaleByLearningRate()]


class SGD(Optimizer):
    """Stochastic gradient descent with optional momentum, dampening, Nesterov and weight decay (torch.optim.SGD)."""

    def __init__(self, momentum: float = 0.0, dampening: float = 0.0, nesterov: bool = False,
                 weight_decay: float = 0.0, max_norm: float | None = None):
        super().__init__(max_norm)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("SGD: Nesterov momentum requires momentum > 0 and dampening = 0")
        self.momentum, self.dampening, self.nesterov, self.weight_decay = momentum, dampening, nesterov, weight_decay

    def transforms(self) -> list[Transform]:
        l2 = [AddL2(self.weight_decay)] if self.weight_decay else []
        momentum = [TraceMomentum(self.momentum, self.dampening, self.nesterov)] if self.momentum else []
        return [*self.clipping(), *l2, *momentum, ScaleByLearningRate()]
