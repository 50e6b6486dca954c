"""Gradients of matrix products: MatMul (batched, broadcast, 1-D operands) and Gemm; and of Det."""

from __future__ import annotations

import numpy as np
import onnx

from onnxtrain.autodiff.context import GradContext
from onnxtrain.autodiff.registry import register
from onnxtrain.autodiff.shape import shape_of


def _swap_last_two(ctx: GradContext, x: str, rank: int) -> str:
    return ctx.op.Transpose(x, perm=[*range(rank - 2), rank - 1, rank - 2])


@register("MatMul")
def matmul(ctx: GradContext):
    """Y = A @ B:  dA = dY @ B^T,  dB = A^T @ dY, each summed over the batch axes it was broadcast along."""
    (a, b), dy = ctx.x, ctx.dy[0]
    ra, rb = ctx.rank(a), ctx.rank(b)
    out_info = ctx.infos.get(ctx.y[0])
    out = out_info.shape if out_info is not None else None
    if ra == 1 or rb == 1:
        return _matmul_vector(ctx, a, b, dy, ra, rb)
    r = max(ra, rb)
    if ra == r and rb == 2 and r > 2:
        # A (..., m, k) @ W (k, n): fold the batch into rows so that dW is one large GEMM.
        db = ctx.op.Gemm(_rows(ctx, a, ctx.shape(b)[0]), _rows(ctx, dy, ctx.shape(b)[1]), transA=1)
        da = ctx.op.MatMul(dy, ctx.op.Transpose(b, perm=[1, 0]))
        return da, db
    da = ctx.op.MatMul(dy, _swap_last_two(ctx, b, rb))
    db = ctx.op.MatMul(_swap_last_two(ctx, a, ra), dy)
    if out is not None:
        da = ctx.unbroadcast(da, a, grad_shape=(*out[:-2], *ctx.shape(a)[-2:]))
        db = ctx.unbroadcast(db, b, grad_shape=(*out[:-2], *ctx.shape(b)[-2:]))
    else:   # the output shape is unknown: unbroadcast compares the shapes at run time
        da, db = ctx.unbroadcast(da, a), ctx.unbroadcast(db, b)
    return da, db


def _rows(ctx: GradContext, x: str, c) -> str:
    """Reshape (..., c) to (-1, c)."""
    if isinstance(c, int):
        return ctx.op.Reshape(x, ctx.b.ints([-1, c]))
    last = shape_of(ctx.b, x, -1)
    return ctx.op.Reshape(x, ctx.op.Concat(ctx.b.ints([-1]), last, axis=0))


def _matmul_vector(ctx: GradContext, a: str, b: str, dy: str, ra: int, rb: int):
    """MatMul with a 1-D operand: promote it to a matrix, differentiate, then drop the added axis."""
    if ra == 1 and rb == 1:                     # the dot product a . b
        return ctx.op.Mul(dy, b), ctx.op.Mul(dy, a)
    a2 = ctx.b.unsqueeze(a, [0]) if ra == 1 else a
    b2 = ctx.b.unsqueeze(b, [1]) if rb == 1 else b
    dy2 = ctx.b.unsqueeze(dy, [-2]) if ra == 1 else dy
    dy2 = ctx.b.unsqueeze(dy2, [-1]) if rb == 1 else dy2
    ra2, rb2 = max(ra, 2), max(rb, 2)
    r = max(ra2, rb2)
    da = _sum_leading(ctx, ctx.op.MatMul(dy2, _swap_last_two(ctx, b2, rb2)), r - ra2)
    db = _sum_leading(ctx, ctx.op.MatMul(_swap_last_two(ctx, a2, ra2), dy2), r - rb2)
    da = ctx.b.squeeze(da, [0]) if ra == 1 else da
    db = ctx.b.squeeze(db, [1]) if rb == 1 else db
    return da, db


def _sum_leading(ctx: GradContext, g: str, count: int) -> str:
    """Sum the first ``count`` (broadcast batch) axes of ``g`` away."""
    return ctx.b.reduce("ReduceSum", g, list(range(count)), keepdims=False) if count else g


@register("Gemm")
def gemm(ctx: GradContext):
    """Y = alpha A' B' + beta C with A' = A^T if transA, B' = B^T if transB."""
    a, b = ctx.x[0], ctx.x[1]
    c = ctx.x[2] if len(ctx.x) > 2 and ctx.x[2] else None
    dy = ctx.dy[0]
    alpha, beta = ctx.attr("alpha", 1.0), ctx.attr("beta", 1.0)
    ta, tb = ctx.attr("transA", 0), ctx.attr("transB", 0)
    al = None if alpha == 1.0 else alpha

    # dA' = alpha dY B'^T and dB' = alpha A'^T dY, transposed back where A or B was transposed.
    if not ta:
        da = ctx.op.Gemm(dy, b, transB=0 if tb else 1, alpha=al)
    else:
        da = ctx.op.Gemm(b, dy, transA=1 if tb else 0, transB=1, alpha=al)
    if not tb:
        db = ctx.op.Gemm(a, dy, transA=0 if ta else 1, alpha=al)
    else:
        db = ctx.op.Gemm(dy, a, transA=1, transB=1 if ta else 0, alpha=al)
    dc = None
    if c is not None:
        dc = ctx.unbroadcast(dy, c)
        if beta != 1.0:
            dc = ctx.op.Mul(dc, ctx.const_like(beta, c))
    return da, db, dc


@register("Det")
def det(ctx: GradContext):
    """y = det(X):  dX = dY cof(X), with the cofactors cof_ij = (-1)^(i+j) det(X without row i and column j).

    That is dY det(X) inverse(X)^T where X is invertible, but needs no inverse (ONNX has none) and holds for
    singular X too. The minors come from two Gathers with the indices 0..n-1 without i, built at run time.
    """
    x, dy, op = ctx.x[0], ctx.dy[0], ctx.op
    rank = ctx.rank(x)
    zero, one = ctx.b.const(np.asarray(0, np.int64)), ctx.b.const(np.asarray(1, np.int64))
    n = op.Reshape(op.Slice(op.Shape(x), ctx.b.ints([-1]), ctx.b.ints([rank])), ctx.b.ints([]))
    i = ctx.b.unsqueeze(op.Range(zero, n, one), [1])                               # (n, 1)
    k = ctx.b.unsqueeze(op.Range(zero, op.Sub(n, one), one), [0])                  # (1, n-1)
    without = op.Add(k, op.Cast(op.Not(op.Less(k, i)), to=onnx.TensorProto.INT64))  # row i: 0..n-1 but i
    rows = op.Gather(x, without, axis=rank - 2)                                    # (..., i, n-1, n)
    minors = op.Gather(rows, without, axis=rank)                                   # (..., i, n-1, j, n-1)
    minors = op.Transpose(minors, perm=[*range(rank - 2), rank - 2, rank, rank - 1, rank + 1])
    parity = op.Mod(op.Add(i, op.Transpose(i, perm=[1, 0])), ctx.b.const(np.asarray(2, np.int64)))
    sign = op.Sub(ctx.const_like(1.0, x), op.Mul(ctx.const_like(2.0, x), op.Cast(parity, to=ctx.elem_type(x))))
    cofactors = op.Mul(op.Det(minors), sign)
    return (op.Mul(cofactors, ctx.b.unsqueeze(dy, [-2, -1])),)
