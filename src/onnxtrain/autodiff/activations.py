"""Gradients of activation functions. Each rule is dX = dY * f'(x), with f' written from x or the output y;
Softmax and LogSoftmax, whose Jacobian mixes the axis, are here too.
"""

from __future__ import annotations

import math

from onnxtrain.autodiff.context import GradContext
from onnxtrain.autodiff.registry import register, register_zero_gradient


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


@register("Softmax")
def softmax(ctx: GradContext):
    """dX = y * (dY - sum(dY * y))  along the softmax axis."""
    y, dy = ctx.y[0], ctx.dy[0]
    axis = ctx.attr("axis", -1)
    s = ctx.b.reduce("ReduceSum", ctx.op.Mul(dy, y), [axis], keepdims=True)
    return (ctx.op.Mul(y, ctx.op.Sub(dy, s)),)


@register("LogSoftmax")
def log_softmax(ctx: GradContext):
    """dX = dY - softmax(x) * sum(dY)  along the axis."""
    y, dy = ctx.y[0], ctx.dy[0]
    axis = ctx.attr("axis", -1)
    s = ctx.b.reduce("ReduceSum", dy, [axis], keepdims=True)
    return (ctx.op.Sub(dy, ctx.op.Mul(ctx.op.Exp(y), s)),)


@register("Relu")
def relu(ctx: GradContext):
    x, y = ctx.x[0], ctx.y[0]
    return (ctx.keep(ctx.dy[0], ctx.op.Greater(y, ctx.const_like(0.0, x))),)


@register("LeakyRelu")
def leaky_relu(ctx: GradContext):
    x, alpha = ctx.x[0], ctx.attr("alpha", 0.01)
    positive = ctx.op.Cast(ctx.op.Greater(x, ctx.const_like(0.0, x)), to=ctx.elem_type(x))
    slope = ctx.op.Add(ctx.const_like(alpha, x), ctx.op.Mul(positive, ctx.const_like(1.0 - alpha, x)))  # 1 or alpha
    return (ctx.op.Mul(ctx.dy[0], slope),)


@register("Sigmoid")
def sigmoid(ctx: GradContext):
    y = ctx.y[0]
    return (ctx.op.Mul(ctx.dy[0], ctx.op.Mul(y, ctx.op.Sub(ctx.const_like(1.0, y), y))),)   # y (1 - y)


@register("Tanh")
def tanh(ctx: GradContext):
    y = ctx.y[0]
    return (ctx.op.Mul(ctx.dy[0], ctx.op.Sub(ctx.const_like(1.0, y), ctx.op.Mul(y, y))),)   # 1 - y^2


@register("Softplus")
def softplus(ctx: GradContext):
    return (ctx.op.Mul(ctx.dy[0], ctx.op.Sigmoid(ctx.x[0])),)


@register("Gelu")
def gelu(ctx: GradContext):
    """Gelu-20. Exact: d/dx x Phi(x) = Phi(x) + x phi(x). Tanh form: y = x (1 + tanh u) / 2, u = c (x + a x^3)."""
    x, op = ctx.x[0], ctx.op

    def k(value: float) -> str:
        return ctx.const_like(value, x)

    if ctx.attr("approximate", "none") == "tanh":
        c, a = math.sqrt(2.0 / math.pi), 0.044715
        x2 = op.Mul(x, x)
        t = op.Tanh(op.Mul(k(c), op.Add(x, op.Mul(k(a), op.Mul(x2, x)))))
        du = op.Mul(k(c), op.Add(k(1.0), op.Mul(k(3 * a), x2)))                       # du/dx
        sech2 = op.Sub(k(1.0), op.Mul(t, t))
        d = op.Add(op.Mul(k(0.5), op.Add(k(1.0), t)), op.Mul(op.Mul(k(0.5), x), op.Mul(sech2, du)))
        return (op.Mul(ctx.dy[0], d),)
    cdf = op.Mul(k(0.5), op.Add(k(1.0), op.Erf(op.Mul(x, k(1 / math.sqrt(2))))))
    pdf = op.Mul(k(1 / math.sqrt(2 * math.pi)), op.Exp(op.Mul(op.Mul(x, x), k(-0.5))))
    return (op.Mul(ctx.dy[0], op.Add(cdf, op.Mul(x, pdf))),)


register_zero_gradient("Hardmax")      # one-hot of the arg-max: piecewise constant
