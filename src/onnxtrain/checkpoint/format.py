"""Save and load checkpoints: one safetensors file, tensors plus an ``onnxtrain`` metadata entry.

Tensors are stored under their :func:`~onnxtrain.checkpoint.data.tensor_key` (``trainable/w``,
``optimizer/w/exp_avg``, ...), so any safetensors reader can open the file. The ``onnxtrain`` metadata
entry (see :mod:`onnxtrain.checkpoint.metadata`) records the order, the step, the properties and two
SHA-256 checksums. Saving is atomic (:mod:`onnxtrain.checkpoint.atomic`). Loading executes no code,
validates the whole header against the file size before reading data, and reports every defect as a
:class:`~onnxtrain.errors.CheckpointError`.
"""

from __future__ import annotations

import json
import os

import numpy as np
import safetensors.numpy

from onnxtrain.checkpoint.atomic import atomic_write, clear_stale_temps
from onnxtrain.checkpoint.data import CheckpointData, TensorSpec, split_tensor_key
from onnxtrain.checkpoint.header import Header, read_header, read_tensors
from onnxtrain.checkpoint.metadata import (
    CHECKPOINT_FORMAT_VERSION,
    METADATA_KEY,
    Metadata,
    decode_metadata,
    encode_metadata,
    tensors_sha256,
)
from onnxtrain.checkpoint.peer import is_peer_checkpoint
from onnxtrain.errors import CheckpointError

__all__ = ["save_checkpoint", "load_checkpoint", "checkpoint_pieces", "safetensors_pieces", "CHECKPOINT_FORMAT_VERSION"]


def save_checkpoint(data: CheckpointData, path: str | os.PathLike[str], include_optimizer_state: bool = True) -> None:
    """Write ``data`` to ``path`` as a safetensors file, atomically: ``path`` ends up holding either its
    old content or the complete new checkpoint, never a partial one.

    Args:
        data: the checkpoint; a nominal one stores only the dtypes and shapes in ``data.specs``.
        path: the file to write; its directory must exist.
        include_optimizer_state: False leaves out ``data.optimizer`` and saves step 0: the optimizer's step
            goes with its state, so a run resumed from this file starts a fresh optimizer (zero moments, step 0,
            AdamW's bias correction from its start), as the peer's and torch's do.

    Raises:
        TypeError: a tensor is not a numpy array of a supported dtype, or a property is not int, float or str.
        ValueError: a nominal checkpoint holds arrays, a full one holds specs, or a name or value is invalid.
        OSError: writing failed; the old file at ``path`` is untouched.
    """
    atomic_write(os.fsdecode(path), checkpoint_pieces(data, include_optimizer_state))


def checkpoint_pieces(data: CheckpointData, include_optimizer_state: bool = True) -> list[bytes | memoryview]:
    """The bytes :func:`save_checkpoint` writes, as :func:`safetensors_pieces` (views of the arrays, not copies);
    raises as :func:`save_checkpoint` does, before anything is written."""
    if not isinstance(data, CheckpointData):
        raise TypeError(f"save_checkpoint() expects a CheckpointData, got {type(data).__name__}")
    if data.nominal:
        tensors, specs = {}, _nominal_specs(data)
    else:
        if data.specs:
            raise ValueError("CheckpointData.specs is only for nominal checkpoints; this one has nominal=False")
        tensors = {key: _little_endian(array) for key, array in data.tensors().items()}
        specs = {key: TensorSpec.of(array) for key, array in tensors.items()}
    if not include_optimizer_state:
        tensors = {key: array for key, array in tensors.items() if not key.startswith("optimizer/")}
        specs = {key: spec for key, spec in specs.items() if not key.startswith("optimizer/")}
    step = data.step if include_optimizer_state else 0
    text = encode_metadata(specs, step, data.properties, data.nominal, tensors_sha256(tensors.values()))
    return safetensors_pieces(tensors, {METADATA_KEY: text})


def safetensors_pieces(tensors: dict[str, np.ndarray], metadata: dict[str, str]) -> list[bytes | memoryview]:
    """The bytes ``safetensors.numpy.save(tensors, metadata=metadata)`` returns, as pieces: the header, then a view
    of each array's own memory, so a checkpoint is written without gathering every tensor into one buffer (that
    gathered copy and the one it is joined from were two extra copies of the model while saving).

    safetensors itself lays the header out (tensor order, dtype codes) for the same names and dtypes with empty
    arrays; the offsets and shapes are filled in here and the JSON written as its serializer does (compact,
    UTF-8, padded with spaces to a multiple of 8 bytes).
    """
    order: dict = {}
    if tensors:  # safetensors < 0.4.2 writes invalid JSON for no tensors with metadata ('{},"__metadata__":...')
        layout = safetensors.numpy.save({k: np.empty((0,), a.dtype) for k, a in tensors.items()}, metadata=metadata)
        order = json.loads(layout[8:8 + int.from_bytes(layout[:8], "little")])
    header: dict = {"__metadata__": metadata} if metadata else {}
    offset, pieces = 0, []
    for key, entry in order.items():
        if key == "__metadata__":
            continue
        array = tensors[key]
        header[key] = {"dtype": entry["dtype"], "shape": list(array.shape),
                       "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
        if array.nbytes:
            pieces.append(memoryview(array.reshape(-1).view(np.uint8)))
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)
    return [len(text).to_bytes(8, "little") + text, *pieces]


