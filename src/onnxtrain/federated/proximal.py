"""FedProx's local objective: the device's loss plus the proximal term ``mu/2 * ||w - w_global||^2``.

The term's gradient, ``mu * (w - w_global)``, is added to the accumulated gradients of the trainable parameters
before each optimizer step, so it works with any optimizer graph (SGD, AdamW, ...) and leaves the training
graph as generated. ``w_global`` is the global model the device received for the round. Plain numpy: no Flower.

References:
    Li et al., "Federated Optimization in Heterogeneous Networks" (MLSys 2020), arXiv:1812.06127.
"""

from __future__ import annotations

import math

import numpy as np

from onnxtrain.api import Module, Optimizer

__all__ = ["ProximalOptimizer", "check_mu"]


def check_mu(mu, what: str = "proximal-mu") -> float:
    """``mu`` as a float if it is a finite, non-negative number; else a ValueError naming ``what``."""
    if isinstance(mu, (bool, np.bool_)) or not isinstance(mu, (int, float, np.integer, np.floating)):
        raise ValueError(f"{what} must be a number (the FedProx proximal weight), got {type(mu).__name__} {mu!r}")
    if not (math.isfinite(mu) and mu >= 0):
        raise ValueError(f"{what} must be finite and non-negative (0 trains as FedAvg), got {mu!r}")
    return float(mu)


class ProximalOptimizer:
    """``optimizer.step()`` on the local loss plus ``mu/2 * ||w - w_global||^2``.

    Each :meth:`step` adds ``mu * (w - w_global)`` to the gradients that the training call(s) since the last
    ``lazy_reset_grad()`` accumulated, then runs ``optimizer.step()``; a loop that calls ``optimizer.step()``
    (``runtime.loop.train_epoch``) takes this object in its place.

    Args:
        module: the Module whose trainable parameters are pulled towards ``w_global``.
        optimizer: the Optimizer created on ``module``.
        mu: the proximal weight (finite, non-negative).
        w_global: the global trainable parameters, flat, in ``get_contiguous_parameters(trainable_only=True)``
            order; default: the module's parameters now (create it right after loading the global model).
    """

    def __init__(self, module: Module, optimizer: Optimizer, mu: float, w_global: np.ndarray | None = None):
        self.module, self.optimizer, self.mu = module, optimizer, check_mu(mu)
        current = self._parameters()
        if w_global is None:
            w_global = current
        w_global = np.asarray(w_global)
        if w_global.shape != current.shape or w_global.dtype != current.dtype:
            raise ValueError(f"w_global must be the {current.size} trainable parameters as one flat {current.dtype} "
                             f"array, got {w_global.dtype}{list(w_global.shape)}")
        self.w_global = w_global.copy()

    def _parameters(self) -> np.ndarray:
        return self.module.get_contiguous_parameters(trainable_only=True).numpy()

    def step(self) -> None:
        """Add the proximal term's gradient, then take the optimizer's step."""
        w = self._parameters()
        self.module.add_to_gradients(w.dtype.type(self.mu) * (w - self.w_global))
        self.optimizer.step()

    @property
    def skipped_steps(self) -> int:
        """The optimizer's skipped steps (non-finite loss or gradients)."""
        return self.optimizer.skipped_steps
