"""The table of gradient rules, keyed by ONNX op type.

A rule receives a :class:`GradContext` for one forward node and returns one entry per node input: the name
of that input's gradient, or ``None`` when the input gets no gradient (integer indices, shapes, flags).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx

    from onnxtrain.autodiff.context import GradContext

__all__ = ["GRADIENT_RULES", "register", "register_zero_gradient", "register_fallback", "lookup",
           "NON_DIFFERENTIABLE", "Rule"]

Rule = Callable[["GradContext"], Sequence["str | None"]]

GRADIENT_RULES: dict[str, Rule] = {}

# Tried in order for a default-domain op without a rule (the ONNX function-body expansion registers itself):
# each returns a rule for the node at the model's opset, or None.
_FALLBACKS: list[Callable[[onnx.NodeProto, int], Rule | None]] = []

# Ops whose outputs are integer or boolean (or piecewise constant): their inputs get no gradient.
NON_DIFFERENTIABLE: set[str] = set()


def register(*op_types: str) -> Callable[[Rule], Rule]:
    """Decorator: register ``rule`` as the gradient of each op type in ``op_types``."""

    def wrap(rule: Rule) -> Rule:
        for op_type in op_types:
            if op_type in GRADIENT_RULES:
                raise ValueError(f"a gradient rule for {op_type!r} is already registered")
            GRADIENT_RULES[op_type] = rule
        return rule

    return wrap


def register_zero_gradient(*op_types: str) -> None:
    """Ops that are differentiable almost nowhere or piecewise constant: every input gets no gradient."""
    for op_type in op_types:
        NON_DIFFERENTIABLE.add(op_type)
        GRADIENT_RULES[op_type] = lambda ctx: [None] * len(ctx.x)


def register_fallback(fallback: Callable[[onnx.NodeProto, int], Rule | None]) -> None:
    """Add a way to differentiate ops without a rule (tried after the table, in registration order)."""
    _FALLBACKS.append(fallback)


def lookup(node: onnx.NodeProto, opset: int) -> Rule | None:
    """The rule for ``node``: its op type's, else the first fallback's (a function body), else None.
    Only default-domain ops are differentiated."""
    if node.domain not in ("", "ai.onnx"):
        return None
    rule = GRADIENT_RULES.get(node.op_type)
    if rule is not None:
        return rule
    for fallback in _FALLBACKS:
        rule = fallback(node, opset)
        if rule is not None:
            return rule
    return None
