"""Gradients of activation functions. Each rule is dX = dY * f'(x), with f' written from x or the output y."""

from __future__ import annotations

from onnxtrain.autodiff.context import GradContext
from onnxtrain.autodiff.registry import register


def _scaled(ctx: GradContext, slope: str):
    """dX = dY * slope."""
    return (ctx.op.Mul(ctx.dy[0], slope),)


def _where(ctx: GradContext, cond: str, a: str, b: str) -> str:
    return ctx.op.Where(cond, a, b)


@register("Elu")
def elu(ctx: GradContext):
    """y = x (x > 0), alpha (e^x - 1) otherwise:  y' = 1, or y + alpha."""
    x, y, op = ctx.x[0], ctx.y[0], ctx.op
    alpha = ctx.const_like(ctx.attr("alpha", 1.0), x)
    return _scaled(ctx, op.Where(op.Greater(x, ctx.const_like(0.0, x)), ctx.const_like(1.0, x), op.Add(y, alpha)))


@register("Celu")
def celu(ctx: GradContext):
    """y = max(0, x) + min(0, alpha (e^(x/alpha) - 1)):  y' = 1 (x > 0), e^(x/alpha) otherwise."""
    x, op = ctx.x[0], ctx.op
    alpha = ctx.const_like(ctx.attr("alpha", 1.0), x)
    return _scaled(ctx, op.Where(op.Greater(x, ctx.const_like(0.0, x)), ctx.const_like(1.0, x),
                                 op.Exp(op.Div(x, alpha))))


@register("Selu")
def selu(ctx: GradContext):
    """y = gamma x (x > 0), gamma alpha (e^x - 1) otherwise:  y' = gamma, or y + gamma alpha."""
    x, y, op = ctx.x[0], ctx.y[0], ctx.op
    alpha, gamma = ctx.attr("alpha", 1.67326319217681884765625), ctx.attr("gamma", 1.05070102214813232421875)
    return _scaled(ctx, op.Where(op.Greater(x, ctx.const_like(0.0, x)), ctx.const_like(gamma, x),
                                 op.Add(y, ctx.const_like(gamma * alpha, x))))


@register("ThresholdedRelu")
def thresholded_relu(ctx: GradContext):
    """y = x (x > alpha), 0 otherwise."""
    x = ctx.x[0]
    keep = ctx.op.Greater(x, ctx.const_like(ctx.attr("alpha", 1.0), x))
    return (ctx.op.Where(keep, ctx.dy[0], ctx.const_like(0.0, x)),)


@register("Shrink")
def shrink(ctx: GradContext):
    """y = x -/+ bias outside [-lambd, lambd], 0 inside:  y' = 1 outside."""
    x, op, lambd = ctx.x[0], ctx.op, ctx.attr("lambd", 0.5)
    outside = op.Or(op.Less(x, ctx.const_like(-lambd, x)), op.Greater(x, ctx.const_like(lambd, x)))
    return (op.Where(outside, ctx.dy[0], ctx.const_like(0.0, x)),)


@register("HardSigmoid")
def hard_sigmoid(ctx: GradContext):
    """y = clip(alpha x + beta, 0, 1):  y' = alpha where 0 < alpha x + beta < 1."""
    x, op = ctx.x[0], ctx.op
    alpha, beta = ctx.attr("alpha", 0.2), ctx.attr("beta", 0.5)
    z = op.Add(op.Mul(x, ctx.const_like(alpha, x)), ctx.const_like(beta, x))
    inside = op.And(op.Greater(z, ctx.const_like(0.0, x)), op.Less(z, ctx.const_like(1.0, x)))
    return (op.Where(inside, op.Mul(ctx.dy[0], ctx.const_like(alpha, x)), ctx.const_like(0.0, x)),)


@register("HardSwish")
def hard_swish(ctx: GradContext):
    """y = x hardsigmoid(x) with alpha = 1/6, beta = 1/2:  y' = x/3 + 1/2 on (-3, 3), 1 above, 0 below."""
    x, op = ctx.x[0], ctx.op
    inside = op.Add(op.Div(x, ctx.const_like(3.0, x)), ctx.const_like(0.5, x))
    above = op.Where(op.GreaterOrEqual(x, ctx.const_like(3.0, x)), ctx.const_like(1.0, x), ctx.const_like(0.0, x))
    slope = op.Where(op.And(op.Greater(x, ctx.const_like(-3.0, x)), op.Less(x, ctx.const_like(3.0, x))), inside, above)
    return _scaled(ctx, slope)


@register("Softsign")
def softsign(ctx: GradContext):
    """y = x / (1 + |x|):  y' = 1 / (1 + |x|)^2."""
    x, op = ctx.x[0], ctx.op
    d = op.Add(ctx.const_like(1.0, x), op.Abs(x))
    return (op.Div(ctx.dy[0], op.Mul(d, d)),)


@register("Mish")
def mish(ctx: GradContext):
    """y = x tanh(softplus(x)):  y' = t + x (1 - t^2) sigmoid(x),  t = tanh(softplus(x))."""
    x, op = ctx.x[0], ctx.op
    t = op.Tanh(op.Softplus(x))
    sech2 = op.Sub(ctx.const_like(1.0, x), op.Mul(t, t))
    return _scaled(ctx, op.Add(t, op.Mul(op.Mul(x, sech2), op.Sigmoid(x))))


@register("Swish")
def swish(ctx: GradContext):
    """y = x s, s = sigmoid(alpha x):  y' = s + alpha x s (1 - s) = s + alpha y (1 - s)."""
    x, y, op = ctx.x[0], ctx.y[0], ctx.op
    alpha = ctx.attr("alpha", 1.0)
    s = op.Sigmoid(op.Mul(x, ctx.const_like(alpha, x)) if alpha != 1.0 else x)
    ay = op.Mul(y, ctx.const_like(alpha, x)) if alpha != 1.0 else y
    return _scaled(ctx, op.Add(s, op.Mul(ay, op.Sub(ctx.const_like(1.0, x), s))))


@register("PRelu")
def prelu(ctx: GradContext):
    """y = x (x > 0), slope x otherwise; slope broadcasts to x."""
    (x, slope), dy, op = ctx.x, ctx.dy[0], ctx.op
    positive = op.Greater(x, ctx.const_like(0.0, x))
    zero = ctx.const_like(0.0, x)
    dx = op.Where(positive, dy, op.Mul(dy, slope))
    dslope = op.Where(positive, zero, op.Mul(dy, x))
    return dx, ctx.unbroadcast(dslope, slope)
