"""The peer's ``onnxblock.model_accessor`` module: ``base``, ``empty_base``, ``ModelAccessor`` (defined in
:mod:`onnxtrain.blocks.model_accessor`, which ``generate_artifacts`` also builds its loss with)."""

from onnxtrain.blocks.model_accessor import (
    ModelAccessor,
    base,
    current_accessor,
    custom_op_library,
    empty_base,
)

__all__ = ["ModelAccessor", "base", "empty_base", "current_accessor", "custom_op_library"]
