"""Optimizer: runs the optimizer graph over the Module's flat parameters (onnxruntime.training.api.Optimizer)."""

from __future__ import annotations

import math
import warnings

import numpy as np

from onnxtrain.runtime.loading import load_model
from onnxtrain.runtime.module import Module

__all__ = ["Optimizer"]

_ONNXBLOCK_RULE = "onnxtrain.onnxblock_optimizer"  # onnxtrain.onnxblock.optim.RULE_KEY, without importing it


def _from_onnxblock(model, run):
    """An onnxblock.optim model (sequences in, sequences out) as the same rule over the Module's flat vectors, in
    the training model's opset (the runtime fuses the two graphs only when they share it)."""
    from onnxtrain.ir.passes import default_opset
    from onnxtrain.onnxblock.optim import flat_optimizer_model

    values = run.values
    zero = np.zeros((), values.params.dtype)  # only shapes and dtype matter (values may be nominal)
    return flat_optimizer_model(model, {n: np.broadcast_to(zero, s) for n, s in values.params.layout},
                                default_opset(run.train_model))


class Optimizer:
    """Updates the trainable parameters of ``module`` from their accumulated gradients.

    A step after a non-finite loss or with non-finite gradients is skipped (parameters and optimizer
    state stay as they were) and counted in ``skipped_steps``.

    Args:
        optimizer_uri: the optimizer model written by generate_artifacts (a path or bytes).
        module: the Module whose trainable parameters it updates.
        update_in_backward: not in the peer's API, for models that do not fit in memory otherwise. Every
            training call ``module(...)`` then updates the parameters itself, each as soon as the backward has
            its gradient, so no gradient vector is held (one copy of the parameters less: docs/memory.md).
            ``step()`` only reports a skipped update; gradients are not accumulated over several calls (every
            call starts afresh, as after ``lazy_reset_grad()``), and a chunk of parameters whose gradient is not
            finite keeps its values while the others are updated (a NaN loss updates nothing). On onnxruntime
            only; ArtifactError if the optimizer graph cannot be split into elementwise chunks (global-norm
            clipping).

    Attributes:
        state_names: the optimizer's state vectors (``("exp_avg", "exp_avg_sq")`` for AdamW).
        config: the optimizer's hyper-parameters, as generated.
        skipped_steps: steps skipped because the loss or the gradients were not finite.
    """

    def __init__(self, optimizer_uri, module: Module, update_in_backward: bool = False):
        if not isinstance(module, Module):
            raise TypeError(f"module must be an onnxtrain Module, got {type(module).__name__}")
        model = load_model(optimizer_uri, "optimizer model")
        self._run = module.training_run
        if any(p.key == _ONNXBLOCK_RULE for p in model.metadata_props):
            model = _from_onnxblock(model, self._run)
        self._update = self._run.attach_optimizer(model, in_backward=bool(update_in_backward))
        self.state_names = tuple(self._update.meta.states)
        self.config = self._update.meta.config
        self.skipped_steps = 0

    def set_learning_rate(self, learning_rate: float) -> None:
        """The learning rate of the next steps: a finite, non-negative number (a NaN or infinite one would turn
        every trained parameter into NaN at the next step, with finite gradients)."""
        try:
            value = float(learning_rate)  # a Python or numpy number, or a 0-d array, as the peer's binding takes
        except (TypeError, ValueError):
            value = None
        if value is None or isinstance(learning_rate, (str, bytes, bool, np.bool_)):
            raise TypeError(f"the learning rate must be a number, got {type(learning_rate).__name__} "
                            f"{learning_rate!r}")
        dtype = self._update.learning_rate.dtype
        if not math.isfinite(value) or abs(value) > float(np.finfo(dtype).max):  # no cast: no overflow warning
            raise ValueError(f"the learning rate must be finite in {dtype} (at most {np.finfo(dtype).max:.4g}), got "
                             f"{learning_rate}: the parameters would all become NaN or infinite at the next step")
        if value < 0:
            raise ValueError(f"the learning rate must not be negative, got {learning_rate} (as torch.optim: a "
                             "negative rate climbs the loss)")
        self._update.learning_rate[...] = value

    def get_learning_rate(self) -> float:
        """The learning rate of the next step."""
        return float(self._update.learning_rate)

    def step(self) -> None:
        """One update of every trainable parameter (skipped, with a warning, if the gradients are not finite).
        With ``update_in_backward``, the training calls did the update: this warns if the last one skipped it."""
        self._run.values.require_loaded()
        if not self._run.training_calls_since_step and not self._update.in_backward:
            warnings.warn("Optimizer.step() with no training call since the last step (or since loading): the update "
                          "applies the gradients held (zeros after loading, else the last training calls' again) and "
                          "counts a step, as onnxruntime-training's does; call module(inputs..., labels...) in "
                          "training mode before each step", RuntimeWarning, stacklevel=2)
        reason = self._run.optimizer_step(self._update)
        if reason is not None:
            self.skipped_steps += 1
            warnings.warn(f"optimizer step skipped: {reason}", RuntimeWarning, stacklevel=2)
