"""Property tests: whatever bytes load_checkpoint is given, only CheckpointError comes out.

Four sources of input, from shallow to deep: random bytes; hand-made safetensors headers with random
entries; valid checkpoints with random byte edits; valid checkpoints whose onnxtrain metadata has a
random field replaced *and a recomputed checksum*, so the input reaches the checks behind the checksum.
A file that does load must hold exactly what was saved (random edits cannot fool the checksums).
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from onnxtrain.checkpoint import CheckpointData, load_checkpoint, save_checkpoint
from onnxtrain.errors import CheckpointError

FUZZ = settings(max_examples=200, deadline=2000, suppress_health_check=[HealthCheck.too_slow], derandomize=True)

ORIGINAL = CheckpointData(
    trainable={"layers.0.weight": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.array(2.5)},
    frozen={"mask": np.array([True, False, True])},
    buffers={"count": np.arange(3, dtype=np.int64), "empty": np.zeros((0, 2), np.int8)},
    optimizer={"layers.0.weight": {"exp_avg": np.ones((3, 4), np.float16)}},
    step=5,
    properties={"lr": 0.01, "epoch": 2, "name": "run"},
)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


@pytest.fixture(scope="module")
def valid_files(workdir) -> list[bytes]:
    """A full checkpoint and a nominal one, as bytes."""
    blobs = []
    for data in (ORIGINAL, ORIGINAL.nominal_copy()):
        save_checkpoint(data, workdir / "valid.ckpt")
        blobs.append((workdir / "valid.ckpt").read_bytes())
    return blobs


def load_or_error(path, blob: bytes) -> CheckpointData | None:
    """Load ``blob``; None if it raised CheckpointError with a one-line message naming the file."""
    path.write_bytes(blob)
    try:
        return load_checkpoint(path)
    except CheckpointError as exc:
        message = str(exc)
        assert "\n" not in message and str(path) in message, message
        return None


def tensors_equal(a: CheckpointData, b: CheckpointData) -> bool:
    x, y = a.tensor_specs(), b.tensor_specs()
    if list(x) != list(y):
        return False
    return a.nominal or all(a.tensors()[k].tobytes() == b.tensors()[k].tobytes() for k in x)


def header_file(header: object, data: bytes) -> bytes:
    text = json.dumps(header).encode()
    return len(text).to_bytes(8, "little") + text + data


@FUZZ
@given(blob=st.binary(max_size=600))
def test_random_bytes(workdir, blob):
    assert load_or_error(workdir / "random.ckpt", blob) is None


@FUZZ
@given(blob=st.binary(max_size=300), length=st.integers(0, 400))
def test_random_bytes_behind_a_plausible_header_length(workdir, blob, length):
    load_or_error(workdir / "length.ckpt", length.to_bytes(8, "little") + blob)


json_values = st.recursive(st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
                           lambda children: st.lists(children, max_size=4)
                           | st.dictionaries(st.text(max_size=6), children, max_size=4), max_leaves=12)
counts = st.integers(-2, 40) | st.integers(0, 2**64) | st.booleans()
odd_counts = counts | st.none() | st.floats() | st.text(max_size=2)
entries = st.fixed_dictionaries({
    "dtype": st.sampled_from(["F32", "F64", "F16", "BF16", "I64", "I8", "U8", "BOOL", "C64", "F8_E4M3", "??"])
    | json_values,
    "shape": st.lists(counts, max_size=3) | st.lists(odd_counts, max_size=3) | json_values,
    "data_offsets": st.lists(counts, min_size=2, max_size=2) | st.lists(odd_counts, max_size=3) | json_values,
}) | json_values


ITEMSIZE = {"F32": 4, "F64": 8, "F16": 2, "BF16": 2, "I64": 8, "I8": 1, "U8": 1, "BOOL": 1}


@st.composite
def almost_valid_files(draw) -> bytes:
    """A one-tensor file that is valid except for one field of the tensor's entry, replaced by junk."""
    code = draw(st.sampled_from(sorted(ITEMSIZE)))
    shape = draw(st.lists(st.integers(0, 3), max_size=3))
    size = ITEMSIZE[code] * int(np.prod(shape))
    entry = {"dtype": code, "shape": shape, "data_offsets": [0, size]}
    field = draw(st.sampled_from(["dtype", "shape", "data_offsets"]))
    entry[field] = draw(st.lists(odd_counts, max_size=3) | json_values)
    return header_file({"trainable/w": entry}, bytes(size))


@FUZZ
@given(header=st.dictionaries(st.sampled_from(["trainable/w", "buffer/b", "__metadata__", "x"]), entries,
                              max_size=3) | json_values,
       data=st.binary(max_size=64), almost_valid=almost_valid_files())
def test_hand_made_headers(workdir, header, data, almost_valid):
    load_or_error(workdir / "header.ckpt", header_file(header, data))
    load_or_error(workdir / "header.ckpt", almost_valid)


# Positions count from the start, or from the end when negative (the end holds the tensor data).
edits = st.lists(st.tuples(st.sampled_from(["xor", "set", "truncate", "insert", "delete"]),
                           st.integers(0, 2000) | st.integers(-200, -1), st.integers(1, 255),
                           st.binary(min_size=1, max_size=8)),
                 min_size=1, max_size=3)


@FUZZ
@given(which=st.integers(0, 1), edits=edits)
def test_edited_valid_files(workdir, valid_files, which, edits):
    blob = bytearray(valid_files[which])
    for op, position, value, chunk in edits:
        at = min(position, len(blob)) if position >= 0 else max(0, len(blob) + position)
        if op == "xor" and at < len(blob):
            blob[at] ^= value
        elif op == "set" and at < len(blob):
            blob[at] = value
        elif op == "truncate":
            del blob[at:]
        elif op == "insert":
            blob[at:at] = chunk
        elif op == "delete":
            del blob[at:at + value]
    loaded = load_or_error(workdir / "edited.ckpt", bytes(blob))
    if loaded is not None:  # only edits that change nothing the checksums cover may load
        expected = ORIGINAL if which == 0 else ORIGINAL.nominal_copy()
        assert loaded.step == expected.step and loaded.properties == expected.properties
        assert tensors_equal(loaded, expected)


DELETE = object()


@FUZZ
@given(which=st.integers(0, 1),
       field=st.sampled_from(["nominal", "step", "tensors", "properties", "extra", "sha256", "format_version"]),
       value=st.just(DELETE) | json_values | st.lists(st.lists(json_values, min_size=3, max_size=3), max_size=3))
def test_metadata_with_recomputed_checksum(workdir, valid_files, which, field, value):
    """Replace (or delete) one field of the metadata, then recompute the checksum (unless the field is it)."""
    blob = valid_files[which]
    end = 8 + int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:end])
    body = json.loads(header["__metadata__"]["onnxtrain"])
    sums = body.pop("sha256")
    if field != "sha256":
        body.pop(field, None) if value is DELETE else body.update({field: value})
    canonical = json.dumps(body, sort_keys=True, ensure_ascii=True, separators=(",", ":")).encode()
    body["sha256"] = {"metadata": hashlib.sha256(canonical).hexdigest(), "tensors": sums["tensors"]}
    if field == "sha256" and value is not DELETE:
        body["sha256"] = value
    header["__metadata__"]["onnxtrain"] = json.dumps(body)
    load_or_error(workdir / "forged.ckpt", header_file(header, blob[end:]))
