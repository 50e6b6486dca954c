"""Window geometry shared by the convolution and pooling rules: kernel, strides, dilations and pads,
read from the attributes or, for SAME padding on dynamic sizes, computed at run time.
"""

from __future__ import annotations

from onnxtrain.autodiff.context import GradContext
from onnxtrain.autodiff.shape import shape_of
from onnxtrain.errors import UnsupportedOpError

Size = list  # spatial sizes: ints, or None for a dimension only known at run time


def spatial_attrs(ctx: GradContext, kernel: list[int]):
    """strides, dilations and explicit (begin..., end...) pads of a conv/pool node, auto_pad resolved.

    SAME padding with a stride pads by an amount that depends on the input size: when that size is only known
    at run time, use :func:`same_pads_at_run_time` (the Conv rule does) or refuse with a clear error."""
    n = len(kernel)
    strides = list(ctx.attr("strides") or [1] * n)
    dilations = list(ctx.attr("dilations") or [1] * n)
    pads = list(ctx.attr("pads") or [0] * (2 * n))
    auto_pad = ctx.attr("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        spatial = spatial_sizes(ctx, ctx.x[0])
        for i, (size, k, s, d) in enumerate(zip(spatial, kernel, strides, dilations)):
            if size is None and s != 1:
                raise UnsupportedOpError(
                    f"{ctx.node.op_type} node {ctx.node.name!r}: auto_pad={auto_pad} with stride {s} pads by an "
                    f"amount that depends on the input size, which is dynamic here ({ctx.shape(ctx.x[0])}). - help: "
                    f"export or convert the model with explicit pads, or with a static size for that axis")
            # With stride 1 the total padding is (k - 1) d whatever the size.
            total = (k - 1) * d if size is None else max(0, (-(-size // s) - 1) * s + (k - 1) * d + 1 - size)
            small, big = total // 2, total - total // 2
            pads[i], pads[i + n] = (small, big) if auto_pad == "SAME_UPPER" else (big, small)
    elif auto_pad == "VALID":
        pads = [0] * (2 * n)
    return strides, dilations, pads


def needs_run_time_pads(ctx: GradContext, kernel: list[int]) -> bool:
    """SAME padding with a stride over an axis whose size is only known at run time."""
    strides = list(ctx.attr("strides") or [1] * len(kernel))
    return (ctx.attr("auto_pad", "NOTSET") in ("SAME_UPPER", "SAME_LOWER")
            and any(size is None and s != 1 for size, s in zip(spatial_sizes(ctx, ctx.x[0]), strides)))


def same_pads_at_run_time(ctx: GradContext, kernel: list[int]) -> str:
    """The Pad-op pads (int64, begin and end of every axis) that SAME padding adds to X, computed from its shape:
    total = max(0, (ceil(size / s) - 1) s + (k - 1) d + 1 - size), the odd one at the end (SAME_UPPER) or begin."""
    op, b = ctx.op, ctx.b
    n = len(kernel)
    strides = list(ctx.attr("strides") or [1] * n)
    dilations = list(ctx.attr("dilations") or [1] * n)
    size = shape_of(b, ctx.x[0], 2, 2 + n)
    s, reach = b.ints(strides), b.ints([(k - 1) * d + 1 for k, d in zip(kernel, dilations)])
    out = op.Div(op.Add(size, op.Sub(s, b.ints([1] * n))), s)                   # ceil(size / s)
    total = op.Max(op.Sub(op.Add(op.Mul(op.Sub(out, b.ints([1] * n)), s), reach), size), b.ints([0] * n))
    small = op.Div(total, b.ints([2] * n))
    big = op.Sub(total, small)
    begin, end = (small, big) if ctx.attr("auto_pad") == "SAME_UPPER" else (big, small)
    return op.Concat(b.ints([0, 0]), begin, b.ints([0, 0]), end, axis=0)


def spatial_sizes(ctx: GradContext, name: str) -> Size:
    """The spatial sizes of ``name`` (axes 2...), None for each one only known at run time."""
    return [d if isinstance(d, int) else None for d in ctx.shape(name)[2:]]


def all_known(*sizes: Size) -> bool:
    return all(d is not None for size in sizes for d in size)


def crop_like(ctx: GradContext, t: str, like: str, n: int) -> str:
    """``t`` cut at the end of its ``n`` spatial axes to the spatial size of ``like``, read at run time."""
    b = ctx.b
    return ctx.op.Slice(t, b.ints([0] * n), shape_of(b, like, 2, 2 + n), b.ints(list(range(2, 2 + n))))
