"""``onnxblock.loss``: the peer's loss blocks (``target_name=`` / ``labels_name=``), built on onnxtrain's losses.

A loss declares its target (or labels) as a new graph input unless the model already has a value of that name.
"""

from __future__ import annotations

from onnxtrain.blocks import losses as _losses
from onnxtrain.onnxblock.blocks import Block

__all__ = ["MSELoss", "L1Loss", "BCEWithLogitsLoss", "CrossEntropyLoss", "HuberLoss", "NLLLoss"]


class _WithTarget(Block):
    """The peer's call signature of regression losses: ``loss(loss_input_name, target_name="target")``."""

    def build(self, loss_input_name: str, target_name: str = "target") -> str:
        return super().build(loss_input_name, target_name)


class _WithLabels(Block):
    """The peer's call signature of classification losses: ``loss(scores, labels_name="labels")``."""

    def build(self, scores: str, labels_name: str = "labels") -> str:
        return super().build(scores, labels_name)


class MSELoss(_WithTarget, _losses.MSELoss):
    """Mean squared error: ``MSELoss(reduction="mean")(loss_input_name, target_name="target")``."""


class L1Loss(_WithTarget, _losses.L1Loss):
    """Mean absolute error: ``L1Loss(reduction="mean")(loss_input_name, target_name="target")``."""


class HuberLoss(_WithTarget, _losses.HuberLoss):
    """Huber loss: ``HuberLoss(reduction="mean", delta=1.0)(loss_input_name, target_name="target")``."""


class BCEWithLogitsLoss(_WithTarget, _losses.BCEWithLogitsLoss):
    """Binary cross-entropy on logits: ``BCEWithLogitsLoss(weight, reduction, pos_weight)(loss_input_name,
    target_name="target")``."""


class CrossEntropyLoss(_WithLabels, _losses.CrossEntropyLoss):
    """Softmax cross-entropy: ``CrossEntropyLoss(weight, reduction, ignore_index)(scores, labels_name="labels")``."""


class NLLLoss(_WithLabels, _losses.NLLLoss):
    """Negative log-likelihood: ``NLLLoss(weight, reduction, ignore_index)(scores, labels_name="labels")``."""
