"""Gradients of resampling ops: Resize and GridSample.

Resize is linear in x and separable: along each resized axis a it multiplies by an (m_a, n_a) matrix M_a
(nearest, linear, cubic, antialiased or not). dX applies every M_a^T to dY. Each M_a^T is obtained in the
graph by resizing an identity matrix with the node's own attributes, so it matches the forward exactly,
on whichever runtime runs it.
"""

from __future__ import annotations

import itertools

import numpy as np
import onnx

from onnxtrain.autodiff.context import GradContext
from onnxtrain.autodiff.registry import register
from onnxtrain.autodiff.shape import identity_along, scatter_add, shape_of
from onnxtrain.ir.types import np_dtype


def _input(ctx: GradContext, i: int) -> str | None:
    return ctx.x[i] if len(ctx.x) > i and ctx.x[i] else None


def _full_rank(values, axes: list[int], rank: int, fill: float) -> list[float]:
    """Per-axis values given for ``axes`` only, as one value per axis (``fill`` for the others)."""
    full = [fill] * rank
    for a, v in zip(axes, values):
        full[a] = float(v)
    return full


@register("Resize")
def resize(ctx: GradContext):
    x, dy, op = ctx.x[0], ctx.dy[0], ctx.op
    roi, scales, sizes = _input(ctx, 1), _input(ctx, 2), _input(ctx, 3)
    in_shape, out_shape = ctx.shape(x), ctx.info(ctx.y[0]).shape
    name = ctx.node.name or "Resize"
    if len(in_shape) < 2:
        raise ValueError(f"Resize node {name!r}: the gradient needs an input of rank 2 or more")
    if ctx.attr("keep_aspect_ratio_policy", "stretch") != "stretch":
        return (_resize_keeping_aspect(ctx), *[None] * (len(ctx.x) - 1))
    rank = len(in_shape)
    axes = [a % rank for a in (ctx.attr("axes") or range(rank))]
    crop = ctx.attr("coordinate_transformation_mode", "half_pixel") == "tf_crop_and_resize"
    given = sizes if sizes is not None else scales                # the op reads sizes when both are given
    known = ctx.const_value(given) if given is not None else None
    known = _full_rank(known.tolist(), axes, rank, 1.0) if known is not None else None
    if known is None and ctx.attr("axes") is not None:
        raise ValueError(f"Resize node {name!r}: the gradient needs constant scales or sizes when 'axes' is set")
    roi_values = None
    if crop:
        roi_const = ctx.const_value(roi) if roi is not None else None
        if roi_const is None:
            raise ValueError(f"Resize node {name!r}: tf_crop_and_resize needs a constant roi for the gradient")
        k = len(axes)
        roi_values = (_full_rank(roi_const[:k].tolist(), axes, rank, 0.0),
                      _full_rank(roi_const[k:].tolist(), axes, rank, 1.0))

    def is_identity(a: int) -> bool:
        if crop and (roi_values[0][a], roi_values[1][a]) != (0.0, 1.0):
            return False
        if known is not None and sizes is None:
            return known[a] == 1.0
        if known is not None:
            return isinstance(in_shape[a], int) and known[a] == in_shape[a]
        # Sizes or scales known at run time only: an axis is left alone when its size is the same (symbolic) dim.
        return out_shape is not None and in_shape[a] is not None and out_shape[a] == in_shape[a]

    attrs = {k: ctx.attr(k) for k in ("mode", "coordinate_transformation_mode", "cubic_coeff_a",
                                       "exclude_outside", "nearest_mode", "antialias")}
    if crop:
        attrs["extrapolation_value"] = 0.0       # outside the crop, y does not depend on x

    g = dy
    for a in (a for a in axes if not is_identity(a)):
        # E holds the n basis vectors of axis a, stacked along another axis, which E's resize leaves alone.
        stack = 0 if a else 1
        eye, e_shape = identity_along(ctx, x, a, stack)
        roi_e = ""
        if crop:
            starts, ends = [0.0] * rank, [1.0] * rank
            starts[a], ends[a] = roi_values[0][a], roi_values[1][a]
            roi_e = ctx.b.const(np.asarray(starts + ends, dtype=np_dtype(ctx.elem_type(roi))))
        # E's sizes or scales: axis a's own, and E's shape (scale 1) elsewhere; from the run-time tensor if need be.
        dtype = np_dtype(ctx.elem_type(given))
        onehot = np.zeros(rank, dtype=dtype)
        onehot[a] = 1
        if sizes is not None:
            keep = op.Mul(e_shape, ctx.b.const(1 - onehot)) if isinstance(e_shape, str) else \
                ctx.b.const(np.asarray(e_shape, dtype=dtype) * (1 - onehot))
        else:
            keep = ctx.b.const(1 - onehot)
        if known is not None:
            own = ctx.b.const((onehot * known[a]).astype(dtype))
        else:
            own = op.Mul(given, ctx.b.const(onehot))
        target = op.Add(own, keep)
        inputs = (eye, roi_e, "", target) if sizes is not None else (eye, roi_e, target)
        basis = op.Resize(*inputs, **attrs)
        # basis[j, i] = M_a[i, j]: row j is the resized j-th basis vector. Its length is read at run time,
        # as runtimes disagree on some output sizes (tf_crop_and_resize).
        g = _apply_transposed(ctx, g, basis, a, stack, rank, in_shape[a])
    return (g, *[None] * (len(ctx.x) - 1))


