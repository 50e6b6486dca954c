"""Gradients of ops that move data without arithmetic: reshapes, transposes, slicing, gathering."""

from __future__ import annotations

import numpy as np
import onnx

from onnxtrain.autodiff.context import GradContext
from onnxtrain.autodiff.registry import register, register_zero_gradient
from onnxtrain.errors import UnsupportedOpError
from onnxtrain.ir.torch_records import embedding_padding_index, embedding_scales_by_frequency
from onnxtrain.ir.types import np_dtype

register_zero_gradient(
    "Shape", "Size", "ConstantOfShape", "NonZero", "Equal", "Less", "LessOrEqual", "Greater",
    "GreaterOrEqual", "And", "Or", "Xor", "Not", "ArgMax", "ArgMin", "Floor", "Ceil", "Round", "Sign",
    "IsNaN", "IsInf", "EyeLike", "RandomNormal", "RandomUniform", "RandomNormalLike",
    "RandomUniformLike", "Bernoulli", "Multinomial", "Constant", "BitShift",
)


@register("OneHot")
def one_hot(ctx: GradContext):
    """y = on_value where the index hits, off_value elsewhere (values = [off_value, on_value])."""
    values = ctx.x[2]
    if not ctx.is_float(values):
        return None, None, None
    dy, op = ctx.dy[0], ctx.op
    hit = op.OneHot(ctx.x[0], ctx.x[1], ctx.b.const(np.array([0, 1], dtype=np_dtype(ctx.elem_type(values)))),
                    axis=ctx.attr("axis", -1))
    on = ctx.b.reduce("ReduceSum", op.Mul(dy, hit), None, keepdims=False)
    total = ctx.b.reduce("ReduceSum", dy, None, keepdims=False)
    return None, None, op.Concat(ctx.b.unsqueeze(op.Sub(total, on), [0]), ctx.b.unsqueeze(on, [0]), axis=0)


@register("Range")
def range_(ctx: GradContext):
    """y_k = start + k delta (float ranges):  dstart = sum dy, ddelta = sum k dy; the limit only sets the length."""
    start = ctx.x[0]
    if not ctx.is_float(start):
        return None, None, None
    dy = ctx.dy[0]
    k = ctx.op.Cast(ctx.op.Range(ctx.b.const(np.int64(0)), ctx.op.Size(dy), ctx.b.const(np.int64(1))),
                    to=ctx.elem_type(start))
    return (ctx.b.reduce("ReduceSum", dy, None, keepdims=False), None,
            ctx.b.reduce("ReduceSum", ctx.op.Mul(dy, k), None, keepdims=False))


def _reshape_back(ctx: GradContext):
    """Reshape, Flatten, Squeeze, Unsqueeze: dX is dY in the shape of X."""
    x = ctx.x[0]
    static = ctx.info(x).static_shape
    if static is not None and 0 in static:     # an empty tensor (a 0 in a Reshape shape would copy a dim)
        return (ctx.b.zeros_like(x, ctx.elem_type(x)), *[None] * (len(ctx.x) - 1))
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


def shape_of(b, x: str, start: int = 0, end: int | None = None) -> str:
    """Shape(x)[start:end] as a 1-D int64 tensor (Shape's start and end attributes exist from opset 15).

    ``b`` is a GraphBuilder.
    """
    if b.opset >= 15:
        return b.op.Shape(x, start=start or None, end=end)
    if not start and end is None:
        return b.op.Shape(x)
    return b.op.Slice(b.op.Shape(x), b.ints([start]), b.ints([end if end is not None else np.iinfo(np.int64).max]))


def identity_along(ctx: GradContext, x: str, a: int, b: int) -> tuple[str, list[int] | str]:
    """The identity matrix of axis ``a``'s length n (axes ``a`` and ``b`` of ``x`` have that length), shaped
    with n at axes a and b and 1 elsewhere, in x's element type; and that shape (a list when n is static,
    else a run-time int64 vector)."""
    rank, n = ctx.rank(x), ctx.shape(x)[a]
    if isinstance(n, int):
        shape = [1] * rank
        shape[a], shape[b] = n, n
        return ctx.b.const(np.eye(n, dtype=np_dtype(ctx.elem_type(x))).reshape(shape)), shape
    op = ctx.op
    length = shape_of(ctx.b, x, a, a + 1)                                        # [n]
    square = ctx.b.full(op.Concat(length, length, axis=0), 0, ctx.elem_type(x))
    shape = op.Concat(*[length if i in (a, b) else ctx.b.ints([1]) for i in range(rank)], axis=0)
    return op.Reshape(op.EyeLike(square), shape), shape


def scatter_add(ctx: GradContext, data: str, indices: str, updates: str, axis: int = 0) -> str:
    """ScatterElements with reduction="add": the transpose of a gather with repeats."""
    _check_scatter_add_opset(ctx, "ScatterElements")
    return ctx.op.ScatterElements(data, indices, updates, axis=axis, reduction="add")


