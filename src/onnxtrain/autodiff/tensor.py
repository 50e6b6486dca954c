"""Gradients of tensor ops that move, pick or scatter elements: Tile Pad Trilu TopK CumSum CumProd Compress,
Scatter*/GatherND, DepthToSpace/SpaceToDepth, ReverseSequence, MaxUnpool and Einsum.

Most are linear in x, so dX applies the transposed map to dY: the same op (Trilu, ReverseSequence), its
inverse (DepthToSpace <-> SpaceToDepth) or a scatter-add of dY to where each output element came from.
"""

from __future__ import annotations

import numpy as np
import onnx

from onnxtrain.autodiff.context import GradContext
from onnxtrain.autodiff.registry import register
from onnxtrain.autodiff.shape import (
    _flat_positions,
    _scatter_back,
    identity_along,
    scatter_add,
    scatter_nd_add,
    shape_of,
)
from onnxtrain.ir.types import np_dtype


def _input(ctx: GradContext, i: int) -> str | None:
    """Input ``i``, or None when it is omitted."""
    return ctx.x[i] if len(ctx.x) > i and ctx.x[i] else None


def _zeros(ctx: GradContext, like: str) -> str:
    return ctx.b.zeros_like(like, ctx.elem_type(like))


def _static_or_shape(ctx: GradContext, x: str) -> str:
    static = ctx.info(x).static_shape
    return ctx.b.ints(static) if static is not None else ctx.op.Shape(x)


def _scatter_add_back(ctx: GradContext, positions: str) -> str:
    """dX for ops that copy elements of X, some several times: add dY into zeros at the flat positions."""
    x = ctx.x[0]
    zeros = ctx.op.Reshape(_zeros(ctx, x), ctx.b.ints([-1]))
    row = ctx.b.ints([-1])
    flat = scatter_add(ctx, zeros, ctx.op.Reshape(positions, row), ctx.op.Reshape(ctx.dy[0], row))
    return ctx.op.Reshape(flat, _static_or_shape(ctx, x))


@register("Tile")
def tile(ctx: GradContext):
    """y = x repeated r_i times along axis i: view dY as (r_0, n_0, r_1, n_1, ...) and sum the r axes."""
    x, repeats = ctx.x
    rank = ctx.rank(x)
    pairs = ctx.op.Concat(ctx.b.unsqueeze(repeats, [1]), ctx.b.unsqueeze(ctx.op.Shape(x), [1]), axis=1)
    view = ctx.op.Reshape(ctx.dy[0], ctx.op.Reshape(pairs, ctx.b.ints([-1])))
    return ctx.b.reduce("ReduceSum", view, list(range(0, 2 * rank, 2)), keepdims=False), None


@register("Pad")
def pad(ctx: GradContext):
    """Constant mode: dX = Pad(dY, -pads), which crops the padding (and zero-fills what the pads cropped).
    Other modes copy border elements: scatter-add dY to the positions the padded positions came from."""
    x = ctx.x[0]
    mode = ctx.attr("mode", "constant")
    pads, axes = _input(ctx, 1), _input(ctx, 3)
    if mode == "constant":
        if pads is None:         # opset < 11: pads is an attribute
            return (ctx.op.Pad(ctx.dy[0], pads=[-p for p in ctx.attr("pads")]),)
        # (the fill is explicit: an omitted input between present ones confuses onnx.reference)
        dx = ctx.op.Pad(ctx.dy[0], ctx.op.Neg(pads), ctx.const_like(0.0, x), axes)
        return dx, None, _pad_value_grad(ctx, dx), None
    positions = _flat_positions(ctx, x)
    if pads is None:
        positions = ctx.op.Pad(positions, pads=list(ctx.attr("pads")), mode=mode)
    else:
        positions = ctx.op.Pad(positions, pads, ctx.b.const(np.int64(0)), axes, mode=mode)
    return _scatter_add_back(ctx, positions), None, None, None


def _pad_value_grad(ctx: GradContext, dx: str) -> str | None:
    """Every output element x did not fill is the pad value: d(value) = sum(dY) - sum(dX)."""
    value = _input(ctx, 2)
    if value is None or ctx.const_value(value) is not None:
        return None
    filled = ctx.op.Sub(ctx.b.reduce("ReduceSum", ctx.dy[0], None, keepdims=False),
                        ctx.b.reduce("ReduceSum", dx, None, keepdims=False))
    return ctx.op.Reshape(filled, ctx.op.Shape(value))   # a scalar, or the one-element tensor exporters write


