"""Execution backends: onnxruntime (default) and onnx.reference (pure Python)."""

from __future__ import annotations

import onnx

from onnxtrain.runtime.backends.base import Session, TensorMeta

__all__ = ["Session", "TensorMeta", "open_session", "DEVICES", "check_device"]

DEVICES = ("cpu", "ort", "onnxruntime", "reference", "python")


def check_device(device: str) -> None:
    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r}: expected 'cpu' (onnxruntime) or 'reference' (onnx.reference)")


def open_session(model: onnx.ModelProto, device: str = "cpu", session_options=None) -> Session:
    """A session for ``model`` on ``device``: "cpu" (onnxruntime) or "reference" (onnx.reference)."""
    check_device(device)
    if device in ("cpu", "ort", "onnxruntime"):
        from onnxtrain.runtime.backends.ort import OrtSession

        return OrtSession(model, session_options)
    from onnxtrain.runtime.backends.reference import ReferenceSession

    return ReferenceSession(model)
