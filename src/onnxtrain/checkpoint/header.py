"""Read a safetensors file defensively: validate the header completely before reading any tensor data.

A safetensors file is an 8-byte little-endian header length N, N bytes of JSON header, then the data:
``{"__metadata__": {str: str}, "<tensor>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}}``
with offsets relative to the start of the data. Every size and offset is checked against the file size
first, so a hostile file can make us allocate no more memory than its own length.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np

from onnxtrain.checkpoint.dtypes import SAFETENSORS_CODES, SUPPORTED_DTYPES, dtype_from_code
from onnxtrain.errors import CheckpointError

__all__ = ["MAX_HEADER_BYTES", "TensorEntry", "Header", "read_header", "read_tensors", "strict_json"]

MAX_HEADER_BYTES = 100 * 1024 * 1024
_MAX_RANK = 64  # numpy's limit
_SUPPORTED_CODES = ", ".join(SAFETENSORS_CODES[name] for name in SUPPORTED_DTYPES)


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of the header: its dtype, shape, and data offsets relative to the data section."""

    dtype: np.dtype
    code: str
    shape: tuple[int, ...]
    begin: int
    end: int


@dataclass(frozen=True)
class Header:
    """A validated header: the text metadata, the tensors by name, and where the data section starts."""

    metadata: dict[str, str]
    tensors: dict[str, TensorEntry]
    data_start: int


def strict_json(text: str | bytes) -> object:
    """``json.loads`` that rejects duplicate object keys. Raises ValueError (or RecursionError)."""

    def no_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
        obj = dict(pairs)
        if len(obj) != len(pairs):
            seen = set()
            duplicate = next(k for k, _ in pairs if k in seen or seen.add(k))
            raise ValueError(f"duplicate key {duplicate!r}")
        return obj

    return json.loads(text, object_pairs_hook=no_duplicates)


