"""Checkpoints written by onnxruntime-training 1.19.2: read, carried into onnxtrain's, and training resumes.

The peer's file in data/peer_tiny/ was written by the peer itself (data/make_peer_checkpoint.py, run in its venv):
3 AdamW steps on a tiny model, with properties; expected.npz holds what the peer held then and after one more step.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from onnxtrain.api import CheckpointState, Module, Optimizer
from onnxtrain.artifacts import LossType, OptimType, generate_artifacts
from onnxtrain.checkpoint import (
    CheckpointData,
    import_peer_checkpoint,
    load_checkpoint,
    read_peer_checkpoint,
    save_checkpoint,
)
from onnxtrain.errors import CheckpointError
from tests import models

DATA = Path(__file__).parent / "data" / "peer_tiny"
PEER = DATA / "checkpoint"
PARAMS = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]


@pytest.fixture(scope="module")
def expected():
    with np.load(DATA / "expected.npz") as npz:
        return dict(npz)


@pytest.fixture
def artifacts(tmp_path):
    generate_artifacts(str(DATA / "tiny.onnx"), requires_grad=PARAMS[:3], frozen_params=PARAMS[3:],
                       loss=LossType.CrossEntropyLoss, optimizer=OptimType.AdamW, artifact_directory=tmp_path)
    return tmp_path


def test_reads_parameters_moments_step_and_properties(expected):
    data = read_peer_checkpoint(PEER)
    assert list(data.trainable) == ["fc1.bias", "fc1.weight", "fc2.weight"]   # the peer sorts them by name
    assert list(data.frozen) == ["fc2.bias"]
    for name in PARAMS:
        value = {**data.trainable, **data.frozen}[name]
        np.testing.assert_array_equal(value, expected[f"param/{name}"])
        assert value.dtype == np.float32 and value.flags.writeable
    for name in PARAMS[:3]:
        np.testing.assert_array_equal(data.optimizer[name]["exp_avg"], expected[f"moment/{name}/momentum0"])
        np.testing.assert_array_equal(data.optimizer[name]["exp_avg_sq"], expected[f"moment/{name}/momentum1"])
    assert data.step == 3
    assert data.properties == {"epoch": 3, "best_loss": 0.25, "user": "alice"}


def test_training_resumes_where_the_peer_stopped(artifacts, expected, tmp_path):
    data = import_peer_checkpoint(PEER, artifacts / "checkpoint")
    assert list(data.trainable) == list(load_checkpoint(artifacts / "checkpoint").trainable)  # onnxtrain's layout
    save_checkpoint(data, tmp_path / "resumed.ckpt", include_optimizer_state=True)

    def one_step(path) -> dict[str, np.ndarray]:
        state = CheckpointState.load_checkpoint(path)
        module = Module(artifacts / "training_model.onnx", state, artifacts / "eval_model.onnx")
        optimizer = Optimizer(artifacts / "optimizer_model.onnx", module)
        optimizer.set_learning_rate(0.01)
        module(expected["x"], expected["y"])
        optimizer.step()
        return {n: state.parameters[n].data for n in PARAMS}

    resumed = one_step(tmp_path / "resumed.ckpt")
    for name in PARAMS:
        np.testing.assert_allclose(resumed[name], expected[f"next/{name}"], rtol=0, atol=1e-6, err_msg=name)
    # the moments and the step matter: the same weights with a fresh optimizer state step elsewhere
    data.optimizer, data.step = {}, 0
    save_checkpoint(data, tmp_path / "fresh.ckpt")
    fresh = one_step(tmp_path / "fresh.ckpt")
    assert max(np.abs(fresh[n] - expected[f"next/{n}"]).max() for n in PARAMS[:3]) > 1e-3


def test_loading_a_peer_checkpoint_as_onnxtrains_names_the_conversion():
    with pytest.raises(CheckpointError, match="onnxruntime-training checkpoint.*onnxtrain import"):
        CheckpointState.load_checkpoint(PEER)


def test_artifacts_of_another_model_are_refused(tmp_path):
    generate_artifacts(models.mlp(), loss=LossType.MSELoss, optimizer=OptimType.AdamW, artifact_directory=tmp_path)
    with pytest.raises(CheckpointError, match=r"'fc1.bias' is float32\[4\], the artifacts expect float32\[16\]"):
        import_peer_checkpoint(PEER, tmp_path / "checkpoint")   # the same names, other sizes
    other = CheckpointData(trainable={"encoder.weight": np.zeros((4, 3), np.float32)})
    with pytest.raises(CheckpointError, match=r"holds \['fc1.bias', .*does not have: generate the artifacts"):
        import_peer_checkpoint(PEER, other)


def test_damaged_files_are_checkpoint_errors(tmp_path):
    """Every truncation, and byte flips all over the file: a CheckpointError or a clean read, never another
    exception (the reader follows offsets the file gives)."""
    raw = PEER.read_bytes()
    path = tmp_path / "damaged"
    cases = [raw[:n] for n in range(0, len(raw), 5)]
    rng = np.random.default_rng(0)
    for _ in range(300):
        damaged = bytearray(raw)
        for i in rng.integers(8, len(raw), 3):
            damaged[i] = int(rng.integers(0, 256))
        cases.append(bytes(damaged))
    errors = 0
    for case in cases:
        path.write_bytes(case)
        try:
            read_peer_checkpoint(path)
        except CheckpointError:
            errors += 1
    assert errors >= len(raw) // 5  # every truncation at least
    with pytest.raises(CheckpointError, match="does not exist"):
        read_peer_checkpoint(tmp_path / "missing")


def test_import_command(artifacts, tmp_path):
    out = tmp_path / "from_peer.ckpt"
    run = [sys.executable, "-m", "onnxtrain.cli", "import", str(PEER)]
    done = subprocess.run([*run, "--artifacts", str(artifacts), "-o", str(out)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")})
    assert done.returncode == 0, done.stderr
    assert "3 trainable, 1 frozen, 0 buffers, 6 optimizer states, step 3, 3 properties" in done.stdout
    assert load_checkpoint(out).step == 3
    missing = subprocess.run([*run, "-o", str(out)], capture_output=True, text=True)
    assert missing.returncode != 0 and "pass --artifacts DIR" in missing.stderr
