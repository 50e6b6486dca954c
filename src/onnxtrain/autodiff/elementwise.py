"""Gradients of elementwise arithmetic (with broadcasting) and unary math: Add ... Pow, Exp, Log, Erf,
Clip, Where, Max/Min, Sum, Mean, Mod, Cast, CastLike, Dropout.
"""

from __future__ import annotations

import math

from onnxtrain.autodiff.context import GradContext
from onnxtrain.autodiff.registry import register
from onnxtrain.ir.torch_records import is_detach

# ctx.dy[0] is the gradient of the (single) output; ctx.y[0] the forward output, reused where it helps.


@register("Add")
def add(ctx: GradContext):
    dy = ctx.dy[0]
    return ctx.unbroadcast(dy, ctx.x[0]), ctx.unbroadcast(dy, ctx.x[1])


@register("Sub")
def sub(ctx: GradContext):
    dy = ctx.dy[0]
    return ctx.unbroadcast(dy, ctx.x[0]), ctx.unbroadcast(ctx.op.Neg(dy), ctx.x[1])


@register("Mul")
def mul(ctx: GradContext):
    (a, b), dy = ctx.x, ctx.dy[0]
    return ctx.unbroadcast(ctx.op.Mul(dy, b), a), ctx.unbroadcast(ctx.op.Mul(dy, a), b)


@register("Div")
def div(ctx: GradContext):
    (a, b), dy, y = ctx.x, ctx.dy[0], ctx.y[0]
    da = ctx.op.Div(dy, b)                      # d(a/b)/da = 1/b
    db = ctx.op.Neg(ctx.op.Mul(da, y))          # d(a/b)/db = -a/b^2 = -(1/b) * y
    return ctx.unbroadcast(da, a), ctx.unbroadcast(db, b)


@register("Neg")
def neg(ctx: GradContext):
    return (ctx.op.Neg(ctx.dy[0]),)


@register("Identity")
def identity(ctx: GradContext):
    """dx = dy, except for a torch ``detach()`` the dynamo exporter recorded on it: no gradient, as in torch."""
    return (None,) if is_detach(ctx.node) else (ctx.dy[0],)


@register("Cast")
def cast(ctx: GradContext):
    x = ctx.x[0]
    if not ctx.is_float(x):
        return (None,)
    return (ctx.op.Cast(ctx.dy[0], to=ctx.elem_type(x)),)


@register("Abs")
def abs_(ctx: GradContext):
    return (ctx.op.Mul(ctx.dy[0], ctx.op.Sign(ctx.x[0])),)


@register("Exp")
def exp(ctx: GradContext):
    return (ctx.op.Mul(ctx.dy[0], ctx.y[0]),)


@register("Log")
def log(ctx: GradContext):
    return (ctx.op.Div(ctx.dy[0], ctx.x[0]),)


@register("Sqrt")
def sqrt(ctx: GradContext):
    y = ctx.y[0]
    return (ctx.op.Div(ctx.dy[0], ctx.op.Mul(y, ctx.const_like(2.0, y))),)                  # 1 / (2 sqrt(x))


@register("Reciprocal")
def reciprocal(ctx: GradContext):
    y = ctx.y[0]
    return (ctx.op.Neg(ctx.op.Mul(ctx.dy[0], ctx.op.Mul(y, y))),)                              # -1/x^2


@register("Pow")
def pow_(ctx: GradContext):
    (a, b), dy, y = ctx.x, ctx.dy[0], ctx.y[0]
    b_like_a = b if ctx.elem_type(b) == ctx.elem_type(a) else ctx.op.Cast(b, to=ctx.elem_type(a))
    da = ctx.op.Mul(dy, ctx.op.Mul(b_like_a, ctx.op.Pow(a, ctx.op.Sub(b_like_a, ctx.const_like(1.0, a)))))
    db = None
    if ctx.is_float(b):
        db = ctx.op.Mul(dy, ctx.op.Mul(y, ctx.op.Log(a)))                                       # a^b ln a
        db = ctx.unbroadcast(db, b)
        if ctx.elem_type(b) != ctx.elem_type(a):
            db = ctx.op.Cast(db, to=ctx.elem_type(b))
    return ctx.unbroadcast(da, a), db


@register("Erf")
def erf(ctx: GradContext):
    x = ctx.x[0]
    gauss = ctx.op.Exp(ctx.op.Neg(ctx.op.Mul(x, x)))
    return (ctx.op.Mul(ctx.dy[0], ctx.op.Mul(gauss, ctx.const_like(2.0 / math.sqrt(math.pi), x))),)


