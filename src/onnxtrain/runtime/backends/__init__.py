"""Execution backends: onnxruntime (default) and onnx.reference (pure Python)."""

from __future__ import annotations

import onnx

from onnxtrain.runtime.backends.base import Session, TensorMeta

__all__ = ["Session", "TensorMeta", "open_session", "DEVICES", "check_device"]

DEVICES = ("cpu", "ort", "onnxruntime", "reference", "python")


def check_device(device: str) -> None:
    """ValueError unless ``device`` is one of :data:`DEVICES`."""
    if device not in DEVICES:
        hint = (" (onnxtrain trains on the CPU: the device is the machine that holds the data)"
                if str(device).lower().startswith(("cuda", "gpu", "dml", "rocm")) else "")
        raise ValueError(f"unknown device {device!r}: expected 'cpu' (onnxruntime) or 'reference' "
                         f"(onnx.reference){hint}")


def open_session(model: onnx.ModelProto, device: str = "cpu", session_options=None,
                 memory_arena: bool = True) -> Session:
    """A session for ``model`` on ``device``: "cpu" (onnxruntime) or "reference" (onnx.reference).

    ``session_options`` is used as given except for memory: with ``memory_arena`` (the default) the session
    allocates from one CPU arena shared by every onnxtrain session of the process, else from plain malloc.
    """
    check_device(device)
    if device in ("cpu", "ort", "onnxruntime"):
        from onnxtrain.runtime.backends.ort import OrtSession

        return OrtSession(model, session_options, memory_arena)
    from onnxtrain.runtime.backends.reference import ReferenceSession

    return ReferenceSession(model)
