"""The ``onnxtrain`` entry of a checkpoint's safetensors metadata: one JSON object.

    {"format_version": 1, "nominal": false, "step": 12,
     "tensors": [["trainable/w", "float32", [2, 3]], ...],         # every tensor, in order
     "properties": [["lr", "float", "3f50624dd2f1a9fc"], ["epoch", "int", "3"], ["tag", "str", "x"]],
     "sha256": {"metadata": "<hex>", "tensors": "<hex>"}}

``tensors`` lists every tensor's key, dtype and shape in the checkpoint's order; for a nominal checkpoint
it is the only record of them. Property values are text: ints in decimal, floats as the 16 hex digits of
their IEEE-754 binary64 bits (so every float, NaN payloads included, comes back bit for bit), strs as is.

``sha256.metadata`` is the digest of the object without ``sha256``, serialized canonically (sorted keys,
no spaces, ASCII). ``sha256.tensors`` is the digest of the tensors' raw little-endian bytes concatenated
in ``tensors`` order. Together with the check that the safetensors header agrees with ``tensors``, they
catch any corruption or accidental edit (they are not a signature: anyone can recompute them).
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from onnxtrain.checkpoint.data import TensorSpec, split_tensor_key
from onnxtrain.checkpoint.header import strict_json
from onnxtrain.errors import CheckpointError

__all__ = ["CHECKPOINT_FORMAT_VERSION", "METADATA_KEY", "Metadata", "encode_metadata", "decode_metadata",
           "tensors_sha256"]

CHECKPOINT_FORMAT_VERSION = 1
METADATA_KEY = "onnxtrain"
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_HASH_BATCH_BYTES = 1 << 22


@dataclass(frozen=True)
class Metadata:
    """The decoded, checksum-verified ``onnxtrain`` entry."""

    nominal: bool
    step: int
    specs: dict[str, TensorSpec]
    properties: dict[str, int | float | str]
    tensors_sha256: str


def tensors_sha256(arrays: Iterable[np.ndarray]) -> str:
    """SHA-256 of the arrays' bytes, concatenated in order. Each must be C-contiguous and little-endian.

    Arrays under 4 MiB are hashed in batches joined into one buffer of at most 8 MiB: hashlib gives the GIL up
    for every update of 2 KiB or more, and a thread that gives it up once per tensor waits for it once per
    tensor (up to the 5 ms switch interval) while another thread runs Python, as generate_artifacts' graph
    building does beside its checkpoint writer (MobileNetV2's 262 tensors: 130 ms instead of 10)."""
    digest = hashlib.sha256()
    batch: list[np.ndarray] = []
    batch_bytes = 0
    for array in arrays:
        view = array.reshape(-1).view(np.uint8)
        if view.nbytes >= _HASH_BATCH_BYTES:
            if batch:  # the arrays before it first: the digest is of the bytes in order
                digest.update(b"".join(batch))
                batch, batch_bytes = [], 0
            digest.update(view)
            continue
        batch.append(view)
        batch_bytes += view.nbytes
        if batch_bytes >= _HASH_BATCH_BYTES:
            digest.update(b"".join(batch))
            batch, batch_bytes = [], 0
    if batch:
        digest.update(b"".join(batch))
    return digest.hexdigest()


def encode_metadata(specs: dict[str, TensorSpec], step: int, properties: dict[str, int | float | str],
                    nominal: bool, tensor_digest: str) -> str:
    """The JSON text of the ``onnxtrain`` entry. Raises TypeError/ValueError for a bad step or property."""
    if not isinstance(step, int | np.integer) or isinstance(step, bool) or not 0 <= step <= _INT64_MAX:
        raise ValueError(f"step must be a non-negative int (int64), got {step!r}")
    body = {
        "format_version": CHECKPOINT_FORMAT_VERSION,
        "nominal": bool(nominal),
        "step": int(step),
        "tensors": [[key, spec.dtype, list(spec.shape)] for key, spec in specs.items()],
        "properties": [_encode_property(name, value) for name, value in properties.items()],
    }
    body["sha256"] = {"metadata": _digest(body), "tensors": tensor_digest}
    return json.dumps(body, ensure_ascii=True, separators=(",", ":"))


def decode_metadata(metadata: dict[str, str], where: str) -> Metadata:
    """Decode and verify the ``onnxtrain`` entry of a safetensors ``metadata`` dict.

    The format version is checked first (a newer version may checksum differently), then the metadata
    checksum, then the structure. Raises CheckpointError naming ``where`` and what is wrong.
    """
    if METADATA_KEY not in metadata:
        raise CheckpointError(f"{where} is a safetensors file but not an onnxtrain checkpoint: "
                              f"its metadata has no {METADATA_KEY!r} entry")
    try:
        body = strict_json(metadata[METADATA_KEY])
    except (ValueError, RecursionError) as exc:
        raise CheckpointError(f"{where} is corrupt: its {METADATA_KEY!r} metadata is not valid JSON ({exc})") from None
    if not isinstance(body, dict):
        raise CheckpointError(f"{where} is corrupt: its {METADATA_KEY!r} metadata is not a JSON object")
    version = body.get("format_version")
    if not _is_int(version):
        raise CheckpointError(f"{where} is corrupt: its metadata has no integer format_version")
    if version != CHECKPOINT_FORMAT_VERSION:
        newer = version > CHECKPOINT_FORMAT_VERSION
        hint = "; it was written by a newer onnxtrain, upgrade to load it" if newer else ""
        raise CheckpointError(f"{where} has unsupported format version {version}; this onnxtrain reads "
                              f"version {CHECKPOINT_FORMAT_VERSION}{hint}")
    sums = body.pop("sha256", None)
    if not (isinstance(sums, dict) and all(isinstance(sums.get(k), str) for k in ("metadata", "tensors"))):
        raise CheckpointError(f"{where} is corrupt or was altered: its metadata has no sha256 checksums")
    try:
        intact = _digest(body) == sums["metadata"]
    except (ValueError, RecursionError):  # nesting too deep to re-serialize: certainly not ours
        intact = False
    if not intact:
        raise CheckpointError(f"{where} is corrupt or was altered: checksum mismatch in the metadata")
    try:
        return _decode_body(body, sums["tensors"])
    except (TypeError, ValueError, KeyError) as exc:
        raise CheckpointError(f"{where} has malformed {METADATA_KEY!r} metadata: {exc}") from None


def _decode_body(body: dict, tensor_digest: str) -> Metadata:
    nominal, step = body["nominal"], body["step"]
    if not isinstance(nominal, bool):
        raise TypeError(f"nominal must be true or false, got {nominal!r}")
    if not (_is_int(step) and 0 <= step <= _INT64_MAX):
        raise ValueError(f"step must be a non-negative int64, got {step!r}")
    specs = {}
    for entry in _rows(body["tensors"], "tensors"):
        key, dtype, shape = entry
        split_tensor_key(key)
        if key in specs:
            raise ValueError(f"tensor {key!r} is listed twice")
        if not isinstance(shape, list) or not all(_is_int(d) for d in shape):
            raise TypeError(f"tensor {key!r} has shape {shape!r}, expected a list of ints")
        specs[key] = TensorSpec(dtype, tuple(shape))
    properties = {}
    for entry in _rows(body["properties"], "properties"):
        name, kind, text = entry
        if not isinstance(name, str) or name in properties:
            raise ValueError(f"property name {name!r} is not a str or is listed twice")
        properties[name] = _decode_property(name, kind, text)
    return Metadata(nominal, step, specs, properties, tensor_digest)


def _rows(value: object, field: str) -> list[list]:
    if not isinstance(value, list) or not all(isinstance(row, list) and len(row) == 3 for row in value):
        raise TypeError(f"{field} must be a list of 3-element lists")
    return value


def _encode_property(name: str, value: object) -> list[str]:
    if not isinstance(name, str):
        raise TypeError(f"property names must be str, got {type(name).__name__} {name!r}")
    if isinstance(value, bool):
        raise TypeError(f"property {name!r} is a bool; properties must be int, float or str "
                        "(a bool would load back as int, so store int(flag) explicitly)")
    if isinstance(value, int):
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise ValueError(f"property {name!r} = {value} does not fit in int64, as checkpoint ints must")
        return [name, "int", str(int(value))]
    if isinstance(value, float):
        return [name, "float", struct.pack(">d", value).hex()]
    if isinstance(value, str):
        return [name, "str", str(value)]
    raise TypeError(f"property {name!r} has type {type(value).__name__}; properties must be int, float or str")


def _decode_property(name: str, kind: object, text: object) -> int | float | str:
    if not isinstance(text, str):
        raise TypeError(f"property {name!r} value must be stored as a string, got {text!r}")
    if kind == "int":
        value = int(text)
        if text != str(value) or not _INT64_MIN <= value <= _INT64_MAX:
            raise ValueError(f"property {name!r} has int value {text!r}, expected decimal int64")
        return value
    if kind == "float":
        if len(text) != 16:
            raise ValueError(f"property {name!r} has float bits {text!r}, expected 16 hex digits")
        return struct.unpack(">d", bytes.fromhex(text))[0]
    if kind == "str":
        return text
    raise ValueError(f"property {name!r} has type {kind!r}, expected int, float or str")


def _digest(body: dict) -> str:
    canonical = json.dumps(body, sort_keys=True, ensure_ascii=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
