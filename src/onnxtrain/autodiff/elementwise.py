"""Gradients of elementwise ops: arithmetic (with broadcasting), activations and unary math."""

from __future__ import annotations

import math

from onnxtrain.autodiff.context import GradContext
from onnxtrain.autodiff.registry import register

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
    return (ctx.dy[0],)


@register("Cast")
def cast(ctx: GradContext):
    x = ctx.x[0]
    if not ctx.is_float(x):
        return (None,)
    return (ctx.op.Cast(ctx.dy[0], to=ctx.elem_type(x)),)


@register("Abs")
def abs_(ctx: GradContext):
    return (ctx.op.Mul(ctx.dy[0], ctx.op.Sign(ctx.x[0])),)


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


@register("Sin")
def sin(ctx: GradContext):
    return (ctx.op.Mul(ctx.dy[0], ctx.op.Cos(ctx.x[0])),)


@register("Cos")
def cos(ctx: GradContext):
    return (ctx.op.Neg(ctx.op.Mul(ctx.dy[0], ctx.op.Sin(ctx.x[0]))),)


@register("Clip")
def clip(ctx: GradContext):
    """Gradient passes where min <= x <= max, as torch.clamp: exactly where Clip left x unchanged, so one
    comparison with the output finds it (3 passes instead of 5 with two bound tests; ReLU6-heavy MobileNetV2
    spends a tenth of its backward here). torch's hardtanh/ReLU6 exclude the bounds themselves; the two
    conventions differ only at x exactly equal to a bound."""
    x, dy = ctx.x[0], ctx.dy[0]
    bounded = any(len(ctx.x) > k and ctx.x[k] for k in (1, 2)) or any(ctx.attr(a) is not None for a in ("min", "max"))
    return (ctx.keep(dy, ctx.op.Equal(x, ctx.y[0])) if bounded else dy, None, None)


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
