"""Train TensorFlow Lite (.tflite) and circle (.circle) models: import to ONNX, write trained weights back.

`import_model` needs the `tflite` / `circle-schema` packages (extra `tflite`); `write_back` needs only numpy.
See docs/tflite.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = ["import_model", "write_back", "SourceRecord", "WriteBackReport"]

if TYPE_CHECKING:
    from onnxtrain.tflite.importer import import_model
    from onnxtrain.tflite.source import SourceRecord
    from onnxtrain.tflite.writer import WriteBackReport, write_back


def __getattr__(name: str):
    if name == "import_model":
        from onnxtrain.tflite.importer import import_model

        return import_model
    if name == "SourceRecord":
        from onnxtrain.tflite.source import SourceRecord

        return SourceRecord
    if name in ("write_back", "WriteBackReport"):
        from onnxtrain.tflite import writer

        return getattr(writer, name)
    raise AttributeError(f"module 'onnxtrain.tflite' has no attribute {name!r}")
