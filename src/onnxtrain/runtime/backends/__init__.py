"""Execution backends: onnxruntime (default) and onnx.reference (pure Python)."""

from __future__ import annotations

import onnx

from onnxtrain.runtime.backends.base import Session, TensorMeta

__all__ = ["Session", "TensorMeta", "open_session", "DEVICES", "check_device"]

DEVICES = ("cpu", "ort", "onnxruntime", "reference", "python")


def check_device(device: str) -> None:
    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r}: expected 'cpu' (onnxruntime) or 'reference' (onnx.reference)")


def open_session(model: onnx.ModelProto, device: str = "cpu", session_options=None,
                 memory_arena: bool = False) -> Session:
    """A session for ``model`` on ``device``: "cpu" (onnxruntime) or "reference" (onnx.reference).

    ``session_options`` is used as given except that onnxruntime's CPU memory arena is switched off unless
    ``memory_arena`` is True.
    """
    check_device(device)
    if device in ("cpu", "ort", "onnxruntime"):
        from onnxtrain.runtime.backends.ort import OrtSession

        return OrtSession(model, session_options, memory_arena)
    from onnxtrain.runtime.backends.reference import ReferenceSession

    return ReferenceSession(model)
