"""Gradients of the trigonometric and hyperbolic functions.
"""

from __future__ import annotations

from onnxtrain.autodiff.context import GradContext
from onnxtrain.autodiff.registry import register


@register("Sin")
def sin(ctx: GradContext):
    return (ctx.op.Mul(ctx.dy[0], ctx.op.Cos(ctx.x[0])),)


@register("Cos")
def cos(ctx: GradContext):
    return (ctx.op.Neg(ctx.op.Mul(ctx.dy[0], ctx.op.Sin(ctx.x[0]))),)


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
