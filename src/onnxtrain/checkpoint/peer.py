"""Checkpoints written by onnxruntime-training (the peer): read them, and carry their values into onnxtrain's.

A device that trained with ``onnxruntime.training.api`` holds its weights in the peer's checkpoint, a flatbuffers
file (file identifier ``ODTC``; schema ``ort_training_checkpoint.fbs``: module state with the trainable and frozen
parameters, optimizer groups with the step and per-parameter momentums, a property bag). onnxtrain's artifacts are
generated again from the same forward model; :func:`import_peer_checkpoint` then fills onnxtrain's checkpoint with
the peer's values, so that training resumes where the peer stopped:

    data = import_peer_checkpoint("device/checkpoint", "artifacts/checkpoint")
    save_checkpoint(data, "artifacts/checkpoint_from_peer", include_optimizer_state=True)

The reader needs no flatbuffers package: it follows the format's offsets itself, checking every one against the
file's size, so a damaged file is a CheckpointError, never an IndexError.
"""

from __future__ import annotations

import logging
import os
import struct

import numpy as np

from onnxtrain.checkpoint.data import CheckpointData
from onnxtrain.errors import CheckpointError
from onnxtrain.ir.types import np_dtype

__all__ = ["PEER_FILE_IDENTIFIER", "is_peer_checkpoint", "read_peer_checkpoint", "import_peer_checkpoint"]

logger = logging.getLogger(__name__)

PEER_FILE_IDENTIFIER = b"ODTC"
# The peer's AdamW keeps two momentums per parameter, named momentum0 and momentum1 (first and second moments)
_ADAMW_STATES = ("exp_avg", "exp_avg_sq")


def is_peer_checkpoint(head: bytes) -> bool:
    """Whether a file starting with ``head`` (8 bytes or more) is a peer checkpoint."""
    return len(head) >= 8 and head[4:8] == PEER_FILE_IDENTIFIER


class _Table:
    """One flatbuffers table of ``buf`` at ``pos``; fields are read by their vtable offset (4, 6, 8, ...)."""

    def __init__(self, buf: bytes, pos: int, where: str):
        self.buf, self.pos, self.where = buf, pos, where
        vtable = pos - self._unpack("<i", pos)
        self.vtable_size = self._unpack("<H", vtable)
        self.vtable = vtable

    def _check(self, pos: int, size: int) -> None:
        if pos < 0 or pos + size > len(self.buf):
            raise CheckpointError(f"{self.where} is truncated or corrupt: an offset points past the end of the "
                                  f"{len(self.buf)}-byte file")

    def _unpack(self, fmt: str, pos: int):
        self._check(pos, struct.calcsize(fmt))
        return struct.unpack_from(fmt, self.buf, pos)[0]

    def _field(self, slot: int) -> int | None:
        if slot >= self.vtable_size:
            return None
        offset = self._unpack("<H", self.vtable + slot)
        return self.pos + offset if offset else None

    def _target(self, slot: int) -> int | None:
        at = self._field(slot)
        return None if at is None else at + self._unpack("<I", at)

    def scalar(self, slot: int, fmt: str, default):
        at = self._field(slot)
        return default if at is None else self._unpack(fmt, at)

    def table(self, slot: int) -> _Table | None:
        at = self._target(slot)
        return None if at is None else _Table(self.buf, at, self.where)

    def string(self, slot: int) -> str:
        at = self._target(slot)
        if at is None:
            return ""
        return bytes(self._bytes(at)).decode("utf-8", errors="replace")

    def bytes_(self, slot: int) -> memoryview:
        at = self._target(slot)
        return memoryview(b"") if at is None else self._bytes(at)

    def int64s(self, slot: int) -> list[int]:
        at = self._target(slot)
        if at is None:
            return []
        n = self._unpack("<I", at)
        self._check(at + 4, 8 * n)
        return list(struct.unpack_from(f"<{n}q", self.buf, at + 4))

    def tables(self, slot: int) -> list[_Table]:
        at = self._target(slot)
        if at is None:
            return []
        n = self._unpack("<I", at)
        out = []
        for i in range(n):
            element = at + 4 + 4 * i
            out.append(_Table(self.buf, element + self._unpack("<I", element), self.where))
        return out

    def _bytes(self, at: int) -> memoryview:
        n = self._unpack("<I", at)
        self._check(at + 4, n)
        return memoryview(self.buf)[at + 4:at + 4 + n]


def _tensor(table: _Table, where: str) -> tuple[str, np.ndarray]:
    # ort.fbs Tensor: name 4, doc_string 6, dims 8, data_type 10, raw_data 12, string_data 14, external_data_offset 16
    name = table.string(4)
    dims = table.int64s(8)
    data_type = table.scalar(10, "<i", 0)
    if table.scalar(16, "<q", -1) >= 0:
        raise CheckpointError(f"{where}: tensor {name!r} is stored in the peer's external data file, which onnxtrain "
                              "does not read; save the peer's state without external data first")
    try:
        dtype = np_dtype(data_type)
    except (KeyError, ValueError, TypeError):
        raise CheckpointError(f"{where}: tensor {name!r} has the unknown data type {data_type}") from None
    if dtype.kind not in "biuf":
        raise CheckpointError(f"{where}: tensor {name!r} is {dtype}; onnxtrain checkpoints hold numeric tensors")
    raw = table.bytes_(12)
    count = int(np.prod(dims)) if dims else 1
    if len(raw) != count * dtype.itemsize:
        raise CheckpointError(f"{where}: tensor {name!r} of shape {dims} and type {dtype} should hold "
                              f"{count * dtype.itemsize} bytes, the file has {len(raw)}")
    return name, np.frombuffer(raw, dtype.newbyteorder("<")).astype(dtype).reshape(dims)


