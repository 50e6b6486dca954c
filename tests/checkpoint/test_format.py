"""Checkpoint save/load: exact round trips, every corruption reported as CheckpointError, atomic saves."""

from __future__ import annotations

import errno
import hashlib
import io
import json
import math
import os
import pickle
import signal
import stat
import struct
import subprocess
import sys
import time

import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy

from onnxtrain.checkpoint import (
    CHECKPOINT_FORMAT_VERSION,
    CheckpointData,
    TensorSpec,
    load_checkpoint,
    save_checkpoint,
    split_tensor_key,
    tensor_key,
)
from onnxtrain.checkpoint import metadata as checkpoint_metadata
from onnxtrain.checkpoint.data import KINDS
from onnxtrain.errors import CheckpointError
from tests import models

DTYPES = ["float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8",
          "uint64", "uint32", "uint16", "uint8", "bool"]
rng = np.random.default_rng(0)


def random_array(dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Random bits of ``dtype`` (NaNs with payloads included for floats), so only a bit-exact copy compares equal."""
    np_dtype = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    if np_dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(bool)
    raw = rng.integers(0, 256, size=math.prod(shape) * np_dtype.itemsize, dtype=np.uint8)
    return raw.view(np_dtype).reshape(shape)


def sample() -> CheckpointData:
    """Every kind, several dtypes, a 0-d and an empty array, names with '/', '.' and '::', unsorted order."""
    return CheckpointData(
        trainable={"z.weight": random_array("float32", (3, 4)), "layers.0.weight": random_array("float16", (2, 2)),
                   "onnx::MatMul_123": random_array("float64", (5,)), "a/b/c": random_array("bfloat16", (2, 3))},
        frozen={"embed.scale": random_array("float32", ()), "empty": random_array("int64", (0, 7))},
        buffers={"bn.running_mean": random_array("float32", (4,)), "bn.num_batches_tracked": random_array("int64", ())},
        optimizer={"z.weight": {"exp_avg": random_array("float32", (3, 4)),
                                "exp_avg_sq": random_array("float32", (3, 4))},
                   "a/b/c": {"momentum": random_array("bfloat16", (2, 3))}},
        step=17,
        properties={"lr": 1e-3, "epoch": 3, "tag": "run/ä\n", "neg": -(2**63)},
    )


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def assert_same(a: CheckpointData, b: CheckpointData) -> None:
    """Bit-exact equality, including key order, property types and float bits."""
    for attr in ("trainable", "frozen", "buffers"):
        x, y = getattr(a, attr), getattr(b, attr)
        assert list(x) == list(y), attr
        assert all(same_bits(x[k], y[k]) for k in x), attr
    assert list(a.optimizer) == list(b.optimizer)
    for param, states in a.optimizer.items():
        assert list(states) == list(b.optimizer[param])
        assert all(same_bits(states[s], b.optimizer[param][s]) for s in states)
    assert (a.step, a.nominal, a.specs) == (b.step, b.nominal, b.specs)
    assert list(a.properties) == list(b.properties)
    for key, value in a.properties.items():
        other = b.properties[key]
        assert type(value) is type(other), key
        assert (struct.pack(">d", value) == struct.pack(">d", other)) if isinstance(value, float) else value == other


def round_trip(data: CheckpointData, tmp_path, **kwargs) -> CheckpointData:
    path = tmp_path / "model.ckpt"
    save_checkpoint(data, path, **kwargs)
    return load_checkpoint(path)


def raw_file(header: dict, data: bytes = b"", pad: bool = True) -> bytes:
    """A safetensors file with the given header dict, built by hand."""
    text = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + data


def forged_metadata(specs: dict[str, TensorSpec], arrays: list[np.ndarray], **overrides) -> dict[str, str]:
    """``onnxtrain`` metadata built by hand from the documented format, with valid checksums, so a test can
    reach the checks that come after the checksum. ``overrides`` replace fields of the JSON object."""
    body = {"format_version": 1, "nominal": False, "step": 0,
            "tensors": [[key, spec.dtype, list(spec.shape)] for key, spec in specs.items()], "properties": []}
    body.update(overrides)
    canonical = json.dumps(body, sort_keys=True, ensure_ascii=True, separators=(",", ":")).encode()
    body["sha256"] = {"metadata": hashlib.sha256(canonical).hexdigest(),
                      "tensors": hashlib.sha256(b"".join(a.tobytes() for a in arrays)).hexdigest()}
    return {"onnxtrain": json.dumps(body)}


# ---------------------------------------------------------------- round trips


def test_round_trip_every_kind_bit_exact(tmp_path):
    data = sample()
    assert_same(round_trip(data, tmp_path), data)



def test_round_trip_through_a_bytes_path(tmp_path):
    """open() takes a bytes path, and so does the peer's CheckpointState; the stale-file cleanup built a str regex
    from it ("cannot use a string pattern on a bytes-like object")."""
    data = sample()
    path = os.fsencode(tmp_path / "checkpoint")
    save_checkpoint(data, path)
    assert_same(load_checkpoint(path), data)

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (7,), (2, 3, 4)])
def test_round_trip_each_dtype_and_shape(tmp_path, dtype, shape):
    data = CheckpointData(trainable={"w": random_array(dtype, shape)}, buffers={"b": random_array(dtype, shape)})
    loaded = round_trip(data, tmp_path)
    assert_same(loaded, data)
    assert loaded.trainable["w"].flags.writeable and loaded.trainable["w"].flags.aligned


def test_insertion_order_kept_not_sorted(tmp_path):
    names = ["zeta", "alpha", "mu", "beta.1", "beta.0"]
    data = CheckpointData(trainable={n: np.full(2, i, np.float32) for i, n in enumerate(names)},
                          optimizer={n: {"v": np.zeros(2, np.float32), "m": np.ones(2, np.float32)}
                                     for n in names[::-1]})
    loaded = round_trip(data, tmp_path)
    assert list(loaded.trainable) == names
    assert list(loaded.optimizer) == names[::-1]
    assert all(list(states) == ["v", "m"] for states in loaded.optimizer.values())


def test_properties_keep_type_and_float_bits(tmp_path):
    nan_with_payload = struct.unpack(">d", bytes.fromhex("fff8000000000123"))[0]
    properties = {"int": 7, "int_min": -(2**63), "int_max": 2**63 - 1, "zero": 0, "float_int_valued": 3.0,
                  "tenth": 0.1, "neg_zero": -0.0, "inf": -math.inf, "nan": nan_with_payload, "tiny": 5e-324,
                  "str": "lr=1e-3", "empty": "", "unicode": "naïve ✓ \U0001f600", "surrogate": "\udc80",
                  "json_like": '{"a": [1]}'}
    loaded = round_trip(CheckpointData(trainable={}, properties=properties), tmp_path)
    assert_same(loaded, CheckpointData(trainable={}, properties=properties))
    assert struct.pack(">d", loaded.properties["nan"]).hex() == "fff8000000000123"


@pytest.mark.parametrize("value", [True, None, [1], np.int64(3), np.float32(1.5), b"bytes", 1 + 2j])
def test_property_of_other_type_is_a_type_error_naming_the_key(tmp_path, value):
    with pytest.raises(TypeError, match="'bad_prop'"):
        save_checkpoint(CheckpointData(trainable={}, properties={"ok": 1, "bad_prop": value}), tmp_path / "c")
    assert not os.listdir(tmp_path)


def test_property_int_outside_int64_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="'big'.*int64"):
        save_checkpoint(CheckpointData(trainable={}, properties={"big": 2**63}), tmp_path / "c")


def test_step_is_kept_and_validated(tmp_path):
    assert round_trip(CheckpointData(trainable={}, step=2**40), tmp_path).step == 2**40
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="step"):
            save_checkpoint(CheckpointData(trainable={}, step=bad), tmp_path / "c")


def test_without_optimizer_state_drops_optimizer_and_step(tmp_path):
    """The step goes with the optimizer state: without it, a resumed optimizer starts from step 0."""
    loaded = round_trip(sample(), tmp_path, include_optimizer_state=False)
    expected = sample()
    assert expected.step > 0
    assert loaded.optimizer == {} and loaded.step == 0
    assert list(loaded.trainable) == list(expected.trainable)
    assert round_trip(sample(), tmp_path, include_optimizer_state=True).optimizer.keys() == expected.optimizer.keys()


def test_empty_checkpoint_round_trips(tmp_path):
    assert_same(round_trip(CheckpointData(trainable={}), tmp_path), CheckpointData(trainable={}))


def test_parameter_with_no_optimizer_state_is_not_stored(tmp_path):
    data = CheckpointData(trainable={"w": np.ones(2, np.float32)}, optimizer={"w": {}})
    assert round_trip(data, tmp_path).optimizer == {}


def test_big_endian_and_strided_inputs_keep_their_values(tmp_path):
    big = np.arange(6, dtype=">f8").reshape(2, 3)
    strided = np.arange(20, dtype=np.int32).reshape(4, 5)[::2, ::-2]
    loaded = round_trip(CheckpointData(trainable={"big": big, "strided": strided}), tmp_path)
    assert loaded.trainable["big"].dtype == np.float64 and np.array_equal(loaded.trainable["big"], big)
    assert np.array_equal(loaded.trainable["strided"], strided)


def test_loaded_arrays_are_writable_and_independent(tmp_path):
    data = CheckpointData(trainable={"a": np.zeros(4, np.float32), "b": np.zeros(4, np.float32)})
    loaded = round_trip(data, tmp_path)
    loaded.trainable["a"] += 1
    assert loaded.trainable["b"].sum() == 0


def test_file_is_standard_safetensors(tmp_path):
    data = sample()
    data.trainable.pop("a/b/c")
    data.optimizer.pop("a/b/c")  # safetensors.numpy itself cannot read bfloat16
    path = tmp_path / "model.ckpt"
    save_checkpoint(data, path)
    tensors = safetensors.numpy.load_file(path)
    assert set(tensors) == set(data.tensors())
    assert all(same_bits(tensors[k], a) for k, a in data.tensors().items())
    assert same_bits(tensors["optimizer/z.weight/exp_avg"], data.optimizer["z.weight"]["exp_avg"])
    with safetensors.safe_open(path, "np") as f:
        meta = json.loads(f.metadata()["onnxtrain"])
    assert meta["format_version"] == CHECKPOINT_FORMAT_VERSION == 1 and meta["step"] == 17
    assert [row[0] for row in meta["tensors"]] == list(data.tensors())


def test_loads_a_file_written_by_plain_safetensors(tmp_path):
    arrays = {"trainable/w": np.arange(6, dtype=np.float32).reshape(2, 3), "buffer/n": np.array(5, np.int64)}
    specs = {k: TensorSpec.of(a) for k, a in arrays.items()}
    safetensors.numpy.save_file(arrays, tmp_path / "c", metadata=forged_metadata(specs, list(arrays.values())))
    loaded = load_checkpoint(tmp_path / "c")
    assert same_bits(loaded.trainable["w"], arrays["trainable/w"])
    assert same_bits(loaded.buffers["n"], arrays["buffer/n"])


# ---------------------------------------------------------------- nominal checkpoints


def test_nominal_round_trip_and_materialize(tmp_path):
    data = sample()
    nominal = data.nominal_copy()
    assert nominal.nominal and not nominal.trainable and not nominal.optimizer
    assert nominal.specs["trainable/a/b/c"] == TensorSpec("bfloat16", (2, 3))
    assert nominal.specs["optimizer/z.weight/exp_avg_sq"] == TensorSpec("float32", (3, 4))
    assert list(nominal.specs) == list(data.tensors())
    loaded = round_trip(nominal, tmp_path)
    assert_same(loaded, nominal)
    assert os.path.getsize(tmp_path / "model.ckpt") < 4096

    full = loaded.materialize()
    assert not full.nominal and full.step == data.step and full.properties == data.properties
    for key, array in full.tensors().items():
        assert TensorSpec.of(array) == nominal.specs[key] and not array.any()
    assert_same(loaded.materialize(data.tensors()), data)


def test_nominal_without_optimizer_state(tmp_path):
    loaded = round_trip(sample().nominal_copy(), tmp_path, include_optimizer_state=False)
    assert not any(key.startswith("optimizer/") for key in loaded.specs)
    assert "trainable/z.weight" in loaded.specs


def test_materialize_checks_values():
    nominal = sample().nominal_copy()
    with pytest.raises(CheckpointError, match=r"'trainable/z.weight'.*float32\[4, 3\].*float32\[3, 4\]"):
        nominal.materialize({"trainable/z.weight": np.zeros((4, 3), np.float32)})
    with pytest.raises(CheckpointError, match=r"'trainable/z.weight'.*float64\[3, 4\]"):
        nominal.materialize({"trainable/z.weight": np.zeros((3, 4), np.float64)})
    with pytest.raises(CheckpointError, match="'trainable/nope'"):
        nominal.materialize({"trainable/nope": np.zeros(1)})


def test_materialize_of_full_checkpoint_replaces_given_values():
    data = sample()
    new = np.ones((5,), np.float64)
    out = data.materialize({"trainable/onnx::MatMul_123": new})
    assert out.trainable["onnx::MatMul_123"] is new
    assert out.trainable["z.weight"] is data.trainable["z.weight"]


def test_nominal_and_full_do_not_mix(tmp_path):
    with pytest.raises(ValueError, match="nominal"):
        save_checkpoint(CheckpointData(trainable={"w": np.ones(1)}, nominal=True), tmp_path / "c")
    with pytest.raises(ValueError, match="specs"):
        save_checkpoint(CheckpointData(trainable={}, specs={"trainable/w": TensorSpec("float32", (1,))}),
                        tmp_path / "c")
    with pytest.raises(ValueError, match="materialize"):
        sample().nominal_copy().tensors()


def test_tensor_spec_validates():
    assert TensorSpec("int8", [2, np.int64(3)]).shape == (2, 3)
    with pytest.raises(ValueError, match="'complex64'"):
        TensorSpec("complex64", (1,))
    with pytest.raises(ValueError, match="shape"):
        TensorSpec("float32", (2, -1))


# ---------------------------------------------------------------- names and save-time validation


@pytest.mark.parametrize("kind,name,state", [("trainable", "layers.0.weight", None), ("frozen", "a/b/c", None),
                                             ("buffer", "onnx::MatMul_123", None), ("optimizer", "x/y.z", "exp_avg"),
                                             ("optimizer", "", "m"), ("trainable", "", None)])
def test_tensor_keys_split_back(kind, name, state):
    assert split_tensor_key(tensor_key(kind, name, state)) == (kind, name, state)


def test_tensor_key_rejects_bad_parts():
    with pytest.raises(ValueError, match="'a/b'"):
        tensor_key("optimizer", "w", "a/b")
    with pytest.raises(ValueError, match="'weights'"):
        tensor_key("weights", "w")
    for bad in ("w", "trainables/w", "optimizer/w", 3):
        with pytest.raises(ValueError):
            split_tensor_key(bad)
    assert KINDS == ("trainable", "frozen", "buffer", "optimizer")


@pytest.mark.parametrize("value,match", [([1.0, 2.0], "'trainable/w'.*list"), (np.float32(1), "'trainable/w'.*float32"),
                                         (np.array(["a"]), "'trainable/w'.*<U1"),
                                         (np.zeros(2, np.complex64), "'trainable/w'.*complex64"),
                                         (np.array([None]), "'trainable/w'.*object")])
def test_save_rejects_bad_tensors_naming_them(tmp_path, value, match):
    with pytest.raises(TypeError, match=match):
        save_checkpoint(CheckpointData(trainable={"w": value}), tmp_path / "c")
    assert not os.listdir(tmp_path)


def test_save_rejects_slash_in_optimizer_state_name(tmp_path):
    data = CheckpointData(trainable={"w": np.ones(1)}, optimizer={"w": {"a/b": np.ones(1)}})
    with pytest.raises(ValueError, match="'a/b'.*'w'"):
        save_checkpoint(data, tmp_path / "c")


# ---------------------------------------------------------------- corrupt, foreign and missing files


@pytest.fixture
def saved(tmp_path):
    """A small valid checkpoint: (path, its bytes, data-section start)."""
    path = tmp_path / "model.ckpt"
    save_checkpoint(sample(), path)
    blob = path.read_bytes()
    return path, blob, 8 + int.from_bytes(blob[:8], "little")


def load_bytes(path, blob: bytes) -> CheckpointData:
    path.write_bytes(blob)
    return load_checkpoint(path)


def test_missing_file(tmp_path):
    with pytest.raises(CheckpointError, match=r"'.*nope\.ckpt' does not exist"):
        load_checkpoint(tmp_path / "nope.ckpt")


def test_directory_instead_of_file(tmp_path):
    with pytest.raises(CheckpointError, match="is a directory"):
        load_checkpoint(tmp_path)


def test_empty_file(tmp_path):
    with pytest.raises(CheckpointError, match=r"model\.ckpt' is empty"):
        load_bytes(tmp_path / "model.ckpt", b"")


@pytest.mark.parametrize("blob", [
    b"hello",                                     # shorter than the length field
    b"not a checkpoint at all, just text\n",     # length field is ASCII: absurd
    b"PK\x03\x04" + bytes(60),                     # a zip (torch.save) archive
    b"\x80\x04\x95" + bytes(40),                   # a pickle: never unpickled
    b"\x93NUMPY\x01\x00" + bytes(60),              # a .npy file
    (4).to_bytes(8, "little") + b"[1] ",           # header is JSON, but not an object
    (4).to_bytes(8, "little") + b"\xff\xfe{}",     # header is not UTF-8
    (8).to_bytes(8, "little") + b"{'a': 1}",       # header is not JSON
])
def test_not_a_safetensors_file(tmp_path, blob):
    with pytest.raises(CheckpointError, match=r"model\.ckpt'"):
        load_bytes(tmp_path / "model.ckpt", blob)


def test_plain_safetensors_file_is_not_a_checkpoint(tmp_path):
    safetensors.numpy.save_file({"w": np.ones(2, np.float32)}, tmp_path / "model.ckpt")
    with pytest.raises(CheckpointError, match="not an onnxtrain checkpoint"):
        load_checkpoint(tmp_path / "model.ckpt")


@pytest.mark.parametrize("cut", [1, 7, 8, 9, 100, -300, -1])
def test_truncated_file(saved, cut):
    path, blob, data_start = saved
    with pytest.raises(CheckpointError, match="truncated|not a safetensors file|outside"):
        load_bytes(path, blob[:cut])


def test_truncated_at_every_boundary(saved):
    path, blob, data_start = saved
    for cut in (data_start - 1, data_start, data_start + 1, len(blob) - 1):
        with pytest.raises(CheckpointError):
            load_bytes(path, blob[:cut])


def test_trailing_bytes(saved):
    path, blob, _ = saved
    with pytest.raises(CheckpointError, match="bytes follow the last tensor"):
        load_bytes(path, blob + b"\0")


def test_flipped_data_bytes_fail_the_checksum(saved):
    path, blob, data_start = saved
    for position in range(data_start, len(blob), 7):
        flipped = bytearray(blob)
        flipped[position] ^= 0x01
        with pytest.raises(CheckpointError, match=r"is corrupt or was altered: checksum mismatch in the tensor data"):
            load_bytes(path, bytes(flipped))


def test_every_single_byte_flip_is_caught(tmp_path):
    path = tmp_path / "small.ckpt"
    save_checkpoint(CheckpointData(trainable={"w": np.ones((2, 2), np.float32)}, buffers={"n": np.array(3)},
                                   optimizer={"w": {"m": np.zeros((2, 2), np.float16)}}, step=1,
                                   properties={"lr": 0.5, "tag": "x"}), path)
    blob = path.read_bytes()
    for position in range(len(blob)):
        flipped = bytearray(blob)
        flipped[position] ^= 0xFF
        with pytest.raises(CheckpointError):
            load_bytes(path, bytes(flipped))


def test_edited_metadata_fails_the_checksum(saved):
    path, blob, _ = saved
    edited = blob.replace(b'\\"step\\":17', b'\\"step\\":99')
    assert edited != blob and len(edited) == len(blob)
    with pytest.raises(CheckpointError, match="is corrupt or was altered: checksum mismatch in the metadata"):
        load_bytes(path, edited)


def test_header_shape_edited_to_same_size_is_caught(saved):
    path, blob, _ = saved
    edited = blob.replace(b'"shape":[3,4]', b'"shape":[4,3]', 1)
    assert edited != blob
    with pytest.raises(CheckpointError, match=r"corrupt or was altered: tensor .* F32\[4, 3\] in the header"):
        load_bytes(path, edited)


def test_header_dtype_edited_to_same_size_is_caught(saved):
    path, blob, _ = saved
    edited = blob.replace(b'"dtype":"F32","shape":[3,4]', b'"dtype":"I32","shape":[3,4]', 1)
    assert edited != blob
    with pytest.raises(CheckpointError, match=r"altered: tensor .* I32\[3, 4\] in the header but float32"):
        load_bytes(path, edited)


def test_swapped_data_offsets_are_caught(saved):
    path, blob, _ = saved
    header = json.loads(blob[8:8 + int.from_bytes(blob[:8], "little")])
    a, b = header["optimizer/z.weight/exp_avg"], header["optimizer/z.weight/exp_avg_sq"]
    a["data_offsets"], b["data_offsets"] = b["data_offsets"], a["data_offsets"]
    with pytest.raises(CheckpointError, match="checksum mismatch in the tensor data"):
        load_bytes(path, raw_file(header, blob[8 + int.from_bytes(blob[:8], "little"):]))


@pytest.mark.parametrize("length,match", [(2**40, "header length 1099511627776 is absurd"),
                                          (100 * 2**20 + 1, "is absurd"), (2**64 - 1, "is absurd"),
                                          (500, "runs past the end")])
def test_header_length_absurd_or_past_the_end(tmp_path, length, match):
    with pytest.raises(CheckpointError, match=match):
        load_bytes(tmp_path / "c", length.to_bytes(8, "little") + b'{"__metadata__":{}}')


@pytest.mark.parametrize("info,match", [
    ({"dtype": "F32", "shape": [2], "data_offsets": [0, 16]}, r"data offsets \[0, 16\] outside the 8-byte"),
    ({"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}, "outside"),
    ({"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}, "needs 16 bytes, but its data offsets span 8"),
    ({"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}, "outside"),
    ({"dtype": "F32", "shape": [2], "data_offsets": [-8, 0]}, "data_offsets"),
    ({"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}, "shape"),
    ({"dtype": "F32", "shape": [True, 2], "data_offsets": [0, 8]}, "shape"),
    ({"dtype": "F32", "shape": 2, "data_offsets": [0, 8]}, "shape"),
    ({"dtype": "F32", "shape": [2]}, "dtype, shape and data_offsets"),
    ({"dtype": "X99", "shape": [2], "data_offsets": [0, 8]}, "unsupported dtype 'X99'; expected one of F32"),
    ({"dtype": "F8_E4M3", "shape": [8], "data_offsets": [0, 8]}, "unsupported dtype 'F8_E4M3'"),
    ({"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}, "unsupported dtype 'C64'"),
    ({"dtype": ["F32"], "shape": [2], "data_offsets": [0, 8]}, "unsupported dtype"),
])
def test_bad_tensor_entries(tmp_path, info, match):
    with pytest.raises(CheckpointError, match=match):
        load_bytes(tmp_path / "c", raw_file({"trainable/w": info}, bytes(8)))


def test_overlapping_and_gapped_offsets(tmp_path):
    overlap = {"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
               "b": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]}}
    with pytest.raises(CheckpointError, match="overlaps"):
        load_bytes(tmp_path / "c", raw_file(overlap, bytes(6)))
    gap = {"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
           "b": {"dtype": "U8", "shape": [2], "data_offsets": [4, 6]}}
    with pytest.raises(CheckpointError, match="gap"):
        load_bytes(tmp_path / "c", raw_file(gap, bytes(6)))


def test_duplicate_header_key(tmp_path):
    entry = '{"dtype":"U8","shape":[1],"data_offsets":[0,1]}'
    text = f'{{"w":{entry},"w":{entry}}}'.encode()
    with pytest.raises(CheckpointError, match="duplicate key 'w'"):
        load_bytes(tmp_path / "c", len(text).to_bytes(8, "little") + text + b"\0")


def test_deeply_nested_header(tmp_path):
    text = b"[" * 100_000 + b"]" * 100_000
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_bytes(tmp_path / "c", len(text).to_bytes(8, "little") + text)


def test_unsupported_format_version(tmp_path):
    arrays = {"trainable/w": np.ones(2, np.float32)}
    meta = forged_metadata({"trainable/w": TensorSpec("float32", (2,))}, list(arrays.values()), format_version=2)
    safetensors.numpy.save_file(arrays, tmp_path / "c", metadata=meta)
    with pytest.raises(CheckpointError, match="unsupported format version 2; this onnxtrain reads version 1.*newer"):
        load_checkpoint(tmp_path / "c")


def test_missing_or_malformed_onnxtrain_metadata(tmp_path):
    arrays = {"trainable/w": np.ones(2, np.float32)}
    specs = {"trainable/w": TensorSpec("float32", (2,))}
    cases = [({"onnxtrain": "{not json"}, "not valid JSON"),
             ({"onnxtrain": "[]"}, "not a JSON object"),
             ({"onnxtrain": '{"format_version": "1"}'}, "no integer format_version"),
             ({"onnxtrain": '{"format_version": 1}'}, "no sha256 checksums"),
             (forged_metadata(specs, list(arrays.values()), step=-1), "malformed 'onnxtrain' metadata: step"),
             (forged_metadata(specs, list(arrays.values()), tensors=[["trainable/w", "float32", [3]]]),
              r"F32\[2\] in the header but float32\[3\]"),
             (forged_metadata(specs, list(arrays.values()), tensors=[["weights/w", "float32", [2]]]),
              "malformed.*'weights/w'"),
             (forged_metadata(specs, list(arrays.values()), properties=[["p", "float", "12"]]),
              "malformed.*'p'.*16 hex digits"),
             (forged_metadata(specs, list(arrays.values()), properties=[["p", "bool", "1"]]),
              "malformed.*'p'.*int, float or str"),
             (forged_metadata(specs, list(arrays.values()), properties=[[5, "int", "1"]]),
              "malformed.*property name 5"),
             (forged_metadata(specs, list(arrays.values()), properties=[["p", "int", "1"], ["p", "int", "2"]]),
              "malformed.*property name 'p'"),
             (forged_metadata(specs, list(arrays.values()), properties=[["p", "int", "01"]]),
              "malformed.*'p'.*decimal int64"),
             (forged_metadata(specs, list(arrays.values()), nominal=1), "malformed.*nominal")]
    for metadata, match in cases:
        safetensors.numpy.save_file(arrays, tmp_path / "c", metadata=metadata)
        with pytest.raises(CheckpointError, match=match):
            load_checkpoint(tmp_path / "c")


def test_self_consistent_file_with_a_shape_numpy_cannot_hold(tmp_path):
    specs = {"trainable/w": TensorSpec("float32", (2**62, 0))}
    header = {"__metadata__": forged_metadata(specs, []),
              "trainable/w": {"dtype": "F32", "shape": [2**62, 0], "data_offsets": [0, 0]}}
    with pytest.raises(CheckpointError, match="numpy cannot hold"):
        load_bytes(tmp_path / "c", raw_file(header))


def test_nominal_file_that_holds_data_is_caught(tmp_path):
    path = tmp_path / "c"
    save_checkpoint(CheckpointData(trainable={"w": np.ones(2, np.float32)}).nominal_copy(), path)
    blob = path.read_bytes()
    header = json.loads(blob[8:8 + int.from_bytes(blob[:8], "little")])
    header["trainable/w"] = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
    with pytest.raises(CheckpointError, match="do not match its metadata"):
        load_bytes(path, raw_file(header, bytes(8)))


# ---------------------------------------------------------------- atomic saves


def old_and_new(tmp_path):
    path = tmp_path / "model.ckpt"
    old = CheckpointData(trainable={"w": np.zeros(1000, np.float32)}, step=1)
    save_checkpoint(old, path)
    return path, old, CheckpointData(trainable={"w": np.ones(1000, np.float32)}, step=2)


@pytest.mark.parametrize("target", ["replace", "fsync"])
def test_failure_mid_save_keeps_old_file_and_no_temp(tmp_path, monkeypatch, target):
    path, old, new = old_and_new(tmp_path)

    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, target, fail)
    with pytest.raises(OSError, match="No space left"):
        save_checkpoint(new, path)
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["model.ckpt"]
    assert_same(load_checkpoint(path), old)


@pytest.mark.skipif(not hasattr(os, "writev"), reason="the platform has no writev")
def test_interrupt_after_half_the_bytes_of_a_vectored_write_keeps_old_file(tmp_path, monkeypatch):
    path, old, new = old_and_new(tmp_path)
    real_writev = os.writev
    calls = []

    def half_writev(fd, buffers):
        calls.append(len(buffers))
        data = b"".join(buffers)
        real_writev(fd, [data[: len(data) // 2]])
        raise KeyboardInterrupt  # not an Exception: cleanup must still run

    monkeypatch.setattr(os, "writev", half_writev)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(new, path)
    monkeypatch.undo()
    assert calls and calls[0] > 1  # the pieces went in one call
    assert os.listdir(tmp_path) == ["model.ckpt"]
    assert_same(load_checkpoint(path), old)
    save_checkpoint(new, path)
    assert_same(load_checkpoint(path), new)


def test_short_vectored_writes_write_every_byte(tmp_path, monkeypatch):
    if not hasattr(os, "writev"):
        pytest.skip("the platform has no writev")
    path, _, new = old_and_new(tmp_path)
    real_writev = os.writev

    def short_writev(fd, buffers):  # at most 5 bytes per call, cutting pieces anywhere
        return real_writev(fd, [bytes(b"".join(buffers)[:5])])

    monkeypatch.setattr(os, "writev", short_writev)
    save_checkpoint(new, path)
    monkeypatch.undo()
    assert_same(load_checkpoint(path), new)


@pytest.mark.parametrize("failing", ["writev", "fsync"])
def test_full_disk_names_the_file_and_keeps_the_old_one(tmp_path, monkeypatch, failing):
    """A write or fsync error carries no file name of its own (``[Errno 28] No space left on device``): the
    OSError names the checkpoint, and the old file and the directory are as they were."""
    path, old, new = old_and_new(tmp_path)

    def no_space(*args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, failing, no_space, raising=False)
    with pytest.raises(OSError) as info:
        save_checkpoint(new, path)
    monkeypatch.undo()
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(path)
    assert str(path) in str(info.value) and "unchanged" in str(info.value)
    assert os.listdir(tmp_path) == ["model.ckpt"]
    assert_same(load_checkpoint(path), old)


def test_a_directory_that_refuses_the_temporary_file_names_the_checkpoint(tmp_path, monkeypatch):
    """A read-only or foreign directory fails at the temporary file beside the target (``.model.ckpt.1a2b.tmp``):
    the error names the checkpoint the caller asked for."""
    path, old, new = old_and_new(tmp_path)
    real_open = os.open

    def refused(name, flags, *args, **kwargs):
        if os.path.basename(name).startswith("."):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), name)
        return real_open(name, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refused)
    with pytest.raises(OSError) as info:
        save_checkpoint(new, path)
    monkeypatch.undo()
    assert info.value.filename == str(path) and "Read-only file system" in str(info.value)
    assert_same(load_checkpoint(path), old)


@pytest.mark.skipif(os.name != "posix", reason="POSIX permission bits")
def test_a_replaced_checkpoint_keeps_its_permissions(tmp_path):
    path, _, new = old_and_new(tmp_path)
    os.chmod(path, 0o600)
    save_checkpoint(new, path)
    assert os.stat(path).st_mode & 0o777 == 0o600
    os.chmod(path, 0o444)
    save_checkpoint(new, path)
    assert os.stat(path).st_mode & 0o777 == 0o444


def test_interrupt_after_half_the_bytes_keeps_old_file(tmp_path, monkeypatch):
    path, old, new = old_and_new(tmp_path)
    monkeypatch.delattr(os, "writev", raising=False)  # the write() path, as on Windows
    real_fdopen = os.fdopen

    class HalfWriter:
        def __init__(self, file):
            self.file = file

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.file.close()

        def write(self, data):
            self.file.write(data[: len(data) // 2])
            self.file.flush()
            raise KeyboardInterrupt  # not an Exception: cleanup must still run

    monkeypatch.setattr(os, "fdopen", lambda *a, **k: HalfWriter(real_fdopen(*a, **k)))
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(new, path)
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["model.ckpt"]
    assert_same(load_checkpoint(path), old)
    save_checkpoint(new, path)
    assert_same(load_checkpoint(path), new)


def test_save_syncs_file_then_renames_then_syncs_directory(tmp_path, monkeypatch):
    path, _, new = old_and_new(tmp_path)
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append("fsync-dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync-file")
        real_fsync(fd)

    def replace(src, dst):
        assert os.path.dirname(src) == str(tmp_path) and os.path.basename(src).startswith(".model.ckpt.")
        events.append("replace")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    save_checkpoint(new, path)
    assert events == ["fsync-file", "replace", "fsync-dir"]


def test_saved_file_permissions_follow_the_umask(tmp_path):
    umask = os.umask(0o022)
    try:
        save_checkpoint(CheckpointData(trainable={}), tmp_path / "c")
    finally:
        os.umask(umask)
    assert os.stat(tmp_path / "c").st_mode & 0o777 == 0o644


def test_save_to_missing_directory_or_over_a_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        save_checkpoint(CheckpointData(trainable={}), tmp_path / "nope" / "c")
    with pytest.raises(IsADirectoryError):
        save_checkpoint(CheckpointData(trainable={}), tmp_path)
    assert os.listdir(tmp_path) == []


# Run in a child process: save a new checkpoint, but stop at STAGE, print "stopped" and wait to be killed.
KILLED_CHILD = """
import os, sys, time
import numpy as np
from onnxtrain.checkpoint import CheckpointData, save_checkpoint

path, stage = sys.argv[1], sys.argv[2]
real_fsync, real_replace, real_writev = os.fsync, os.replace, getattr(os, "writev", None)

def stop():
    print("stopped", flush=True)
    time.sleep(60)

def half_then_stop(fd, buffers):  # the pieces' one vectored write: half the bytes, then it stops
    data = b"".join(buffers)
    real_writev(fd, [data[: len(data) // 2]])
    stop()

def fsync(fd):
    stop() if stage == "before_fsync" else real_fsync(fd)

def replace(src, dst):
    if stage == "before_replace":
        stop()
    real_replace(src, dst)
    if stage == "after_replace":
        stop()

if stage == "mid_write":
    os.writev = half_then_stop
os.fsync, os.replace = fsync, replace
save_checkpoint(CheckpointData(trainable={"w": np.full(2**20, 1, np.float32)}, step=1), path)
"""


@pytest.mark.skipif(sys.platform == "win32", reason="uses SIGKILL and writev")
@pytest.mark.parametrize("stage,survivor", [("mid_write", 0), ("before_fsync", 0), ("before_replace", 0),
                                            ("after_replace", 1)])
def test_writer_killed_at_each_stage_leaves_a_complete_checkpoint(tmp_path, stage, survivor):
    """SIGKILL a process at each point of a save: the target is the old or the new complete checkpoint
    (a process crash, not a power loss: that is what the fsyncs are for)."""
    path = tmp_path / "model.ckpt"
    save_checkpoint(CheckpointData(trainable={"w": np.full(2**20, 0, np.float32)}, step=0), path)
    child = subprocess.Popen([sys.executable, "-c", KILLED_CHILD, str(path), stage], stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline() == b"stopped\n", "the child failed before reaching the stage"
        temps = [name for name in os.listdir(tmp_path) if name != "model.ckpt"]
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
    loaded = load_checkpoint(path)
    assert loaded.step == survivor and np.all(loaded.trainable["w"] == survivor)
    if survivor == 0:  # the kill landed inside the save: its temporary file was there, and is left over
        assert len(temps) == 1 and temps[0].startswith(".model.ckpt.") and temps[0].endswith(".tmp")


# ---------------------------------------------------------------- speed


@pytest.mark.slow
def test_50mb_checkpoint_is_about_as_fast_as_safetensors(tmp_path):
    """Within 3x of safetensors writing the same bytes durably (plus fsync) and reading them back;
    the extra cost is the SHA-256 pass over the data."""
    tensors = {f"layers.{i}.weight": np.ones((512, 512), np.float32) for i in range(48)}  # 50 MB

    def best_of_3(run) -> float:
        times = []
        for _ in range(3):
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
        return min(times)

    def safetensors_save():
        blob = safetensors.numpy.save(tensors)
        with open(tmp_path / "plain", "wb") as file:
            file.write(blob)
            file.flush()
            os.fsync(file.fileno())

    data = CheckpointData(trainable=tensors)
    ours_save = best_of_3(lambda: save_checkpoint(data, tmp_path / "ours"))
    ours_load = best_of_3(lambda: load_checkpoint(tmp_path / "ours"))
    plain_save = best_of_3(safetensors_save)
    plain_load = best_of_3(lambda: safetensors.numpy.load((tmp_path / "plain").read_bytes()))
    assert ours_save < 3 * plain_save + 0.02, (ours_save, plain_save)
    assert ours_load < 3 * plain_load + 0.02, (ours_load, plain_load)


def _age(path, seconds: float = 60) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


@pytest.mark.skipif(sys.platform == "win32", reason="advisory locks (fcntl) and SIGKILL")
def test_a_dead_writers_temporary_file_is_cleared_and_a_live_ones_is_kept(tmp_path):
    """A writer holds its temporary file locked until the rename: while it lives, saves and loads leave the
    file alone; once it is dead (killed mid-save), the next load removes it, as would the next save."""
    path = tmp_path / "model.ckpt"
    save_checkpoint(CheckpointData(trainable={"w": np.zeros(4, np.float32)}), path)
    child = subprocess.Popen([sys.executable, "-c", KILLED_CHILD, str(path), "before_replace"], stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline() == b"stopped\n", "the child failed before reaching the stage"
        (temp,) = [tmp_path / n for n in os.listdir(tmp_path) if n != "model.ckpt"]
        _age(temp)
        load_checkpoint(path)
        save_checkpoint(CheckpointData(trainable={"w": np.ones(4, np.float32)}), path)
        assert temp.exists(), "the temporary file of a live writer was removed"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
    load_checkpoint(path)
    assert sorted(os.listdir(tmp_path)) == ["model.ckpt"]
    other = tmp_path / ".model.ckpt.0123abcd.tmp"  # a crash leftover found by the next save
    other.write_bytes(b"partial")
    young = tmp_path / ".model.ckpt.89abcdef.tmp"  # too new to judge: its writer may not have locked it yet
    young.write_bytes(b"partial")
    _age(other)
    save_checkpoint(CheckpointData(trainable={"w": np.ones(4, np.float32)}), path)
    assert sorted(os.listdir(tmp_path)) == [".model.ckpt.89abcdef.tmp", "model.ckpt"]


@pytest.mark.parametrize("metadata", [{}, {"onnxtrain": '{"a": "quote \\" and \\u00e9 é ✓"}'}])
def test_streamed_pieces_are_the_bytes_safetensors_writes(metadata):
    """save_checkpoint writes the header and each array's own memory in turn; joined, they are exactly
    safetensors.numpy.save's bytes (order by dtype then name, offsets, JSON, padding)."""
    from onnxtrain.checkpoint.format import safetensors_pieces

    tensors = {"trainable/w": random_array("float32", (3, 5)), "trainable/b": random_array("float32", (5,)),
               "buffers/n": np.arange(3, dtype=np.int64), "frozen/h": random_array("float16", (2, 2)),
               "frozen/x": random_array("float64", ()), "frozen/empty": np.zeros((0, 4), np.float32),
               "buffers/flag": np.array([True, False]), "frozen/bf": np.ones(3, ml_dtypes.bfloat16),
               "frozen/u8": np.arange(7, dtype=np.uint8)}
    pieces = safetensors_pieces(tensors, metadata)
    assert b"".join(pieces) == safetensors.numpy.save(tensors, metadata=metadata or None)
    # the data pieces are views of the arrays, not copies
    assert any(np.shares_memory(np.frombuffer(p, np.uint8), tensors["trainable/w"]) for p in pieces[1:])


# ---------------------------------------------------------------- tensor digest


@pytest.mark.parametrize("sizes", [[3, 5_000_000, 7], [1_500_000] * 5, [5_000_000, 5_000_000], [], [0, 2, 0]])
def test_tensor_digest_is_of_the_bytes_in_order_whatever_the_batching(sizes, monkeypatch):
    """Small arrays are hashed in joined batches, large ones alone: the digest stays that of the concatenation
    (a batch left pending before a large array would reorder the bytes)."""
    monkeypatch.setattr(checkpoint_metadata, "_HASH_BATCH_BYTES", 4_000_000)
    rng = np.random.default_rng(0)
    arrays = [rng.integers(0, 255, size, dtype=np.uint8) for size in sizes]
    expected = hashlib.sha256(b"".join(a.tobytes() for a in arrays)).hexdigest()
    assert checkpoint_metadata.tensors_sha256(arrays) == expected


def test_load_properties_reads_the_header_only(tmp_path):
    """A run's progress record without reading the weights: the properties come from the header even when the
    tensor data is damaged (load_checkpoint refuses that file), and a damaged header is a CheckpointError."""
    from onnxtrain.checkpoint.format import load_properties

    path = tmp_path / "a.ckpt"
    data = CheckpointData(trainable={"w": np.arange(64, dtype=np.float32)}, step=3, properties={"run": "x", "k": 2})
    save_checkpoint(data, path)
    raw = bytearray(path.read_bytes())
    raw[-4:] = b"\xff\xff\xff\xff"   # the last tensor bytes
    path.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="checksum"):
        load_checkpoint(path)
    assert load_properties(path) == {"run": "x", "k": 2}
    path.write_bytes(bytes(raw[:20]))
    with pytest.raises(CheckpointError):
        load_properties(path)


def _npz() -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, weight=np.ones(3, np.float32))
    return buffer.getvalue()


@pytest.mark.parametrize("kind, content", [
    ("an ONNX model", lambda: models.mlp().SerializeToString()),
    ("a zip archive", _npz),
    ("a Python pickle", lambda: pickle.dumps({"weight": np.ones(3, np.float32)}, protocol=4)),
    ("a text file", lambda: b"# notes about my model\n" * 4),
])
def test_other_files_are_named(tmp_path, kind, content):
    """A file given as the checkpoint that is another kind of file is named as such (it was "header length N is
    absurd"): the model, a .npz or torch file, a pickle, a text file."""
    path = tmp_path / "given"
    path.write_bytes(content())
    with pytest.raises(CheckpointError, match=rf"is {kind}.*, not a checkpoint \(a safetensors file"):
        load_checkpoint(path)
