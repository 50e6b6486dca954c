"""The project's own error types: every failure a user can cause surfaces as one of these."""

__all__ = [
    "OnnxTrainError",
    "UnsupportedOpError",
    "CheckpointError",
    "InputError",
    "NonFiniteError",
    "ArtifactError",
    "ExecutionError",
    "PassError",
    "LoRAError",
    "UnknownShapeError",
    "InvalidModelError",
    "first_line",
]


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (at most 300 characters), or its type name: what an error of
    onnxtrain's quotes of an engine's or a checker's."""
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


class OnnxTrainError(Exception):
    """Base class of every error onnxtrain raises on purpose."""


class UnsupportedOpError(OnnxTrainError, NotImplementedError):
    """An op on the path from a trainable parameter to the loss has no gradient rule."""


class CheckpointError(OnnxTrainError, ValueError):
    """A checkpoint file is missing, truncated, altered, or does not match the model."""


class InputError(OnnxTrainError, ValueError):
    """An input given to a training or eval step has the wrong count, dtype or shape."""


class NonFiniteError(OnnxTrainError, FloatingPointError):
    """The loss or a gradient is NaN or infinite."""


class ArtifactError(OnnxTrainError, ValueError):
    """A training, eval or optimizer model is missing, unreadable, or not one onnxtrain can run."""


class ExecutionError(OnnxTrainError, RuntimeError):
    """The engine stopped while running a graph (for example an index out of range: a class label not below
    the number of classes); the message names the step, the node's op type and what the engine said."""


class PassError(OnnxTrainError, RuntimeError):
    """A graph pass cannot rewrite the model it was given, or produced a model that breaks its postconditions
    (the ONNX checker, the default domain only)."""


class LoRAError(OnnxTrainError, ValueError):
    """A LoRA configuration or adapter file does not fit the model: a target that matches no weight, initial
    values of the wrong shape, an adapter feature onnxtrain does not reproduce, a model without adapters."""


class UnknownShapeError(OnnxTrainError, ValueError):
    """A gradient rule needs the rank or shape of a value that ONNX shape inference could not infer (typically
    because a model input has no shape)."""


class InvalidModelError(OnnxTrainError, ValueError):
    """The forward model given to ``generate_artifacts`` is not valid ONNX: the ONNX checker (with shape
    inference) rejects it before any of onnxtrain's changes, so no artifact built from it could pass."""