def scatter_nd_add(ctx: GradContext, data: str, indices: str, updates: str, rank: int, depth: int | None) -> str:
    """What ScatterND(data, indices, updates, reduction="add") computes, written with ScatterElements; ``rank``
    is data's rank, ``depth`` the last dimension of ``indices`` (None: known at run time only).

    onnxruntime's ScatterND adds its slices on several threads with no care for repeated indices: two threads
    adding into the same row lose one of the additions (an embedding looked up by every token, as BERT's token
    types, lost up to half of its gradient at 2 threads, differently on every run; every onnxruntime version
    tried). Its ScatterElements adds repeated indices correctly at any thread count. With one index per slice
    (depth 1, an embedding lookup) the slices are rows of ``data``, which keeps its shape (the runtime then
    scatters straight into the gradient buffer, runtime/passes/scatter_gradient.py); otherwise every element is
    scattered at its flat position.
    """
    _check_scatter_add_opset(ctx, "ScatterElements")
    op, b = ctx.op, ctx.b
    if depth == 1:
        rows = op.Reshape(indices, b.ints([-1]))
        if rank == 1:
            return op.ScatterElements(data, rows, op.Reshape(updates, b.ints([-1])), axis=0, reduction="add")
        # a slice's shape from the updates (their last rank - 1 axes), not from data: the data is often a tensor
        # of zeros that the runtime replaces by the gradient buffer, and reading its shape would keep it
        per_row = op.Reshape(updates, op.Concat(b.ints([-1]), shape_of(b, updates, 1 - rank), axis=0))
        index = op.Expand(op.Reshape(rows, b.ints([-1] + [1] * (rank - 1))), op.Shape(per_row))
        return op.ScatterElements(data, index, per_row, axis=0, reduction="add")
    # the flat position of each indexed slice's first element, then of each of its elements
    data_shape = op.Shape(data)
    k = shape_of(b, indices, -1)
    lead = op.Slice(data_shape, b.ints([0]), k)
    slice_size = b.reduce("ReduceProd", op.Slice(data_shape, k, b.ints([np.iinfo(np.int64).max])), [0])
    one = b.const(np.int64(1))
    positions = op.Reshape(op.Range(b.const(np.int64(0)), b.reduce("ReduceProd", lead, [0], keepdims=False), one),
                           lead)
    first = op.Mul(op.Reshape(op.GatherND(positions, indices), b.ints([-1, 1])), slice_size)
    offsets = b.unsqueeze(op.Range(b.const(np.int64(0)), b.squeeze(slice_size, [0]), one), [0])
    flat = op.ScatterElements(op.Reshape(data, b.ints([-1])), op.Reshape(op.Add(first, offsets), b.ints([-1])),
                              op.Reshape(updates, b.ints([-1])), axis=0, reduction="add")
    return op.Reshape(flat, data_shape)


def _check_scatter_add_opset(ctx: GradContext, op_type: str) -> None:
    """The reduction attribute exists from opset 16; older models must be converted first."""
    if ctx.b.opset < 16:
        raise UnsupportedOpError(
            f"{ctx.node.op_type} node {ctx.node.name!r}: its gradient adds into repeated positions with "
            f"{op_type}(reduction='add'), which needs opset 16 and the model is at opset {ctx.b.opset}. - help: "
            f"convert the model first: onnx.version_converter.convert_version(model, 17)")


def _axis_size(ctx: GradContext, x: str, axis: int) -> str:
    """Length of ``x`` along ``axis`` as a 1-D int64 tensor (a constant when the shape is static)."""
    shape = ctx.info(x).shape
    if shape is not None and isinstance(shape[axis], int):
        return ctx.b.ints([shape[axis]])
    return shape_of(ctx.b, x, axis, axis + 1 if axis != -1 else None)


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
    """Add each row of dY into the row of X it was gathered from (embeddings: rows repeat, so add); none into
    the padding row of a torch Embedding whose export records one (ir/torch_records.py)."""
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

    def per_lookup(v: str) -> str:   # a value per index, against dY's rows
        return ctx.b.unsqueeze(v, list(range(rank_i, out_rank))) if out_rank > rank_i else v

    padding = embedding_padding_index(ctx.node) if axis == 0 else None
    if padding is not None:   # torch's Embedding(padding_idx=p): row p gets no gradient from this lookup
        hit = ctx.op.Equal(indices, ctx.const_like(padding, indices))
        dy = ctx.op.Where(per_lookup(hit), ctx.const_like(0.0, data), dy)
    dim = _axis_size(ctx, data, axis)
    idx = ctx.op.Where(ctx.op.Less(indices, ctx.const_like(0, indices)),
                       ctx.op.Add(indices, ctx.op.Cast(ctx.b.squeeze(dim, [0]), to=ctx.elem_type(indices))), indices)
    idx = ctx.op.Cast(ctx.b.unsqueeze(idx, [-1]), to=onnx.TensorProto.INT64)
    if axis == 0 and embedding_scales_by_frequency(ctx.node):
        # torch's Embedding(scale_grad_by_freq=True): each lookup's dY divided by its index's count in the batch
        counts = scatter_nd_add(ctx, ctx.b.full(dim, 0, ctx.elem_type(data)), idx,
                                ctx.b.ones_like(indices, ctx.elem_type(data)), rank=1, depth=1)
        dy = ctx.op.Div(dy, per_lookup(ctx.op.Gather(counts, ctx.b.squeeze(idx, [-1]))))
    data_perm = [axis, *range(axis), *range(axis + 1, rank_d)]
    zeros = ctx.b.zeros_like(data, ctx.elem_type(data))
    if axis:
        zeros = ctx.op.Transpose(zeros, perm=data_perm)
    d = scatter_nd_add(ctx, zeros, idx, dy, rank=rank_d, depth=1)
    if axis:
        d = ctx.op.Transpose(d, perm=[int(i) for i in np.argsort(data_perm)])
    return d, None


@register("GatherElements")
def gather_elements(ctx: GradContext):
    data, indices = ctx.x
    zeros = ctx.b.zeros_like(data, ctx.elem_type(data))
    return scatter_add(ctx, zeros, indices, ctx.dy[0], axis=ctx.attr("axis", 0)), None