def _apply_transposed(ctx: GradContext, g: str, basis: str, a: int, stack: int, rank: int, n) -> str:
    """Multiply axis ``a`` of ``g`` by M_a^T, given the resized basis (E's resize, n vectors along ``stack``)."""
    op = ctx.op
    rows = n if isinstance(n, int) else 0                                # 0: E's own size along the stacking axis
    basis = op.Reshape(basis, ctx.b.ints([rows, -1] if stack < a else [-1, rows]))
    if stack < a:
        basis = op.Transpose(basis, perm=[1, 0])                         # (m, n) = M_a
    last = [*(i for i in range(rank) if i != a), a]                      # contract axis a, moved last
    g = op.MatMul(op.Transpose(g, perm=last) if a != rank - 1 else g, basis)
    return op.Transpose(g, perm=[int(i) for i in np.argsort(last)]) if a != rank - 1 else g


def _resize_keeping_aspect(ctx: GradContext) -> str:
    """Resize with keep_aspect_ratio_policy not_larger / not_smaller: every resized axis is scaled by one
    factor s = min (or max) of sizes / input sizes, and its length is round(n s). Per axis, E's resize by s
    gives the coordinate map; E gets ceil(1/s) more (edge-padded) elements so that the resize is at least as
    long as dY (the padding repeats the border, as the op's clamping does), and is cut to dY's length."""
    x, dy, op, b = ctx.x[0], ctx.dy[0], ctx.op, ctx.b
    name = ctx.node.name or "Resize"
    ct = ctx.attr("coordinate_transformation_mode", "half_pixel")
    sizes = _input(ctx, 3)
    if ct in ("align_corners", "half_pixel_symmetric", "tf_crop_and_resize") or sizes is None:
        raise ValueError(f"Resize node {name!r}: no gradient for keep_aspect_ratio_policy="
                         f"{ctx.attr('keep_aspect_ratio_policy')!r} with coordinate_transformation_mode={ct!r} "
                         f"(its coordinates depend on the rounded lengths); export with 'stretch'")
    in_shape = ctx.shape(x)
    rank = len(in_shape)
    axes = [a % rank for a in (ctx.attr("axes") or range(rank))]
    f32 = onnx.TensorProto.FLOAT
    ratios = op.Div(op.Cast(sizes, to=f32), op.Cast(op.Gather(op.Shape(x), b.ints(axes)), to=f32))
    reduce = "ReduceMin" if ctx.attr("keep_aspect_ratio_policy") == "not_larger" else "ReduceMax"
    scale = b.reduce(reduce, ratios, None, keepdims=True)                       # [1]
    extra = op.Max(op.Cast(op.Ceil(op.Div(b.const(np.ones(1, np.float32)), scale)), to=onnx.TensorProto.INT64),
                   b.ints([1]))
    attrs = {k: ctx.attr(k) for k in ("mode", "coordinate_transformation_mode", "cubic_coeff_a",
                                       "exclude_outside", "nearest_mode", "antialias")}
    g = dy
    for a in axes:
        stack = 0 if a else 1
        eye, _ = identity_along(ctx, x, a, stack)
        pads = op.Concat(b.ints([0] * (rank + a)), extra, b.ints([0] * (rank - a - 1)), axis=0)
        eye = op.Pad(eye, pads, mode="edge")
        scales = op.Concat(*[scale if i == a else b.const(np.ones(1, np.float32)) for i in range(rank)], axis=0)
        basis = op.Resize(eye, "", scales, **attrs)
        basis = op.Slice(basis, b.ints([0]), shape_of(b, dy, a, a + 1), b.ints([a]))
        g = _apply_transposed(ctx, g, basis, a, stack, rank, in_shape[a])
    return g


