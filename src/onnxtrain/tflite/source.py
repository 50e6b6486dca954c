"""What an imported model remembers of its flatbuffer, so the trained weights can be written back into it.

The record travels in the ONNX model's ``metadata_props`` (and from there into the training model, see
``onnxtrain generate``): the format, the original file's name, size and SHA-256, where each weight's bytes are
in the file, and the file itself with those bytes zeroed and zlib-compressed (the "skeleton": the graph,
operators, quantized and integer constants as they were, at a fraction of the size). This module is
runtime-safe: numpy and the standard library only.
"""

from __future__ import annotations

import base64
import hashlib
import json
import zlib
from dataclasses import asdict, dataclass, field

import onnx

__all__ = ["SourceRecord", "WeightSlot", "RECORD_KEY", "SKELETON_KEY", "has_source"]

RECORD_KEY = "onnxtrain.tflite.source"
SKELETON_KEY = "onnxtrain.tflite.skeleton"


@dataclass
class WeightSlot:
    """Where one initializer's bytes live in the flatbuffer (all tensors sharing its buffer), and their type:
    float32, or float16 (the trained float32 values are rounded to it on export)."""

    offset: int
    nbytes: int
    shape: list[int]
    tensors: list[str]
    dtype: str = "float32"


@dataclass
class SourceRecord:
    format: str                                  # "tflite" or "circle"
    file_name: str
    size: int
    sha256: str
    weights: dict[str, WeightSlot]               # initializer name -> its place in the file
    untouched: list[str] = field(default_factory=list)  # constant tensors not written back (integer, quantized)
    operators: list[list[str]] = field(default_factory=list)  # per TFLite operator, in order: the weights it reads
    skeleton: bytes = b""                        # the file with the weights' bytes zeroed

    @classmethod
    def from_file_bytes(cls, fmt: str, file_name: str, data: bytes, weights: dict[str, WeightSlot],
                        untouched: list[str], operators: list[list[str]]) -> SourceRecord:
        skeleton = bytearray(data)
        for slot in weights.values():
            skeleton[slot.offset:slot.offset + slot.nbytes] = bytes(slot.nbytes)
        return cls(fmt, file_name, len(data), hashlib.sha256(data).hexdigest(), weights, untouched, operators,
                   bytes(skeleton))

    def trainable_weights(self, trainable_ops: int) -> list[str]:
        """The weights of the last ``trainable_ops`` TFLite operators (onert_train's --num_of_trainable_ops;
        -1 = all), in operator order; scalar constants (a pad value, the 1 in ``1 + x``) are not weights."""
        if trainable_ops > len(self.operators):
            raise ValueError(f"trainable_ops={trainable_ops} but {self.file_name} has only {len(self.operators)} "
                             f"operators")
        ops = self.operators if trainable_ops < 0 else self.operators[len(self.operators) - trainable_ops:] \
            if trainable_ops else []
        return list(dict.fromkeys(w for op in ops for w in op if self.weights[w].shape))

    def to_props(self) -> dict[str, str]:
        record = asdict(self)
        del record["skeleton"]
        return {RECORD_KEY: json.dumps(record),
                SKELETON_KEY: base64.b64encode(zlib.compress(self.skeleton, 9)).decode("ascii")}

    def attach(self, model: onnx.ModelProto) -> None:
        """Store the record in ``model``'s metadata_props, replacing an earlier one."""
        props = self.to_props()
        for prop in [p for p in model.metadata_props if p.key in props]:
            model.metadata_props.remove(prop)
        for key, value in props.items():
            model.metadata_props.add(key=key, value=value)

    @classmethod
    def from_model(cls, model: onnx.ModelProto, what: str = "the model") -> SourceRecord:
        props = {p.key: p.value for p in model.metadata_props}
        if RECORD_KEY not in props or SKELETON_KEY not in props:
            raise ValueError(f"{what} was not imported from a .tflite or .circle file (no {RECORD_KEY} metadata); "
                             f"import one with `onnxtrain import MODEL.tflite -o model.onnx`")
        record = json.loads(props[RECORD_KEY])
        record["weights"] = {k: WeightSlot(**v) for k, v in record["weights"].items()}
        skeleton = zlib.decompress(base64.b64decode(props[SKELETON_KEY]))
        if len(skeleton) != record["size"]:
            raise ValueError(f"{what}: the stored {record['format']} skeleton has {len(skeleton)} bytes, the record "
                             f"says {record['size']}")
        return cls(**record, skeleton=skeleton)


def has_source(model: onnx.ModelProto) -> bool:
    """Whether ``model`` carries a flatbuffer record (it was imported, or generated from an imported model)."""
    return any(p.key == RECORD_KEY for p in model.metadata_props)

