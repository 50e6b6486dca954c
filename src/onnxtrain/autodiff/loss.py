"""Gradients of the loss ops of the default domain: SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss.

With lp the log-probabilities (N, C, d1, ...), labels y and per-sample weights w_i = weight[y_i] (0 where
y_i = ignore_index), the per-sample loss is l_i = -lp[i, y_i] and
    none: L_i = w_i l_i,    sum: L = sum_i w_i l_i,    mean: L = sum_i w_i l_i / sum_i w_i.
So dlp = -onehot(y) c with c_i = dL/dl_i, and dweight[k] = sum over the samples of class k of dL/dw_i.
"""

from __future__ import annotations

import numpy as np

from onnxtrain.autodiff.context import GradContext
from onnxtrain.autodiff.registry import register
from onnxtrain.autodiff.shape import shape_of
from onnxtrain.ir.types import np_dtype


def _loss_grads(ctx: GradContext, scores: str, log_prob: str) -> tuple[str | None, str | None]:
    """(dlp, dweight): the gradient of the log-probabilities and of the class weights (None if absent)."""
    op, b = ctx.op, ctx.b
    labels = ctx.x[1]
    weights = ctx.x[2] if len(ctx.x) > 2 and ctx.x[2] else None
    if ctx.dy[0] is None:
        return None, None
    ignore = ctx.attr("ignore_index")
    safe, keep = labels, None
    if ignore is not None:
        keep = op.Not(op.Equal(labels, ctx.const_like(ignore, labels)))
        safe = op.Where(keep, labels, ctx.const_like(0, labels))
    depth = b.squeeze(shape_of(b, scores, 1, 2), [0])
    onehot = op.OneHot(safe, depth, b.const(np.array([0, 1], dtype=np_dtype(ctx.elem_type(scores)))), axis=1)
    w = op.Gather(weights, safe) if weights is not None else b.ones_like(labels, ctx.elem_type(scores))
    if keep is not None:
        w = op.Where(keep, w, ctx.const_like(0.0, scores))
    reduction = ctx.attr("reduction", "mean")
    g = ctx.dy[0]                                            # dL/dL_i (none) or dL/dL (sum, mean)
    if reduction == "mean":
        g = op.Div(g, b.reduce("ReduceSum", w, None, keepdims=False))
    coefficient = op.Mul(w, g)                               # c_i = dL/dl_i
    dlp = op.Neg(op.Mul(onehot, b.unsqueeze(coefficient, [1])))
    dweight = None
    if weights is not None:
        per_sample = op.Neg(b.reduce("ReduceSum", op.Mul(onehot, log_prob), [1], keepdims=False))   # l_i
        if reduction == "mean":
            per_sample = op.Sub(per_sample, ctx.y[0])      # d(sum w l / sum w)/dw_i = (l_i - L) / sum w
        dw = op.Mul(per_sample, g)
        if keep is not None:
            dw = op.Where(keep, dw, ctx.const_like(0.0, scores))
        # dweight[k] = sum of dw_i over the samples of class k: the one-hot already sorts them by class.
        samples = [0, *range(2, ctx.rank(scores))]
        dweight = b.reduce("ReduceSum", op.Mul(onehot, b.unsqueeze(dw, [1])), samples, keepdims=False)
    return dlp, dweight


@register("SoftmaxCrossEntropyLoss")
def softmax_cross_entropy_loss(ctx: GradContext):
    """lp = LogSoftmax(scores, axis=1):  dScores = dlp - softmax * sum_c dlp, which for the loss term is
    (softmax - onehot) c. The optional log_prob output adds its own gradient to dlp."""
    scores = ctx.x[0]
    log_prob = ctx.forward_output(1, "log_prob")
    plain = (ctx.attr("reduction", "mean") in ("mean", "sum") and ctx.attr("ignore_index") is None
             and not (len(ctx.x) > 2 and ctx.x[2]) and not (len(ctx.dy) > 1 and ctx.dy[1] is not None))
    if plain and ctx.dy[0] is not None:
        return _plain_softmax_cross_entropy_grad(ctx, scores, log_prob), None, None
    dlp, dweight = _loss_grads(ctx, scores, log_prob)
    if len(ctx.dy) > 1 and ctx.dy[1] is not None:
        dlp = ctx.dy[1] if dlp is None else ctx.op.Add(dlp, ctx.dy[1])
    s = ctx.b.reduce("ReduceSum", dlp, [1], keepdims=True)
    return ctx.op.Sub(dlp, ctx.op.Mul(ctx.op.Exp(log_prob), s)), None, dweight


def _plain_softmax_cross_entropy_grad(ctx: GradContext, scores: str, log_prob: str) -> str:
    """No weights, no ignore_index, mean or sum: dScores = (softmax - onehot(y)) dL, divided by the number of
    labels for the mean. 7 small nodes instead of 15; on a small MLP each node costs as much as its data."""
    op, b = ctx.op, ctx.b
    labels, dtype = ctx.x[1], ctx.elem_type(scores)
    classes = (ctx.shape(scores) or [None, None])[1]
    depth = (b.const(np.array(classes, dtype=np.int64)) if isinstance(classes, int)
             else b.squeeze(shape_of(b, scores, 1, 2), [0]))
    onehot = op.OneHot(labels, depth, b.const(np.array([0, 1], dtype=np_dtype(dtype))), axis=1)
    g = ctx.dy[0]
    if ctx.attr("reduction", "mean") == "mean":
        g = op.Div(g, op.Cast(op.Size(labels), to=dtype))
    return op.Mul(op.Sub(op.Exp(log_prob), onehot), g)


@register("NegativeLogLikelihoodLoss")
def negative_log_likelihood_loss(ctx: GradContext):
    """The input holds the log-probabilities: dInput = dlp = -onehot(y) c."""
    dlp, dweight = _loss_grads(ctx, ctx.x[0], ctx.x[0])
    return dlp, None, dweight
