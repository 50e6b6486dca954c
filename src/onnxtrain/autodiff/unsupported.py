"""Ops whose gradient is refused on purpose, each with the reason and the fix.

A refused op has a rule that raises :class:`UnsupportedOpError` naming the op, the node, why, and what to
do; ``coverage`` lists it as unsupported with that reason.
"""

from __future__ import annotations

from onnxtrain.autodiff.context import GradContext
from onnxtrain.autodiff.registry import register
from onnxtrain.errors import UnsupportedOpError

__all__ = ["UNSUPPORTED", "refuse"]

# op type -> the reason and the fix, as the error states them
UNSUPPORTED: dict[str, str] = {}


def refuse(op_type: str, reason: str) -> None:
    """Register a rule for ``op_type`` that raises ``reason`` (which should end with ``- help: <the fix>``)."""
    UNSUPPORTED[op_type] = reason

    def rule(ctx: GradContext):
        raise UnsupportedOpError(f"{op_type} node {ctx.node.name!r}: {reason}")

    register(op_type)(rule)


_CONVERT = "- help: convert the model to a newer opset, e.g. onnx.version_converter.convert_version(model, 17)"
refuse("Scatter", "Scatter (deprecated in opset 11) has no gradient: its gradient needs GatherElements, which "
                  f"opsets 9 and 10 lack; converted, it becomes ScatterElements, which has one. {_CONVERT}")
refuse("Upsample", "Upsample (deprecated in opset 10) has no gradient; converted, it becomes Resize, which has one. "
                   f"{_CONVERT}")