def read_header(file: BinaryIO, file_size: int, where: str) -> Header:
    """Read and validate the header of the safetensors file ``file`` of ``file_size`` bytes.

    ``where`` names the file in error messages. Raises CheckpointError for anything that is not a
    well-formed safetensors header whose tensors exactly tile the data section.
    """
    if file_size == 0:
        raise CheckpointError(f"{where} is empty (0 bytes); expected a safetensors file")
    if file_size < 8:
        raise CheckpointError(f"{where} is not a safetensors file: only {file_size} bytes, "
                              "shorter than the 8-byte header length")
    head = _read_exact(file, 8, where)
    length = int.from_bytes(head, "little")
    if length > MAX_HEADER_BYTES:
        kind = _recognized(head)
        if kind:
            raise CheckpointError(f"{where} is {kind}, not a checkpoint (a safetensors file, as generate_artifacts "
                                  "writes the file named 'checkpoint' in the artifact folder)")
        raise CheckpointError(f"{where} is not a safetensors file: header length {length} is absurd "
                              f"(limit {MAX_HEADER_BYTES} bytes)")
    if length > file_size - 8:
        raise CheckpointError(f"{where} is truncated or not a safetensors file: header length {length} "
                              f"runs past the end of the {file_size}-byte file")
    try:
        header = strict_json(_read_exact(file, length, where).decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise CheckpointError(f"{where} is not a safetensors file: its header is not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{where} is not a safetensors file: its header is a JSON "
                              f"{type(header).__name__}, expected an object")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise CheckpointError(f"{where} has a malformed safetensors header: __metadata__ must map str to str")
    data_size = file_size - 8 - length
    tensors = {name: _entry(name, info, data_size, where) for name, info in header.items()}
    _check_tiling(tensors, data_size, where)
    return Header(metadata, tensors, 8 + length)


def _recognized(head: bytes) -> str:
    """What a file that is not a safetensors file looks like from its first 8 bytes, or "" if unknown."""
    if head.startswith(b"PK\x03\x04"):
        return "a zip archive (a .npz, or a torch .pt file)"
    if head[:1] == b"\x80" and 2 <= head[1] <= 5:
        return "a Python pickle (a torch or numpy file?)"
    # an ONNX ModelProto: field 1 (ir_version, a small varint), then another field's tag
    if head[0] == 0x08 and 1 <= head[1] <= 20 and head[2] in (0x12, 0x1A, 0x22, 0x2A, 0x32, 0x3A, 0x42, 0x72):
        return "an ONNX model"
    if all(32 <= b < 127 or b in b"\t\n\r" for b in head):
        return "a text file"
    return ""


def read_tensors(file: BinaryIO, header: Header, where: str) -> dict[str, np.ndarray]:
    """Read every tensor of a validated ``header`` into its own writable, aligned array."""
    arrays = {}
    file.seek(header.data_start)
    for name, entry in sorted(header.tensors.items(), key=lambda item: item[1].begin):  # tiled: read in order
        try:
            array = np.empty(entry.shape, entry.dtype)
        except ValueError as exc:  # e.g. a dimension past numpy's limits in a zero-size tensor
            raise CheckpointError(f"{where}: tensor {_short(name)} has shape {list(entry.shape)} "
                                  f"that numpy cannot hold ({exc})") from None
        _read_into(file, array.reshape(-1).view(np.uint8), where)
        arrays[name] = array
    return arrays


def _entry(name: str, info: object, data_size: int, where: str) -> TensorEntry:
    def bad(what: str) -> CheckpointError:
        return CheckpointError(f"{where} has a malformed safetensors header: tensor {_short(name)} {what}")

    if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= info.keys():
        raise bad("must be an object with dtype, shape and data_offsets")
    code, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    dtype = dtype_from_code(code)
    if dtype is None:
        raise bad(f"has unsupported dtype {_short(code)}; expected one of {_SUPPORTED_CODES}")
    if not (isinstance(shape, list) and len(shape) <= _MAX_RANK and all(_is_count(d) for d in shape)):
        raise bad(f"has shape {_short(shape)}; expected a list of at most {_MAX_RANK} non-negative ints")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(o) for o in offsets)):
        raise bad(f"has data_offsets {_short(offsets)}; expected [begin, end] with non-negative ints")
    begin, end = offsets
    if not begin <= end <= data_size:
        raise CheckpointError(f"{where} is truncated or corrupt: tensor {_short(name)} has data offsets "
                              f"[{begin}, {end}] outside the {data_size}-byte data section")
    nbytes = math.prod(shape) * dtype.itemsize
    if end - begin != nbytes:
        raise bad(f"of {code}{shape} needs {nbytes} bytes, but its data offsets span {end - begin}")
    return TensorEntry(dtype, code, tuple(shape), begin, end)


def _check_tiling(tensors: dict[str, TensorEntry], data_size: int, where: str) -> None:
    """The tensors must cover the data section exactly, without gaps or overlaps (as safetensors requires)."""
    position = 0
    for name, entry in sorted(tensors.items(), key=lambda item: (item[1].begin, item[1].end)):
        if entry.begin != position:
            problem = "overlaps the previous tensor" if entry.begin < position else "leaves a gap before it"
            raise CheckpointError(f"{where} is corrupt: tensor {_short(name)} at byte {entry.begin} of the data "
                                  f"{problem} (expected it at byte {position})")
        position = entry.end
    if position != data_size:
        raise CheckpointError(f"{where} is corrupt: {data_size - position} bytes follow the last tensor's data")


def _short(value: object, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters: a hostile header must not make a megabyte message."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


def _read_exact(file: BinaryIO, size: int, where: str) -> bytearray:
    data = bytearray(size)
    _read_into(file, data, where)
    return data


def _read_into(file: BinaryIO, buffer: bytearray | np.ndarray, where: str) -> None:
    """Fill ``buffer`` from ``file``. The sizes were checked against the file size, so running out of
    bytes here means the file shrank while we read it."""
    view, filled = memoryview(buffer), 0
    while filled < len(view):
        count = file.readinto(view[filled:])
        if not count:
            raise CheckpointError(f"{where} is truncated: it ended {len(view) - filled} bytes early "
                                  "(did it change while being read?)")
        filled += count
