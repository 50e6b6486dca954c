"""Execution backends: onnxruntime (default) and onnx.reference (pure Python)."""

from __future__ import annotations

import onnx

from onnxtrain.runtime.backends.base import Session, TensorMeta

__all__ = ["Session", "TensorMeta", "open_session"]


def open_session(model: onnx.ModelProto, device: str = "cpu", session_options=None) -> Session:
    """A session for ``model`` on ``device``: "cpu" (onnxruntime) or "reference" (onnx.reference)."""
    if device in ("cpu", "ort", "onnxruntime"):
        from onnxtrain.runtime.backends.ort import OrtSession

        return OrtSession(model, session_options)
    if device in ("reference", "python"):
        from onnxtrain.runtime.backends.reference import ReferenceSession

        return ReferenceSession(model)
    raise ValueError(f"unknown device {device!r}: expected 'cpu' (onnxruntime) or 'reference' (onnx.reference)")