# -- GridSample ---------------------------------------------------------------------------------------------

def _unnormalize(ctx: GradContext, g: str, size: str, align: bool) -> tuple[str, str]:
    """Pixel coordinate of a normalized coordinate in [-1, 1], and d(pixel)/d(normalized) (``size``: a scalar)."""
    op = ctx.op
    k = lambda v: ctx.const_like(v, ctx.x[0])  # noqa: E731
    if align:   # -1 and 1 are the centers of the corner pixels
        scale = op.Div(op.Sub(size, k(1.0)), k(2.0))
        return op.Mul(op.Add(g, k(1.0)), scale), scale
    return op.Div(op.Sub(op.Mul(op.Add(g, k(1.0)), size), k(1.0)), k(2.0)), op.Div(size, k(2.0))


def _pad_coordinate(ctx: GradContext, v: str, size: str, align: bool, padding: str) -> tuple[str, str | None]:
    """The coordinate the padding mode samples at, and its derivative (None for 1)."""
    op = ctx.op
    k = lambda val: ctx.const_like(val, ctx.x[0])  # noqa: E731
    if padding == "zeros":
        return v, None
    last = op.Sub(size, k(1.0))
    if padding == "reflection":    # a triangle wave over [lo, hi]: lo + span * tri(t), t = (v - lo) / span
        lo = k(0.0) if align else k(-0.5)
        span = last if align else size                                     # hi - lo
        t = op.Div(op.Sub(v, lo), span)
        m = op.Sub(t, op.Mul(k(2.0), op.Floor(op.Div(t, k(2.0)))))           # t mod 2, in [0, 2)
        v = op.Add(lo, op.Mul(span, op.Sub(k(1.0), op.Abs(op.Sub(m, k(1.0))))))
        sign = op.Where(op.Less(m, k(1.0)), k(1.0), k(-1.0))
    else:
        sign = None
    inside = op.And(op.Greater(v, k(0.0)), op.Less(v, last))
    slope = op.Where(inside, sign if sign is not None else k(1.0), k(0.0))
    return op.Clip(v, k(0.0), last), slope


def _spatial_sizes(ctx: GradContext, x: str) -> tuple[list[str], list[str]]:
    """Per spatial axis of ``x``: its length as a scalar of x's type, and the flat-index stride (int64 scalar);
    constants when the sizes are static, read from Shape(x) at run time otherwise."""
    shape = ctx.shape(x)[2:]
    if all(isinstance(d, int) for d in shape):
        sizes = [ctx.const_like(float(d), x) for d in shape]
        strides = [ctx.b.const(np.int64(np.prod(shape[a + 1:]))) for a in range(len(shape))]
        return sizes, strides
    op, b = ctx.op, ctx.b
    lengths = [op.Reshape(shape_of(b, x, 2 + a, 3 + a), b.ints([])) for a in range(len(shape))]   # int64 scalars
    sizes = [op.Cast(n, to=ctx.elem_type(x)) for n in lengths]
    strides = [b.const(np.int64(1))]
    for n in reversed(lengths[1:]):
        strides.insert(0, op.Mul(strides[0], n))
    return sizes, strides


