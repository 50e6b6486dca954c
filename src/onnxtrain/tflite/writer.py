"""Write trained weights back into a copy of the original .tflite / .circle file.

Only the weights' bytes change: each initializer is written over its buffer's bytes (same size, same place,
so offsets, alignment and every other table stay as they were, for buffers inside the flatbuffer and for
the ones after it in models over 2 GB). Integer and quantized constants are left as they are and listed in
the report. A .tflite can be written as .circle and back by changing the file identifier: circle's tables
read TFLite's the same way.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from onnxtrain.ir.files import atomic_write_bytes
from onnxtrain.tflite.source import SourceRecord

__all__ = ["write_back", "WriteBackReport", "IDENTIFIERS"]

IDENTIFIERS = {"tflite": b"TFL3", "circle": b"CIR0"}


@dataclass
class WriteBackReport:
    path: str
    format: str
    written: list[str]      # initializer names written
    untouched: list[str]    # constant tensors kept as they were (integer or quantized)
    float16: list[str]      # written weights stored as float16 in the file (rounded from the trained float32)

    def summary(self) -> str:
        text = f"wrote {len(self.written)} weight tensors into {self.path} ({self.format})"
        if self.float16:
            text += f" ({len(self.float16)} of them rounded to the file's float16)"
        if self.untouched:
            text += f"; {len(self.untouched)} non-float (integer or quantized) constant tensors left as they were"
        return text


def write_back(record: SourceRecord, weights: Mapping[str, np.ndarray], output: str | os.PathLike,
               format: str | None = None) -> WriteBackReport:
    """Write ``weights`` (initializer name -> float32 array, every weight of ``record``) into a copy of the source
    flatbuffer at ``output``, as ``format`` ("tflite" or "circle"; default: the source's format)."""
    fmt = format or record.format
    if fmt not in IDENTIFIERS:
        raise ValueError(f"format must be one of {', '.join(IDENTIFIERS)}, got {fmt!r}")
    data = bytearray(record.skeleton)
    for name, slot in record.weights.items():
        if name not in weights:
            raise KeyError(f"the trained weights have no tensor {name!r} (TFLite tensor "
                           f"{', '.join(repr(t) for t in slot.tensors)}); export from the artifacts of the model "
                           f"imported from {record.file_name}")
        value = np.asarray(weights[name])
        if list(value.shape) != slot.shape:
            raise ValueError(f"trained weight {name!r} has shape {list(value.shape)}, the {record.format} tensor "
                             f"has {slot.shape}")
        if not np.all(np.isfinite(value)):
            raise ValueError(f"trained weight {name!r} has NaN or infinite values; not writing {os.fspath(output)}")
        raw = np.ascontiguousarray(value, dtype="<f2" if slot.dtype == "float16" else "<f4").tobytes()
        if len(raw) != slot.nbytes:
            raise ValueError(f"trained weight {name!r} is {len(raw)} bytes, its buffer has {slot.nbytes}")
        data[slot.offset:slot.offset + slot.nbytes] = raw
    data[4:8] = IDENTIFIERS[fmt]
    path = os.fspath(output)
    atomic_write_bytes(path, data)
    return WriteBackReport(path, fmt, list(record.weights), list(record.untouched),
                           [n for n, slot in record.weights.items() if slot.dtype == "float16"])
