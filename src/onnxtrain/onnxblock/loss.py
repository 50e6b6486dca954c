"""``onnxblock.loss``: the peer's loss blocks (``target_name=`` / ``labels_name=``), built on onnxtrain's losses.

A loss declares its target (or labels) as a new graph input unless the model already has a value of that name.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from onnxtrain.blocks import losses as _losses
from onnxtrain.onnxblock.blocks import Block

_Weight = Sequence[float] | np.ndarray | None

__all__ = ["MSELoss", "L1Loss", "BCEWithLogitsLoss", "CrossEntropyLoss", "HuberLoss", "NLLLoss"]


class _WithTarget(Block):
    """The peer's call signature of regression losses: ``loss(loss_input_name, target_name="target")``."""

    def build(self, loss_input_name: str, target_name: str = "target") -> str:
        return super().build(loss_input_name, target_name)


class _WithLabels(Block):
    """The peer's call signature of classification losses: ``loss(scores, labels_name="labels")``."""

    def build(self, scores: str, labels_name: str = "labels") -> str:
        return super().build(scores, labels_name)


# Each constructor runs onnxblock's Block's, then the onnxtrain loss's with the peer's arguments.

class MSELoss(_WithTarget, _losses.MSELoss):
    """Mean squared error: ``MSELoss(reduction="mean")(loss_input_name, target_name="target")``."""

    def __init__(self, reduction: str = "mean"):
        Block.__init__(self)
        _losses.MSELoss.__init__(self, reduction)


class L1Loss(_WithTarget, _losses.L1Loss):
    """Mean absolute error: ``L1Loss(reduction="mean")(loss_input_name, target_name="target")``."""

    def __init__(self, reduction: str = "mean"):
        Block.__init__(self)
        _losses.L1Loss.__init__(self, reduction)


class HuberLoss(_WithTarget, _losses.HuberLoss):
    """Huber loss: ``HuberLoss(reduction="mean", delta=1.0)(loss_input_name, target_name="target")``."""

    def __init__(self, reduction: str = "mean", delta: float = 1.0):
        Block.__init__(self)
        _losses.HuberLoss.__init__(self, reduction, delta)


class BCEWithLogitsLoss(_WithTarget, _losses.BCEWithLogitsLoss):
    """Binary cross-entropy on logits: ``BCEWithLogitsLoss(weight, reduction, pos_weight)(loss_input_name,
    target_name="target")``."""

    def __init__(self, weight: _Weight = None, reduction: str = "mean", pos_weight: _Weight = None):
        Block.__init__(self)
        _losses.BCEWithLogitsLoss.__init__(self, weight, reduction, pos_weight)


class CrossEntropyLoss(_WithLabels, _losses.CrossEntropyLoss):
    """Softmax cross-entropy: ``CrossEntropyLoss(weight, reduction, ignore_index)(scores, labels_name="labels")``
    (``class_axis=-1``: the classes on the last axis, a language model's logits)."""

    def __init__(self, weight: _Weight = None, reduction: str = "mean", ignore_index: int | None = None,
                 class_axis: int = 1):
        Block.__init__(self)
        _losses.CrossEntropyLoss.__init__(self, weight, reduction, ignore_index, class_axis)


class NLLLoss(_WithLabels, _losses.NLLLoss):
    """Negative log-likelihood: ``NLLLoss(weight, reduction, ignore_index)(scores, labels_name="labels")``."""

    def __init__(self, weight: _Weight = None, reduction: str = "mean", ignore_index: int | None = None,
                 class_axis: int = 1):
        Block.__init__(self)
        _losses.NLLLoss.__init__(self, weight, reduction, ignore_index, class_axis)
