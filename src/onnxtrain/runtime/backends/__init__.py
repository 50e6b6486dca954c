"""Execution backends: onnxruntime (default) and onnx.reference (pure Python)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx

from onnxtrain.runtime.backends.base import Session, TensorMeta

__all__ = ["Session", "TensorMeta", "open_session", "DEVICES", "check_device", "is_onnxruntime", "names_providers",
           "supports_constants"]

DEVICES = ("cpu", "ort", "onnxruntime", "reference", "python")


def check_device(device: str) -> None:
    """ValueError unless ``device`` is one of :data:`DEVICES`."""
    if device not in DEVICES:
        hint = (" (onnxtrain trains on the CPU: the device is the machine that holds the data)"
                if str(device).lower().startswith(("cuda", "gpu", "dml", "rocm")) else "")
        raise ValueError(f"unknown device {device!r}: expected 'cpu' (onnxruntime) or 'reference' "
                         f"(onnx.reference){hint}")


def is_onnxruntime(device: str) -> bool:
    return device in ("cpu", "ort", "onnxruntime")


def names_providers(session_options) -> bool:
    """Whether onnxruntime ``session_options`` name execution providers of their own (1.22 and later can say)."""
    check = getattr(session_options, "has_providers", None)
    return check is not None and check()


def supports_constants(device: str, session_options) -> bool:
    """Whether sessions on ``device`` with ``session_options`` can take initializers from arrays (``constants`` of
    :func:`open_session`): onnxruntime, with options that name no execution provider of their own."""
    return is_onnxruntime(device) and not names_providers(session_options)


def open_session(model: onnx.ModelProto, device: str = "cpu", session_options=None,
                 memory_arena: bool = True, constants: Mapping[str, np.ndarray] | None = None) -> Session:
    """A session for ``model`` on ``device``: "cpu" (onnxruntime) or "reference" (onnx.reference).

    ``session_options`` is used as given except for memory: with ``memory_arena`` (the default) the session
    allocates from one CPU arena shared by every onnxtrain session of the process, else from plain malloc.
    ``constants``: the arrays of the model's data-less initializers (runtime/passes/frozen_constants.py);
    onnxruntime only.
    """
    check_device(device)
    if is_onnxruntime(device):
        from onnxtrain.runtime.backends.ort import OrtSession

        return OrtSession(model, session_options, memory_arena, constants)
    if constants:
        raise ValueError("initializers supplied by the session need onnxruntime (device='cpu')")
    from onnxtrain.runtime.backends.reference import ReferenceSession

    return ReferenceSession(model)