@register("Trilu")
def trilu(ctx: GradContext):
    """The mask is linear and symmetric in its role: dX = Trilu(dY)."""
    return ctx.op.Trilu(ctx.dy[0], *ctx.x[1:], upper=ctx.attr("upper", 1)), None


@register("TopK")
def top_k(ctx: GradContext):
    """dY goes back to where each of the k values was taken from."""
    x = ctx.x[0]
    indices = ctx.forward_output(1, "indices")
    return ctx.op.ScatterElements(_zeros(ctx, x), indices, ctx.dy[0], axis=ctx.attr("axis", -1)), None


@register("CumSum")
def cum_sum(ctx: GradContext):
    """y_i = sum_{j <= i} x_j:  dx_j = sum_{i >= j} dy_i, the cumulative sum in the other direction."""
    return ctx.op.CumSum(ctx.dy[0], ctx.x[1], exclusive=ctx.attr("exclusive", 0),
                         reverse=1 - ctx.attr("reverse", 0)), None


@register("CumProd")
def cum_prod(ctx: GradContext):
    """y_i = prod_{j <= i} x_j:  dx_j = sum_{i >= j} dy_i y_i / x_j (undefined where x_j = 0)."""
    summed = ctx.op.CumSum(ctx.op.Mul(ctx.dy[0], ctx.y[0]), ctx.x[1], exclusive=ctx.attr("exclusive", 0),
                           reverse=1 - ctx.attr("reverse", 0))
    return ctx.op.Div(summed, ctx.x[0]), None


@register("Compress")
def compress(ctx: GradContext):
    """Compress the flat positions of X the same way, then scatter dY there."""
    positions = ctx.op.Compress(_flat_positions(ctx, ctx.x[0]), ctx.x[1], axis=ctx.attr("axis"))
    return _scatter_back(ctx, positions), None


@register("ReverseSequence")
def reverse_sequence(ctx: GradContext):
    """Reversing the first len_b steps is its own inverse (and transpose)."""
    return ctx.op.ReverseSequence(ctx.dy[0], ctx.x[1], batch_axis=ctx.attr("batch_axis", 1),
                                  time_axis=ctx.attr("time_axis", 0)), None


@register("MaxUnpool")
def max_unpool(ctx: GradContext):
    """y.flat[indices] = x:  dX = dY.flat[indices]."""
    return ctx.op.Gather(ctx.op.Reshape(ctx.dy[0], ctx.b.ints([-1])), ctx.x[1], axis=0), None, None


@register("SpaceToDepth")
def space_to_depth(ctx: GradContext):
    """Undone by DepthToSpace in the same mode (SpaceToDepth has a mode from opset 28)."""
    return (ctx.op.DepthToSpace(ctx.dy[0], blocksize=ctx.attr("blocksize"), mode=ctx.attr("mode", "DCR")),)


