"""Gradients of elementwise math: trigonometric and hyperbolic functions, Mean, CastLike, Mod."""

from __future__ import annotations

from onnxtrain.autodiff.context import GradContext
from onnxtrain.autodiff.registry import register, register_zero_gradient

register_zero_gradient("Hardmax")      # one-hot of the arg-max: piecewise constant


def _one(ctx: GradContext) -> str:
    return ctx.const_like(1.0, ctx.x[0])


@register("Tan")
def tan(ctx: GradContext):
    """tan' = 1 + tan^2."""
    y = ctx.y[0]
    return (ctx.op.Mul(ctx.dy[0], ctx.op.Add(_one(ctx), ctx.op.Mul(y, y))),)


@register("Asin")
def asin(ctx: GradContext):
    """asin' = 1 / sqrt(1 - x^2)."""
    x = ctx.x[0]
    return (ctx.op.Div(ctx.dy[0], ctx.op.Sqrt(ctx.op.Sub(_one(ctx), ctx.op.Mul(x, x)))),)


@register("Acos")
def acos(ctx: GradContext):
    """acos' = -1 / sqrt(1 - x^2)."""
    x = ctx.x[0]
    return (ctx.op.Neg(ctx.op.Div(ctx.dy[0], ctx.op.Sqrt(ctx.op.Sub(_one(ctx), ctx.op.Mul(x, x))))),)


@register("Atan")
def atan(ctx: GradContext):
    """atan' = 1 / (1 + x^2)."""
    x = ctx.x[0]
    return (ctx.op.Div(ctx.dy[0], ctx.op.Add(_one(ctx), ctx.op.Mul(x, x))),)


@register("Sinh")
def sinh(ctx: GradContext):
    """sinh' = cosh."""
    return (ctx.op.Mul(ctx.dy[0], ctx.op.Cosh(ctx.x[0])),)


@register("Cosh")
def cosh(ctx: GradContext):
    """cosh' = sinh."""
    return (ctx.op.Mul(ctx.dy[0], ctx.op.Sinh(ctx.x[0])),)


@register("Asinh")
def asinh(ctx: GradContext):
    """asinh' = 1 / sqrt(x^2 + 1)."""
    x = ctx.x[0]
    return (ctx.op.Div(ctx.dy[0], ctx.op.Sqrt(ctx.op.Add(ctx.op.Mul(x, x), _one(ctx)))),)


@register("Acosh")
def acosh(ctx: GradContext):
    """acosh' = 1 / sqrt(x^2 - 1)."""
    x = ctx.x[0]
    return (ctx.op.Div(ctx.dy[0], ctx.op.Sqrt(ctx.op.Sub(ctx.op.Mul(x, x), _one(ctx)))),)


@register("Atanh")
def atanh(ctx: GradContext):
    """atanh' = 1 / (1 - x^2)."""
    x = ctx.x[0]
    return (ctx.op.Div(ctx.dy[0], ctx.op.Sub(_one(ctx), ctx.op.Mul(x, x))),)


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
