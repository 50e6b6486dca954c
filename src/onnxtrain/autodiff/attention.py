"""Gradients of the transformer ops: RotaryEmbedding (a rule) and Attention (its spec function body).

Attention (opset 23+) has no rule of its own: the spec defines it by a context-dependent function body
(scaling, masks, causal masking, softcap, grouped heads, past key/value), and the function-body fallback
recomputes and differentiates exactly that, with every option the node uses.
"""

from __future__ import annotations

from onnxtrain.autodiff.context import GradContext
from onnxtrain.autodiff.function_body import differentiate_function_body
from onnxtrain.autodiff.registry import register


@register("RotaryEmbedding")
def rotary_embedding(ctx: GradContext):
    """Each rotated pair is (x1 cos - x2 sin, x2 cos + x1 sin): a rotation by the position's angle, whose
    transpose is the rotation by minus that angle. So dX = RotaryEmbedding(dY, cos, -sin, position_ids).
    The caches (constants in practice) get their gradients from the spec's function body."""
    x, cos, sin = ctx.x[:3]
    position_ids = ctx.x[3] if len(ctx.x) > 3 and ctx.x[3] else None
    attrs = {k: ctx.attr(k) for k in ("interleaved", "num_heads", "rotary_embedding_dim")}
    dx = ctx.op.RotaryEmbedding(ctx.dy[0], cos, ctx.op.Neg(sin), position_ids, **attrs)
    dcos = dsin = None
    if ctx.const_value(cos) is None or ctx.const_value(sin) is None:
        _, dcos, dsin, *_ = differentiate_function_body(ctx)
    return dx, dcos, dsin, None