@register("DepthToSpace")
def depth_to_space(ctx: GradContext):
    """DCR mode is undone by SpaceToDepth; CRD mode (N, C/b^2 b b, H, W) -> (N, C/b^2, H b, W b) by the
    reverse reshape and transpose."""
    x, blocksize = ctx.x[0], ctx.attr("blocksize")
    if ctx.attr("mode", "DCR") == "DCR":
        return (ctx.op.SpaceToDepth(ctx.dy[0], blocksize=blocksize),)
    b, op = blocksize, ctx.op
    _, c, h, w = ctx.shape(x)
    if all(isinstance(d, int) for d in (c, h, w)):
        view_shape, back = ctx.b.ints([-1, c // (b * b), h, b, w, b]), ctx.b.ints([-1, c, h, w])
    else:   # the same shapes, read at run time: (N, C/b^2, H, b, W, b), then X's shape
        n_c, hw = shape_of(ctx.b, x, 0, 2), [shape_of(ctx.b, x, i, i + 1) for i in (2, 3)]
        n_c = op.Div(n_c, ctx.b.ints([1, b * b]))
        view_shape, back = op.Concat(n_c, hw[0], ctx.b.ints([b]), hw[1], ctx.b.ints([b]), axis=0), op.Shape(x)
    view = op.Reshape(ctx.dy[0], view_shape)                                          # (N, C', H, b, W, b)
    view = op.Transpose(view, perm=[0, 1, 3, 5, 2, 4])                               # (N, C', b, b, H, W)
    return (op.Reshape(view, back),)


# -- scatters and their gathers: dUpdates reads dY where the updates went; dData loses what they overwrote --

def _scatter_rule(ctx: GradContext, gather, scatter):
    data, indices, updates = ctx.x
    dy, op = ctx.dy[0], ctx.op
    reduction = ctx.attr("reduction", "none")
    if reduction == "none":
        return scatter(dy, indices, _zeros(ctx, updates)), None, gather(dy, indices)
    if reduction == "add":
        return dy, None, gather(dy, indices)
    if reduction == "mul":       # y = data * prod(updates there): dupdate_k = dy y / update_k (update_k != 0)
        ones = ctx.b.ones_like(data, ctx.elem_type(data))
        return (op.Mul(dy, scatter(ones, indices, updates, reduction="mul")), None,
                op.Div(gather(op.Mul(dy, ctx.y[0]), indices), updates))
    if reduction in ("max", "min"):  # the winner (data or an update) gets dY
        y = ctx.y[0]
        won = op.Cast(op.Equal(data, y), to=ctx.elem_type(data))
        won_u = op.Cast(op.Equal(updates, gather(y, indices)), to=ctx.elem_type(data))
        return op.Mul(dy, won), None, op.Mul(gather(dy, indices), won_u)
    raise ValueError(f"{ctx.node.op_type} node {ctx.node.name!r}: no gradient for reduction={reduction!r}")


@register("ScatterElements")
def scatter_elements(ctx: GradContext):
    axis = ctx.attr("axis", 0)
    return _scatter_rule(ctx, lambda t, i: ctx.op.GatherElements(t, i, axis=axis),
                         lambda t, i, u, **kw: ctx.op.ScatterElements(t, i, u, axis=axis, **kw))


@register("ScatterND")
def scatter_nd(ctx: GradContext):
    return _scatter_rule(ctx, ctx.op.GatherND, ctx.op.ScatterND)


@register("GatherND")
def gather_nd(ctx: GradContext):
    """dData: scatter-add dY at the indexed slices. With batch_dims, fold the batch into one leading axis and
    prepend its coordinate to every index."""
    data, indices = ctx.x
    dy, op = ctx.dy[0], ctx.op
    batch = ctx.attr("batch_dims", 0)
    if not batch:
        depth = ctx.info(indices).shape[-1] if ctx.info(indices).shape else None
        return scatter_nd_add(ctx, _zeros(ctx, data), indices, dy, rank=ctx.rank(data),
                              depth=depth if isinstance(depth, int) else None), None
    dshape, ishape = ctx.info(data).static_shape, ctx.info(indices).static_shape
    if dshape is None or ishape is None:
        return _gather_nd_batched_dynamic(ctx, batch), None
    n = int(np.prod(dshape[:batch]))
    inner = [n, *ishape[batch:-1]]
    coords = np.broadcast_to(np.arange(n).reshape([n] + [1] * (len(inner) - 1) + [1]), [*inner, 1])
    full = op.Concat(ctx.b.const(np.ascontiguousarray(coords, dtype=np.int64)),
                     op.Cast(op.Reshape(indices, ctx.b.ints([*inner, ishape[-1]])), to=onnx.TensorProto.INT64), axis=-1)
    zeros = ctx.b.const(np.zeros([n, *dshape[batch:]], dtype=np_dtype(ctx.elem_type(data))))
    flat_dy = op.Reshape(dy, ctx.b.ints([*inner, *dshape[batch + ishape[-1]:]]))
    return op.Reshape(scatter_nd_add(ctx, zeros, full, flat_dy, rank=1 + len(dshape) - batch, depth=ishape[-1] + 1),
                      ctx.b.ints(dshape)), None


def _gather_nd_batched_dynamic(ctx: GradContext, batch: int) -> str:
    """GatherND's dData with batch_dims and shapes known at run time: the same folding of the batch axes into
    one, with every shape read from the tensors."""
    data, indices = ctx.x
    op, b = ctx.op, ctx.b
    i64 = onnx.TensorProto.INT64

    def fold(t: str) -> str:   # the batch axes become one leading axis
        return op.Reshape(t, op.Concat(b.ints([-1]), shape_of(b, t, batch), axis=0))

    index = op.Cast(fold(indices), to=i64)                                        # (n, *inner, k)
    inner_rank = ctx.rank(indices) - batch                                        # rank of index minus 1
    n = shape_of(b, index, 0, 1)
    coords = op.Reshape(op.Range(b.const(np.int64(0)), op.Reshape(n, b.ints([])), b.const(np.int64(1))),
                        op.Concat(n, b.ints([1] * inner_rank), axis=0))
    coords = op.Expand(coords, op.Concat(shape_of(b, index, 0, inner_rank), b.ints([1]), axis=0))
    full = op.Concat(coords, index, axis=-1)
    zeros = b.full(op.Concat(n, shape_of(b, data, batch), axis=0), 0, ctx.elem_type(data))
    return op.Reshape(scatter_nd_add(ctx, zeros, full, fold(ctx.dy[0]), rank=1 + ctx.rank(data) - batch, depth=None),
                      op.Shape(data))


# -- Einsum --------------------------------------------------------------------------------------------------

def _terms(equation: str) -> tuple[list[list[str]], list[str]]:
    """Subscripts of each operand and of the output as token lists ("..." is one token)."""
    equation = equation.replace(" ", "")
    lhs, _, rhs = equation.partition("->")

    def tokens(term: str) -> list[str]:
        out, i = [], 0
        while i < len(term):
            if term.startswith("...", i):
                out.append("...")
                i += 3
            else:
                out.append(term[i])
                i += 1
        return out

    inputs = [tokens(t) for t in lhs.split(",")]
    if "->" not in equation:     # implicit output: letters used once, in alphabetical order, after "..."
        letters = [t for term in inputs for t in term if t != "..."]
        rhs = ("..." if any("..." in t for t in inputs) else "") + "".join(
            sorted(c for c in set(letters) if letters.count(c) == 1))
    return inputs, tokens(rhs)


@register("Einsum")
def einsum(ctx: GradContext):
    """dX_i = einsum(dY, the other operands -> subscripts of X_i). Labels only X_i has were summed away and
    come back by broadcasting; a label repeated in X_i (a diagonal) is masked to that diagonal."""
    inputs, out = _terms(ctx.attr("equation"))
    grads = []
    for i, x in enumerate(ctx.x):
        if not ctx.is_float(x):
            grads.append(None)
            continue
        others = [j for j in range(len(ctx.x)) if j != i]
        available = set(out) | {t for j in others for t in inputs[j]}
        target = inputs[i]
        first = [t for k, t in enumerate(target) if t in available and t not in target[:k]]
        operands = [(out, ctx.y[0]), *((inputs[j], ctx.x[j]) for j in others)]
        summed = 0
        if "..." not in first and any("..." in term for term, _ in operands):
            # onnxruntime wants "..." in the output when an input has it: keep it, then sum it away.
            summed = max(len(_ellipsis_dims(ctx, term, name)) for term, name in operands if "..." in term)
            first = ["...", *first]
        eq = ",".join("".join(t) for t, _ in operands) + "->" + "".join(first)
        g = ctx.op.Einsum(ctx.dy[0], *(ctx.x[j] for j in others), equation=eq)
        if summed:
            g = ctx.b.reduce("ReduceSum", g, list(range(summed)), keepdims=False)
            first = first[1:]
        ell_rank = max((len(_ellipsis_dims(ctx, term, name)) for term, name in operands if "..." in term), default=0)
        grads.append(_place(ctx, g, target, first, x, _ellipsis_shape(ctx, operands) if "..." in first else None,
                            ell_rank))
    return grads


def _ellipsis_dims(ctx: GradContext, term: list[str], name: str) -> tuple | None:
    if "..." not in term:
        return None
    shape, at = ctx.shape(name), term.index("...")
    return tuple(shape[at:at + len(shape) - (len(term) - 1)])


def _ellipsis_shape(ctx: GradContext, operands: list[tuple[list[str], str]]) -> tuple | None:
    """The broadcast shape "..." stands for among ``operands`` (None if unknown or absent)."""
    dims = [_ellipsis_dims(ctx, term, name) for term, name in operands if "..." in term]
    if not dims or not all(isinstance(d, int) for ds in dims for d in ds):
        return None
    return tuple(np.broadcast_shapes(*dims))


def _place(ctx: GradContext, g: str, target: list[str], first: list[str], x: str, ell_shape: tuple | None,
           ell_rank: int) -> str:
    """Lay ``g`` (subscripts ``first``) out as ``x`` (subscripts ``target``): new axes, diagonals, broadcast.

    ``ell_shape`` is the shape "..." has in ``g`` (None if not static), ``ell_rank`` its length; where ``x``
    was broadcast along it, sum it back.
    """
    rank = ctx.rank(x)
    ell = rank - (len(target) - ("..." in target))               # number of axes "..." stands for in x
    axes_of, pos = {}, 0
    for t in target:
        width = ell if t == "..." else 1
        axes_of.setdefault(t, []).append(list(range(pos, pos + width)))
        pos += width
    kept = set(first)
    new_axes = sorted(a for t, occ in axes_of.items() for k, ax in enumerate(occ) for a in ax
                      if not (k == 0 and t in kept))
    if new_axes:
        g = ctx.b.unsqueeze(g, new_axes)
    shape = list(ctx.shape(x))
    for t, occ in axes_of.items():
        if t == "..." or len(occ) == 1:
            continue
        # a repeated label reads a diagonal of x, whether g keeps it or it was summed away ("ii->", "bii->b"):
        # mask to the diagonal of the first and this occurrence
        for extra in occ[1:]:
            g = ctx.op.Mul(g, identity_along(ctx, x, occ[0][0], extra[0])[0])
    at = target.index("...") if "..." in target else 0
    if "..." not in first or (ell_shape is not None and tuple(shape[at:at + ell]) == tuple(ell_shape)):
        return ctx.op.Expand(g, _static_or_shape(ctx, x))
    if ell_shape is not None:
        grad_shape = [*shape[:at], *ell_shape, *shape[at + ell:]]
        if all(isinstance(d, int) for d in grad_shape):
            return ctx.unbroadcast(ctx.op.Expand(g, ctx.b.ints(grad_shape)), x, grad_shape=grad_shape)
    if at:
        raise ValueError(f"Einsum node {ctx.node.name!r}: a '...' after other subscripts, broadcast between the "
                         f"operands, needs static shapes")
    # "..." leads and may be broadcast in x: expand to the broadcast shape, then sum back over what x broadcast.
    broadcast_rank = max(rank, ell_rank + len(target) - 1)
    return ctx.unbroadcast(ctx.op.Expand(g, ctx.op.Shape(x)), x, grad_shape=[None] * broadcast_rank)


@register("TensorScatter")
def tensor_scatter(ctx: GradContext):
    """The cache with the update written at positions w_b + s (modulo the cache's length if circular) along
    ``axis``: dUpdate reads dY there, dPast is dY with those positions cleared."""
    past, update = ctx.x[0], ctx.x[1]
    writes = _input(ctx, 2)
    dy, op = ctx.dy[0], ctx.op
    rank = ctx.rank(past)
    axis = ctx.attr("axis", -2) % rank
    zero, one = ctx.b.const(np.asarray(0, np.int64)), ctx.b.const(np.asarray(1, np.int64))

    def length(v: str) -> str:
        return op.Reshape(op.Slice(op.Shape(v), ctx.b.ints([axis]), ctx.b.ints([axis + 1])), ctx.b.ints([]))

    positions = ctx.b.unsqueeze(op.Range(zero, length(update), one), [0])          # (1, S)
    if writes is not None:
        positions = op.Add(positions, ctx.b.unsqueeze(op.Cast(writes, to=onnx.TensorProto.INT64), [1]))  # (B, S)
    if ctx.attr("mode", "linear") == "circular":
        positions = op.Mod(positions, length(past))
    if axis == 0:
        raise ValueError(f"TensorScatter node {ctx.node.name!r}: axis 0 is the batch axis, not a sequence axis")
    # (B, S) -> (B, 1, .., S at axis, 1, ..), then to the update's shape
    view = op.Reshape(positions, ctx.b.ints([0, *[1] * (axis - 1), -1, *[1] * (rank - axis - 1)]))
    index = op.Expand(view, op.Shape(update))
    d_update = op.GatherElements(dy, index, axis=axis)
    d_past = op.ScatterElements(dy, index, _zeros(ctx, update), axis=axis)
    return d_past, d_update, None