@register("GridSample")
def grid_sample(ctx: GradContext):
    """y[n, c, p] = sum over the corners q of w_q(grid[n, p]) x[n, c, q]  (2-D or 3-D, linear or nearest).

    dX scatters dY w_q to the corners; dGrid = sum_c dY sum_q x_q dw_q/dgrid.
    """
    x, grid = ctx.x
    dy, op = ctx.dy[0], ctx.op
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(ctx.attr("mode", "linear"), ctx.attr("mode", "linear"))
    padding, align = ctx.attr("padding_mode", "zeros"), bool(ctx.attr("align_corners", 0))
    name = ctx.node.name or "GridSample"
    rank = ctx.rank(x)
    unsupported = (mode == "nearest" and padding == "reflection") or (mode == "cubic" and padding != "zeros")
    if rank not in (4, 5) or unsupported:
        raise ValueError(f"GridSample node {name!r}: gradients cover 2-D and 3-D sampling, linear (any padding), "
                         f"nearest (zeros or border) and cubic (zeros), not rank {rank}, mode={mode!r}, "
                         f"padding_mode={padding!r}")
    spatial, strides = _spatial_sizes(ctx, x)
    nd = len(spatial)
    k = lambda v: ctx.const_like(v, ctx.x[0])  # noqa: E731
    column = ctx.b.ints([0, 1, -1])
    # grid[..., j] is the coordinate along spatial axis nd - 1 - j (x is the last axis, W).
    coords, scales, slopes = [], [], []
    for axis, size in enumerate(spatial):
        g = op.Reshape(op.Gather(grid, ctx.b.const(np.int64(nd - 1 - axis)), axis=-1), column)   # (N, 1, L)
        v, scale = _unnormalize(ctx, g, size, align)
        v, slope = _pad_coordinate(ctx, v, size, align, padding)
        coords.append(v)
        scales.append(scale)
        slopes.append(slope)

    if mode == "nearest":
        corners = [([op.Round(v) for v in coords], None, None)]
    else:
        taps = [_taps(ctx, v, mode) for v in coords]     # per axis: (position, weight, d weight / d v)
        corners = []
        for choice in itertools.product(*(range(len(t)) for t in taps)):
            # w_q = prod_a w_a;  dw_q / dv_a = w_a' prod_{b != a} w_b
            picked = [taps[a][i] for a, i in enumerate(choice)]
            w = _product(ctx, [p[1] for p in picked])
            dws = [_product(ctx, [p[2], *(q[1] for b, q in enumerate(picked) if b != a)]) for a, p in enumerate(picked)]
            corners.append(([p[0] for p in picked], w, dws))

    x_flat = op.Reshape(x, ctx.b.ints([0, 0, -1]))                               # (N, C, S)
    dy_flat = op.Reshape(dy, ctx.b.ints([0, 0, -1]))                            # (N, C, L)
    target = op.Shape(dy_flat)
    positions, updates, dvs = [], [], [[] for _ in range(nd)]
    for corner, weight, dws in corners:
        valid, flat = None, None
        for a, (c, size) in enumerate(zip(corner, spatial)):
            last = op.Sub(size, k(1.0))
            inside = op.And(op.GreaterOrEqual(c, k(0.0)), op.LessOrEqual(c, last))
            valid = inside if valid is None else op.And(valid, inside)
            ci = op.Cast(op.Clip(c, k(0.0), last), to=onnx.TensorProto.INT64)
            term = ci if a == nd - 1 else op.Mul(ci, strides[a])
            flat = term if flat is None else op.Add(flat, term)
        index = op.Expand(flat, target)                                         # (N, C, L)
        # Out of range, zeros padding reads 0; the other modes clamp (and then the weight is 0 or it is inside).
        keep = op.Cast(valid, to=ctx.elem_type(x)) if padding == "zeros" else k(1.0)
        positions.append(index)
        updates.append(op.Mul(dy_flat, keep if weight is None else op.Mul(weight, keep)))
        if weight is not None:
            value = op.Mul(op.GatherElements(x_flat, index, axis=2), keep)     # (N, C, L)
            for a in range(nd):
                dvs[a].append(op.Mul(value, dws[a]))

    zeros = ctx.b.zeros_like(x_flat, ctx.elem_type(x))
    dx = scatter_add(ctx, zeros, op.Concat(*positions, axis=2), op.Concat(*updates, axis=2), axis=2)
    dx = op.Reshape(dx, op.Shape(x))
    if mode == "nearest":            # piecewise constant in the grid
        return dx, None
    grads = []
    for a in reversed(range(nd)):    # grid component j is spatial axis nd - 1 - j
        d = ctx.b.reduce("ReduceSum", op.Mul(dy_flat, op.Sum(*dvs[a])), [1], keepdims=True)     # (N, 1, L)
        d = op.Mul(d, scales[a])
        grads.append(ctx.b.unsqueeze(d if slopes[a] is None else op.Mul(d, slopes[a]), [-1]))
    return dx, op.Reshape(op.Concat(*grads, axis=-1), op.Shape(grid))