def load_checkpoint(path: str | os.PathLike[str]) -> CheckpointData:
    """Read a checkpoint written by :func:`save_checkpoint`. Arrays come back writable, in native byte order.

    Raises:
        CheckpointError: the file is missing or unreadable, is not a safetensors file, is truncated,
            corrupt or altered (checksum mismatch), is not an onnxtrain checkpoint, or has an unsupported
            format version. The message names the file and the defect.
    """
    meta, arrays, where = _read(path, tensors=True)
    ordered = {} if meta.nominal else {key: arrays[key] for key in meta.specs}
    if tensors_sha256(ordered.values()) != meta.tensors_sha256:
        raise CheckpointError(f"{where} is corrupt or was altered: checksum mismatch in the tensor data")
    if meta.nominal:
        return CheckpointData(trainable={}, step=meta.step, properties=meta.properties, nominal=True, specs=meta.specs)
    return CheckpointData.from_tensors(ordered, step=meta.step, properties=meta.properties)


def load_properties(path: str | os.PathLike[str]) -> dict[str, int | float | str]:
    """The properties of the checkpoint at ``path``, from its header alone: no tensor is read or checksummed (a
    run's progress record without reading a model's weights). Raises CheckpointError as load_checkpoint does for
    a defect of the file's header."""
    return _read(path, tensors=False)[0].properties


def _read(path: str | os.PathLike[str], tensors: bool) -> tuple[Metadata, dict[str, np.ndarray] | None, str]:
    """(the checkpoint's metadata, its arrays when ``tensors``, the file as errors name it)."""
    path = os.fsdecode(path)  # a bytes path too, as open() takes it
    where = f"checkpoint {path!r}"
    clear_stale_temps(path)
    try:
        with open(path, "rb", buffering=0) as file:
            if is_peer_checkpoint(file.read(8)):
                raise CheckpointError(
                    f"{where} is an onnxruntime-training checkpoint; onnxtrain writes its own format: generate "
                    f"onnxtrain's artifacts from the same forward model, then convert it with `onnxtrain import "
                    f"{os.fspath(path)} --artifacts ARTIFACT_DIR -o NEW_CHECKPOINT` "
                    f"(onnxtrain.checkpoint.import_peer_checkpoint)")
            file.seek(0)
            header = read_header(file, os.fstat(file.fileno()).st_size, where)
            meta = decode_metadata(header.metadata, where)
            _check_header_matches(header, meta, where)
            arrays = read_tensors(file, header, where) if tensors else None
    except FileNotFoundError:
        raise CheckpointError(f"{where} does not exist") from None
    except IsADirectoryError:
        raise CheckpointError(f"{where} is a directory, not a checkpoint file") from None
    except OSError as exc:
        raise CheckpointError(f"{where} could not be read: {exc.strerror or exc}") from None
    return meta, arrays, where


def _nominal_specs(data: CheckpointData) -> dict[str, TensorSpec]:
    if data.trainable or data.frozen or data.buffers or data.optimizer:
        raise ValueError("a nominal checkpoint must not hold arrays; its tensors are described by specs only")
    for key, spec in data.specs.items():
        split_tensor_key(key)
        if not isinstance(spec, TensorSpec):
            raise TypeError(f"specs[{key!r}] must be a TensorSpec, got {type(spec).__name__}")
    return dict(data.specs)


def _little_endian(array: np.ndarray) -> np.ndarray:
    """``array`` as C-contiguous little-endian bytes, as safetensors stores them (a no-op for the usual arrays).
    Not ``np.ascontiguousarray``: that turns 0-d arrays into 1-d ones."""
    return np.asarray(array, dtype=array.dtype.newbyteorder("<"), order="C")


def _check_header_matches(header: Header, meta: Metadata, where: str) -> None:
    """The header's tensors must be exactly the ones the metadata lists, with the same dtypes and shapes."""
    expected = {} if meta.nominal else meta.specs
    if header.tensors.keys() != expected.keys():
        extra = sorted(header.tensors.keys() - expected.keys())[:5]
        missing = sorted(expected.keys() - header.tensors.keys())[:5]
        raise CheckpointError(f"{where} is corrupt or was altered: its tensors do not match its metadata "
                              f"(not listed there: {extra}, missing from the file: {missing}; at most 5 shown)")
    for key, spec in expected.items():
        entry = header.tensors[key]
        if entry.dtype.name != spec.dtype or entry.shape != spec.shape:
            raise CheckpointError(f"{where} is corrupt or was altered: tensor {key!r} is {entry.code}"
                                  f"{list(entry.shape)} in the header but {spec.dtype}{list(spec.shape)} "
                                  "in the metadata")
