"""The table of gradient rules, keyed by ONNX op type.

A rule receives a :class:`GradContext` for one forward node and returns one entry per node input: the name
of that input's gradient, or ``None`` when the input gets no gradient (integer indices, shapes, flags).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from onnxtrain.autodiff.context import GradContext

__all__ = ["GRADIENT_RULES", "register", "register_zero_gradient", "NON_DIFFERENTIABLE", "Rule"]

Rule = Callable[["GradContext"], Sequence["str | None"]]

GRADIENT_RULES: dict[str, Rule] = {}

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
