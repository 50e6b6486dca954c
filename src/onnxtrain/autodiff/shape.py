"""Gradients of ops that move data without arithmetic: reshapes, transposes, slicing, gathering."""

from __future__ import annotations

import numpy as np
import onnx

from onnxtrain.autodiff.context import GradContext
from onnxtrain.autodiff.registry import register, register_zero_gradient

register_zero_gradient(
    "Shape", "Size", "ConstantOfShape", "Range", "NonZero", "Equal", "Less", "LessOrEqual", "Greater",
    "GreaterOrEqual", "And", "Or", "Xor", "Not", "ArgMax", "ArgMin", "Floor", "Ceil", "Round", "Sign",
    "IsNaN", "IsInf", "EyeLike", "OneHot", "RandomNormal", "RandomUniform", "RandomNormalLike",
    "RandomUniformLike", "Bernoulli", "Multinomial", "Constant", "BitShift", "Mod",
)


def _reshape_back(ctx: GradContext):
    """Reshape, Flatten, Squeeze, Unsqueeze: dX is dY in the shape of X."""
    x = ctx.x[0]
    static = ctx.info(x).static_shape
    shape = ctx.b.ints(static) if static is not None else ctx.op.Shape(x)
    return (ctx.op.Reshape(ctx.dy[0], shape), *[None] * (len(ctx.x) - 1))


register("Reshape", "Flatten", "Squeeze", "Unsqueeze")(_reshape_back)


@register("Transpose")
def transpose(ctx: GradContext):
    perm = ctx.attr("perm") or list(reversed(range(ctx.rank(ctx.x[0]))))
    return (ctx.op.Transpose(ctx.dy[0], perm=[int(i) for i in np.argsort(perm)]),)


@register("Expand")
def expand(ctx: GradContext):
    return ctx.unbroadcast(ctx.dy[0], ctx.x[0]), None


def _axis_size(ctx: GradContext, x: str, axis: int) -> str:
    """Length of ``x`` along ``axis`` as a 1-D int64 tensor (a constant when the shape is static)."""
    shape = ctx.info(x).shape
    if shape is not None and isinstance(shape[axis], int):
        return ctx.b.ints([shape[axis]])
    return ctx.op.Shape(x, start=axis, end=axis + 1 if axis != -1 else None)


@register("Concat")
def concat(ctx: GradContext):
    axis = ctx.attr("axis")
    rank = ctx.rank(ctx.x[0])
    axis = axis % rank
    sizes = [_axis_size(ctx, x, axis) for x in ctx.x]
    split = ctx.op.Concat(*sizes, axis=0) if len(sizes) > 1 else sizes[0]
    parts = ctx.op.Split(ctx.dy[0], split, axis=axis, _outputs=len(ctx.x))
    parts = parts if isinstance(parts, list) else [parts]
    return [p if ctx.is_float(x) else None for p, x in zip(parts, ctx.x)]


@register("Split")
def split(ctx: GradContext):
    axis = ctx.attr("axis", 0)
    parts = [ctx.dy_or_zeros(i) for i in range(len(ctx.y))]
    return (ctx.op.Concat(*parts, axis=axis), None)


def _scatter_back(ctx: GradContext, positions: str) -> str:
    """dX for ops that pick distinct elements of X: add dY into zeros at the flat positions picked."""
    x = ctx.x[0]
    zeros = ctx.op.Reshape(ctx.b.zeros_like(x, ctx.elem_type(x)), ctx.b.ints([-1]))
    flat = ctx.op.ScatterElements(zeros, ctx.op.Reshape(positions, ctx.b.ints([-1])),
                                  ctx.op.Reshape(ctx.dy[0], ctx.b.ints([-1])), axis=0)
    return ctx.op.Reshape(flat, ctx.op.Shape(x))


def _flat_positions(ctx: GradContext, x: str) -> str:
    """An int64 tensor shaped like ``x`` holding each element's flat position."""
    n = ctx.op.Size(x)
    return ctx.op.Reshape(ctx.op.Range(ctx.b.const(np.int64(0)), n, ctx.b.const(np.int64(1))), ctx.op.Shape(x))


@register("Slice")
def slice_(ctx: GradContext):
    """Slice the flat positions of X the same way, then scatter dY there (any steps, negative, dynamic)."""
    positions = ctx.op.Slice(_flat_positions(ctx, ctx.x[0]), *ctx.x[1:])
    return (_scatter_back(ctx, positions), *[None] * (len(ctx.x) - 1))


@register("Gather")
def gather(ctx: GradContext):
    """Add each row of dY into the row of X it was gathered from (embeddings: rows repeat, so add)."""
    data, indices = ctx.x
    axis = ctx.attr("axis", 0) % ctx.rank(data)
    rank_i = ctx.rank(indices)
    rank_d = ctx.rank(data)
    dy = ctx.dy[0]
    # Bring the index axes of dY to the front: (indices..., data[:axis], data[axis+1:]).
    out_rank = rank_d - 1 + rank_i
    perm = [*range(axis, axis + rank_i), *range(axis), *range(axis + rank_i, out_rank)]
    if perm != list(range(out_rank)):
        dy = ctx.op.Transpose(dy, perm=perm)
    dim = _axis_size(ctx, data, axis)
    idx = ctx.op.Where(ctx.op.Less(indices, ctx.const_like(0, indices)),
                       ctx.op.Add(indices, ctx.op.Cast(ctx.b.squeeze(dim, [0]), to=ctx.elem_type(indices))), indices)
    idx = ctx.op.Cast(ctx.b.unsqueeze(idx, [-1]), to=onnx.TensorProto.INT64)
    data_perm = [axis, *range(axis), *range(axis + 1, rank_d)]
    zeros = ctx.b.zeros_like(data, ctx.elem_type(data))
    if axis:
        zeros = ctx.op.Transpose(zeros, perm=data_perm)
    d = ctx.op.ScatterND(zeros, idx, dy, reduction="add")
    if axis:
        d = ctx.op.Transpose(d, perm=[int(i) for i in np.argsort(data_perm)])
    return d, None


@register("GatherElements")
def gather_elements(ctx: GradContext):
    data, indices = ctx.x
    zeros = ctx.b.zeros_like(data, ctx.elem_type(data))
    return ctx.op.ScatterElements(zeros, indices, ctx.dy[0], axis=ctx.attr("axis", 0), reduction="add"), None
