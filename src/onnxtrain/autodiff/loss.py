"""Gradients of the loss ops of the default domain: SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss."""

from __future__ import annotations

import numpy as np

from onnxtrain.autodiff.context import GradContext
from onnxtrain.autodiff.registry import register
from onnxtrain.ir.types import np_dtype


def _weighted_onehot_grad(ctx: GradContext, scores: str, labels: str, weights: str | None) -> tuple[str, str]:
    """(onehot(labels) * per-sample weight * upstream gradient, per-sample weight), ignore_index masked out.

    onehot has the layout of ``scores`` (N, C, d1, ...); the weight is (N, d1, ...).
    """
    op, b = ctx.op, ctx.b
    dtype = ctx.elem_type(scores)
    ignore = ctx.attr("ignore_index")
    safe = labels
    keep = None
    if ignore is not None:
        keep = op.Not(op.Equal(labels, ctx.const_like(ignore, labels)))
        safe = op.Where(keep, labels, ctx.const_like(0, labels))
    depth = b.squeeze(op.Shape(scores, start=1, end=2), [0])
    onehot = op.OneHot(safe, depth, b.const(np.array([0, 1], dtype=np_dtype(dtype))), axis=1)
    if weights is not None:
        w = op.Gather(weights, safe)
    else:
        w = b.ones_like(labels, dtype)
    if keep is not None:
        w = op.Where(keep, w, ctx.const_like(0.0, scores))
    reduction = ctx.attr("reduction", "mean")
    g = ctx.dy[0]
    if reduction == "mean":
        g = op.Div(g, b.reduce("ReduceSum", w, None, keepdims=False))
    scale = op.Mul(w, g)                          # (N, d1, ...) or broadcast scalar
    return op.Mul(onehot, b.unsqueeze(scale, [1])), scale


@register("SoftmaxCrossEntropyLoss")
def softmax_cross_entropy_loss(ctx: GradContext):
    """dScores = softmax(scores) * w g - onehot * w g."""
    scores, labels = ctx.x[0], ctx.x[1]
    weights = ctx.x[2] if len(ctx.x) > 2 and ctx.x[2] else None
    log_prob = ctx.forward_output(1, "log_prob")
    target, scale = _weighted_onehot_grad(ctx, scores, labels, weights)
    probs = ctx.op.Exp(log_prob)
    return ctx.op.Sub(ctx.op.Mul(probs, ctx.b.unsqueeze(scale, [1])), target), None, None


@register("NegativeLogLikelihoodLoss")
def negative_log_likelihood_loss(ctx: GradContext):
    """dInput = -onehot * w g."""
    scores, labels = ctx.x[0], ctx.x[1]
    weights = ctx.x[2] if len(ctx.x) > 2 and ctx.x[2] else None
    target, _ = _weighted_onehot_grad(ctx, scores, labels, weights)
    return ctx.op.Neg(target), None, None