def _taps(ctx: GradContext, v: str, mode: str) -> list[tuple[str, str, str]]:
    """The sample positions along one axis around coordinate v, their weights and the weights' derivatives.

    linear: floor(v) + (0, 1) with weights (1 - t, t). cubic: floor(v) + (-1, 0, 1, 2) with Keys' cubic
    convolution weights (a = -0.75) at distances (t + 1, t, 1 - t, 2 - t), t = v - floor(v).
    """
    op = ctx.op
    k = lambda c: ctx.const_like(c, ctx.x[0])  # noqa: E731
    lo = op.Floor(v)
    t = op.Sub(v, lo)
    if mode == "linear":
        return [(lo, op.Sub(k(1.0), t), k(-1.0)), (op.Add(lo, k(1.0)), t, k(1.0))]
    a = -0.75

    def far(u: str) -> tuple[str, str]:       # 1 <= |u| < 2: a u^3 - 5a u^2 + 8a u - 4a, and its derivative
        w = op.Sub(op.Mul(op.Add(op.Mul(op.Sub(op.Mul(u, k(a)), k(5 * a)), u), k(8 * a)), u), k(4 * a))
        return w, op.Add(op.Mul(op.Sub(op.Mul(u, k(3 * a)), k(10 * a)), u), k(8 * a))

    def near(u: str) -> tuple[str, str]:      # |u| < 1: (a + 2) u^3 - (a + 3) u^2 + 1, and its derivative
        w = op.Add(op.Mul(op.Mul(op.Sub(op.Mul(u, k(a + 2)), k(a + 3)), u), u), k(1.0))
        return w, op.Mul(op.Sub(op.Mul(u, k(3 * (a + 2))), k(2 * (a + 3))), u)

    taps = []
    for offset, (w, dw_du), sign in ((-1.0, far(op.Add(t, k(1.0))), 1.0), (0.0, near(t), 1.0),
                                     (1.0, near(op.Sub(k(1.0), t)), -1.0), (2.0, far(op.Sub(k(2.0), t)), -1.0)):
        taps.append((op.Add(lo, k(offset)), w, dw_du if sign > 0 else op.Neg(dw_du)))
    return taps


def _product(ctx: GradContext, factors: list[str]) -> str:
    out = factors[0] if factors else ctx.const_like(1.0, ctx.x[0])
    for f in factors[1:]:
        out = ctx.op.Mul(out, f)
    return out