def read_peer_checkpoint(path: str | os.PathLike) -> CheckpointData:
    """Read an onnxruntime-training checkpoint: its trainable parameters (in the file's order, which the peer sorts
    by name), frozen parameters, AdamW moments (as ``exp_avg`` / ``exp_avg_sq``), step and properties.

    Raises:
        CheckpointError: the file is missing, not a peer checkpoint, truncated or corrupt, nominal (no weights),
            or holds what onnxtrain cannot represent (external data, string tensors, several optimizer groups).
    """
    where = f"peer checkpoint {os.fspath(path)!r}"
    try:
        with open(path, "rb") as file:
            buf = file.read()
    except FileNotFoundError:
        raise CheckpointError(f"{where} does not exist") from None
    except OSError as exc:
        raise CheckpointError(f"{where} cannot be read: {exc}") from None
    if not is_peer_checkpoint(buf[:8]):
        raise CheckpointError(f"{where} is not an onnxruntime-training checkpoint (no {PEER_FILE_IDENTIFIER!r} "
                              "file identifier)")
    root = _Table(buf, int.from_bytes(buf[:4], "little"), where)
    # Checkpoint: version 4, module_state 6, optimizer_groups 8, property_bag 10
    module = root.table(6)
    if module is None:
        raise CheckpointError(f"{where} holds no module state (no parameters)")
    # ModuleState: requires_grad_params 4, frozen_params 6, is_nominal_state 8, has_external_data 10
    if module.scalar(8, "<?", False):
        raise CheckpointError(f"{where} is a nominal checkpoint: it names the parameters but holds no weights")
    trainable = dict(_tensor(t, where) for t in module.tables(4))
    frozen = dict(_tensor(t, where) for t in module.tables(6))
    groups = root.tables(8)
    if len(groups) > 1:
        raise CheckpointError(f"{where} has {len(groups)} optimizer groups; onnxtrain has one optimizer")
    step, optimizer = 0, {}
    for group in groups:
        # OptimizerGroup: group_name 4, step 6, initial_learning_rate 8, optimizer_states 10
        step = group.scalar(6, "<q", 0)
        for state in group.tables(10):
            # ParameterOptimizerState: param_name 4, momentums 6
            momentums = [_tensor(t, where) for t in state.tables(6)]
            if len(momentums) == len(_ADAMW_STATES):
                optimizer[state.string(4)] = {s: a for s, (_, a) in zip(_ADAMW_STATES, momentums)}
            elif momentums:
                raise CheckpointError(f"{where}: parameter {state.string(4)!r} has {len(momentums)} optimizer "
                                      "states; onnxtrain reads the peer's AdamW (two) and SGD (none)")
    properties: dict[str, int | float | str] = {}
    bag = root.table(10)
    if bag is not None:
        # PropertyBag: ints 4, floats 6, strings 8; each property: name 4, value 6
        properties.update({p.string(4): p.scalar(6, "<q", 0) for p in bag.tables(4)})
        properties.update({p.string(4): p.scalar(6, "<f", 0.0) for p in bag.tables(6)})
        properties.update({p.string(4): p.string(6) for p in bag.tables(8)})
    return CheckpointData(trainable=trainable, frozen=frozen, optimizer=optimizer, step=step, properties=properties)


def import_peer_checkpoint(peer_path: str | os.PathLike, template: CheckpointData | str | os.PathLike
                           ) -> CheckpointData:
    """The peer checkpoint's values in the layout of ``template``, onnxtrain's checkpoint for artifacts generated
    from the same forward model (``generate_artifacts`` writes it): which parameters train, which are frozen or
    buffers, and their order come from ``template``; every value the peer holds replaces the template's, with
    the AdamW moments of the parameters that train, the step and the properties.

    A template tensor the peer does not hold keeps the template's value, with a warning: the peer kept such
    tensors (BatchNorm statistics, parameters it did not train) inside its graphs, where they never changed.

    Raises:
        CheckpointError: the peer file cannot be read (see :func:`read_peer_checkpoint`), holds a tensor the template
            does not have (artifacts from another model), or a tensor of another shape or type.
    """
    from onnxtrain.checkpoint.format import load_checkpoint

    peer = read_peer_checkpoint(peer_path)
    base = template if isinstance(template, CheckpointData) else load_checkpoint(template)
    where = f"peer checkpoint {os.fspath(peer_path)!r}"
    values = {**peer.trainable, **peer.frozen}
    layout = {**base.trainable, **base.frozen, **base.buffers}
    foreign = [n for n in values if n not in layout]
    if foreign:
        raise CheckpointError(f"{where} holds {foreign[:5]}, which the artifacts' checkpoint does not have: generate "
                              "the artifacts from the forward model the peer's artifacts came from")
    for name, value in values.items():
        want = layout[name]
        if value.shape != want.shape or value.dtype != want.dtype:
            raise CheckpointError(f"{where}: {name!r} is {value.dtype}{list(value.shape)}, the artifacts expect "
                                  f"{want.dtype}{list(want.shape)}")
    kept = [n for n in layout if n not in values]
    if kept:
        logger.warning("%s does not hold %s; they keep the values of the artifacts' checkpoint", where, kept[:8])

    def take(part: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {n: values.get(n, a).copy() for n, a in part.items()}

    optimizer = {n: {s: a.copy() for s, a in states.items()} for n, states in peer.optimizer.items()
                 if n in base.trainable}
    return CheckpointData(trainable=take(base.trainable), frozen=take(base.frozen), buffers=take(base.buffers),
                          optimizer=optimizer, step=peer.step, properties={**base.properties, **peer.properties})
