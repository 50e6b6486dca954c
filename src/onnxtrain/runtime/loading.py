"""Reading artifacts and opening sessions on them, with errors that name the artifact."""

from __future__ import annotations

import os

import onnx

from onnxtrain.errors import ArtifactError
from onnxtrain.runtime.backends import check_device, open_session
from onnxtrain.runtime.engine_errors import first_line

__all__ = ["load_model", "open_artifact_session"]


def load_model(uri: str | os.PathLike | bytes | onnx.ModelProto, what: str) -> onnx.ModelProto:
    """Read an artifact; a missing or unreadable file is a clear error (FileNotFoundError, ArtifactError)."""
    if isinstance(uri, onnx.ModelProto):
        return uri
    try:
        if isinstance(uri, bytes):
            return onnx.load_from_string(uri)
        path = os.fspath(uri)
        if not os.path.exists(path):
            raise FileNotFoundError(f"{what} not found: {path}")
        return onnx.load(path)
    except FileNotFoundError:
        raise
    except Exception as exc:  # protobuf and onnx raise several types for a file that is not a model
        raise ArtifactError(f"cannot read the {what} {uri!r}: it is not a valid ONNX model "
                            f"({first_line(exc)})") from None


def open_artifact_session(model: onnx.ModelProto, what: str, device: str, session_options):
    """A session for an artifact; an engine that rejects the model gives an ArtifactError, not its traceback."""
    check_device(device)
    try:
        return open_session(model, device, session_options)
    except Exception as exc:  # onnxruntime raises its own exception types for invalid graphs
        raise ArtifactError(f"the {what} cannot be loaded: {first_line(exc)}") from None