@register("Clip")
def clip(ctx: GradContext):
    """Gradient passes where min < y < max, as torch's hardtanh and ReLU6.

    The mask is read from the output alone so the input can be freed after the forward: in MobileNetV2 the
    input is BatchNormalization's output, read by nothing else (comparing x with y kept 35 of them alive,
    ~70 MiB at the step's peak). Only a bound present on the node is tested. torch.clamp also passes the
    gradient at x exactly equal to a bound; the two conventions differ only there.
    """
    y, dy = ctx.y[0], ctx.dy[0]
    low = _clip_bound(ctx, 1, "min")
    high = _clip_bound(ctx, 2, "max")
    tests = ([ctx.op.Greater(y, low)] if low else []) + ([ctx.op.Less(y, high)] if high else [])
    if not tests:
        return dy, None, None
    inside = tests[0] if len(tests) == 1 else ctx.op.And(*tests)
    return ctx.keep(dy, inside), None, None


def _clip_bound(ctx: GradContext, index: int, attribute: str) -> str | None:
    """The bound as a tensor name: input ``index`` (opset >= 11) or the attribute (opset < 11), None if absent."""
    if len(ctx.x) > index and ctx.x[index]:
        return ctx.x[index]
    value = ctx.attr(attribute)
    return None if value is None else ctx.const_like(float(value), ctx.y[0])


@register("Where")
def where(ctx: GradContext):
    cond, a, b = ctx.x
    da = ctx.keep(ctx.dy[0], cond)
    db = ctx.keep(ctx.dy[0], ctx.op.Not(cond))
    return None, ctx.unbroadcast(da, a), ctx.unbroadcast(db, b)


def _select_gradient(ctx: GradContext):
    """Max/Min: the gradient goes to the input(s) equal to the output (split evenly between ties)."""
    y, dy = ctx.y[0], ctx.dy[0]
    hits = [ctx.op.Cast(ctx.op.Equal(x, y), to=ctx.elem_type(y)) for x in ctx.x]
    count = hits[0] if len(hits) == 1 else ctx.op.Sum(*hits)
    share = ctx.op.Div(dy, count)
    return [ctx.unbroadcast(ctx.op.Mul(share, h), x) for h, x in zip(hits, ctx.x)]


register("Max", "Min")(_select_gradient)


@register("Sum")
def sum_(ctx: GradContext):
    return [ctx.unbroadcast(ctx.dy[0], x) for x in ctx.x]


@register("Dropout")
def dropout(ctx: GradContext):
    """dX = dY * mask / (1 - ratio) in training mode; dX = dY otherwise."""
    x = ctx.x[0]
    flag = ctx.x[2] if len(ctx.x) > 2 and ctx.x[2] else None
    if flag is None or (ctx.const_value(flag) is not None and not bool(ctx.const_value(flag))):
        return ctx.dy[0], None, None
    ratio = ctx.x[1] if len(ctx.x) > 1 and ctx.x[1] else ctx.const_like(0.5, x)
    if ctx.const_value(ratio) is not None and float(ctx.const_value(ratio)) == 0.0:
        return ctx.dy[0], None, None  # ratio 0 keeps every element unscaled (exporters write it for p=0)
    mask = ctx.op.Cast(ctx.forward_output(1, "mask"), to=ctx.elem_type(x))
    one = ctx.const_like(1.0, x)
    scale = ctx.op.Div(one, ctx.op.Sub(one, ctx.op.Cast(ratio, to=ctx.elem_type(x))))
    if ctx.const_value(flag) is None:  # decided at run time: no scaling when the flag is off
        scale = ctx.op.Where(flag, scale, one)
    return ctx.op.Mul(ctx.op.Mul(ctx.dy[0], mask), scale), None, None


@register("Mean")
def mean(ctx: GradContext):
    """y = (x_1 + ... + x_n) / n."""
    share = ctx.op.Div(ctx.dy[0], ctx.const_like(float(len(ctx.x)), ctx.y[0]))
    return [ctx.unbroadcast(share, x) for x in ctx.x]


@register("CastLike")
def cast_like(ctx: GradContext):
    """dX is dY cast back to the type of x; the target only lends its type."""
    x = ctx.x[0]
    if not ctx.is_float(x):
        return None, None
    return ctx.op.Cast(ctx.dy[0], to=ctx.elem_type(x)), None


@register("Mod")
def mod(ctx: GradContext):
    """a mod b = a - b q with q = floor(a / b) (fmod=0) or trunc(a / b) (fmod=1), constant almost everywhere:
    da = dY, db = -dY q. Integer Mod has no gradient."""
    (a, b), dy, op = ctx.x, ctx.dy[0], ctx.op
    if not ctx.is_float(a):
        return None, None
    ratio = op.Div(a, b)
    q = op.Floor(ratio)
    if ctx.attr("fmod", 0):      # trunc: round toward zero
        q = op.Where(op.Less(ratio, ctx.const_like(0.0, a)), op.Ceil(ratio), q)
    return ctx.unbroadcast(dy, a), ctx.unbroadcast(op.Neg(op.Mul(dy, q)), b)
