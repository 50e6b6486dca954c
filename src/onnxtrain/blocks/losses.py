"""Loss blocks with ``reduction`` "mean" (default), "sum" or "none", as torch defines them.

Each loss declares its label input (``target`` or ``labels``) as a new graph input unless the graph
already has a value of that name.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import onnx

from onnxtrain.blocks.base import Block, BuildContext
from onnxtrain.blocks.ops import reduce
from onnxtrain.ir.types import np_dtype

logger = logging.getLogger(__name__)

__all__ = ["MSELoss", "L1Loss", "HuberLoss", "BCEWithLogitsLoss", "CrossEntropyLoss", "NLLLoss"]


def _target_like(ctx: BuildContext, output: str, target: str) -> str:
    """Declare ``target`` as an input with the type and shape of ``output``."""
    info = ctx.info(output)
    return ctx.require_input(target, info.elem_type, info.shape)


def _class_labels(ctx: BuildContext, output: str, labels: str, axis: int = 1) -> str:
    """Declare ``labels``: int64 class indices shaped like ``output`` without its class axis."""
    shape = ctx.info(output).shape
    label_shape = None if shape is None else [d for i, d in enumerate(shape) if i != axis]
    return ctx.require_input(labels, onnx.TensorProto.INT64, label_shape)


class _Loss(Block):
    def __init__(self, reduction: str = "mean"):
        super().__init__()
        if reduction not in ("mean", "sum", "none"):
            raise ValueError(f"{type(self).__name__}: unknown reduction {reduction!r}; "
                             "expected 'mean', 'sum' or 'none'")
        self.reduction = reduction

    @property
    def batch_reduction(self) -> str:
        return self.reduction if self.reduction in ("mean", "sum") else ""


class MSELoss(_Loss):
    """(output - target)^2."""

    def build(self, output: str, target: str = "target") -> str:
        diff = self.op.Sub(output, _target_like(self.context, output, target))
        return reduce(self.op.Mul(diff, diff), self.reduction)


class L1Loss(_Loss):
    """|output - target|."""

    def build(self, output: str, target: str = "target") -> str:
        return reduce(self.op.Abs(self.op.Sub(output, _target_like(self.context, output, target))), self.reduction)


class HuberLoss(_Loss):
    """0.5 d^2 where |d| < delta, else delta (|d| - 0.5 delta); d = output - target (torch's HuberLoss)."""

    def __init__(self, reduction: str = "mean", delta: float = 1.0):
        super().__init__(reduction)
        self.delta = delta

    def build(self, output: str, target: str = "target") -> str:
        op, b = self.op, self.builder
        dtype = np_dtype(self.context.info(output).elem_type)
        d = op.Abs(op.Sub(output, _target_like(self.context, output, target)))
        small = op.Mul(b.const(np.asarray(0.5, dtype)), op.Mul(d, d))
        large = op.Mul(b.const(np.asarray(self.delta, dtype)), op.Sub(d, b.const(np.asarray(0.5 * self.delta, dtype))))
        return reduce(op.Where(op.Less(d, b.const(np.asarray(self.delta, dtype))), small, large), self.reduction)


class BCEWithLogitsLoss(_Loss):
    """Binary cross-entropy on logits, computed stably as (1 - t) x + (1 + (pw - 1) t) softplus(-x)."""

    def __init__(self, weight: Sequence[float] | np.ndarray | None = None, reduction: str = "mean",
                 pos_weight: Sequence[float] | np.ndarray | None = None):
        super().__init__(reduction)
        self.weight = None if weight is None else np.asarray(weight)
        self.pos_weight = None if pos_weight is None else np.asarray(pos_weight)

    def build(self, output: str, target: str = "target") -> str:
        op, b = self.op, self.builder
        dtype = np_dtype(self.context.info(output).elem_type)
        t = _target_like(self.context, output, target)
        one = b.const(np.asarray(1.0, dtype))
        # softplus(-x) = max(-x, 0) + log(1 + exp(-|x|)), exact and without overflow.
        softplus_neg = op.Add(op.Relu(op.Neg(output)), op.Log(op.Add(one, op.Exp(op.Neg(op.Abs(output))))))
        coeff = one
        if self.pos_weight is not None:
            coeff = op.Add(one, op.Mul(b.const((self.pos_weight - 1).astype(dtype)), t))
        loss = op.Add(op.Mul(op.Sub(one, t), output), op.Mul(coeff, softplus_neg))
        if self.weight is not None:
            loss = op.Mul(loss, b.const(self.weight.astype(dtype)))
        return reduce(loss, self.reduction)


class _ClassIndexLoss(_Loss):
    """A loss over class scores with class-index labels, optional class weights and ignore_index.

    The classes are on axis 1, as in torch's ``cross_entropy`` and ONNX's loss ops: scores (N, C, d1, ...) and
    labels (N, d1, ...). ``class_axis=-1`` reads them on the last axis instead, a language model's (batch,
    sequence, vocabulary) logits with (batch, sequence) labels (the scores are transposed for the ONNX op).
    """

    op_type = ""

    def __init__(self, weight: Sequence[float] | np.ndarray | None = None, reduction: str = "mean",
                 ignore_index: int | None = None, class_axis: int = 1):
        super().__init__(reduction)
        self.weight = None if weight is None else np.asarray(weight)
        self.ignore_index = ignore_index
        self.class_axis = class_axis

    def build(self, scores: str, labels: str = "labels") -> str:
        info = self.context.info(scores)
        rank = info.rank
        axis = self.class_axis
        if axis != 1:
            if rank is None:
                raise ValueError(f"{type(self).__name__}(class_axis={axis}): the rank of {scores!r} is unknown")
            if not -rank <= axis < rank or axis % rank == 0:
                raise ValueError(f"{type(self).__name__}(class_axis={axis}): {scores!r} has rank {rank}; the class "
                                 "axis must be one of its axes after the batch axis 0")
            axis %= rank
        elif rank is not None and rank >= 3 and info.shape is not None and isinstance(info.shape[-1], int) and (
                not isinstance(info.shape[1], int) or (rank == 3 and info.shape[-1] > info.shape[1])):
            # (batch, sequence, vocabulary) logits exported with a fixed sequence length look like (N, C, T) too
            logger.warning("%s reads the classes on axis 1 of %r, shaped %s: that axis has a run-time size or is "
                           "shorter than the last; if the classes are on the last axis (a language model's (batch, "
                           "sequence, vocabulary) logits), use blocks.%s(class_axis=-1)", type(self).__name__,
                           str(scores), tuple(info.shape), type(self).__name__)
        label = _class_labels(self.context, scores, labels, axis)
        if axis != 1:
            scores = self.op.Transpose(scores, perm=[0, axis, *(i for i in range(1, rank) if i != axis)])
        dtype = np_dtype(info.elem_type)
        weight = None if self.weight is None else self.builder.const(self.weight.astype(dtype), name="class_weights")
        return getattr(self.op, self.op_type)(scores, label, weight, reduction=self.reduction,
                                              ignore_index=self.ignore_index)


class CrossEntropyLoss(_ClassIndexLoss):
    """Softmax cross-entropy of logits (SoftmaxCrossEntropyLoss)."""

    op_type = "SoftmaxCrossEntropyLoss"


class NLLLoss(_ClassIndexLoss):
    """Negative log-likelihood of log-probabilities (NegativeLogLikelihoodLoss)."""

    op_type = "NegativeLogLikelihoodLoss"
