"""Real Flower runs: the simulation engine (Ray) with the onnxtrain ClientApp and ServerApp on the digits."""

from __future__ import annotations

import sys

import numpy as np
import pytest

pytest.importorskip("flwr")
pytest.importorskip("ray")

import onnxruntime as ort  # noqa: E402
import ray.cloudpickle  # noqa: E402

from onnxtrain.api import CheckpointState  # noqa: E402
from onnxtrain.federated._flower import from_record, to_record  # noqa: E402
from onnxtrain.federated.example import test_set  # noqa: E402
from onnxtrain.federated.simulation import simulate  # noqa: E402

# The fault-injecting mod below runs in Ray's worker processes, which cannot import this test module.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _check_global_model(global_dir, accuracy: float) -> None:
    state = CheckpointState.load_checkpoint(global_dir / "checkpoint")
    for name, param in state.parameters.items():
        assert np.isfinite(param.data).all(), name
    session = ort.InferenceSession(str(global_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    x, y = test_set()
    logits = session.run(["output"], {"input": x})[0]
    assert np.mean(logits.argmax(1) == y) == pytest.approx(accuracy, abs=1e-9)


def test_fedavg_three_clients_three_rounds_accuracy_rises(tmp_path):
    lines = []
    history = simulate(clients=3, rounds=3, output_dir=tmp_path, out=lines.append)
    accuracy = [r["accuracy"] for r in history]
    assert [r["round"] for r in history] == [0, 1, 2, 3]
    assert all(r["accepted"] == 3 and r["rejected"] == 0 for r in history[1:])
    assert accuracy[3] > accuracy[1] > accuracy[0] + 0.3, accuracy
    assert accuracy[3] > 0.8, accuracy
    assert any("global acc" in line for line in lines) and len(lines) >= 5   # header, rounds 0-3, summary
    _check_global_model(tmp_path / "global", accuracy[3])


def _bad_clients(msg, context, call_next):
    """Partition 0 replies with a NaN, partition 1 with a truncated weight; the others behave."""
    reply = call_next(msg, context)
    if msg.metadata.message_type != "train" or reply.has_error():
        return reply
    pid = int(context.node_config["partition-id"])
    if pid in (0, 1):
        arrays = from_record(reply.content["arrays"])
        if pid == 0:
            arrays["fc2.weight"][0, 0] = np.nan
        else:
            arrays["fc1.weight"] = arrays["fc1.weight"][:, :-1].copy()
        reply.content["arrays"] = to_record(arrays)
    return reply


def test_bad_updates_are_dropped_and_the_global_model_stays_finite(tmp_path):
    history = simulate(clients=4, rounds=2, output_dir=tmp_path, client_mods=[_bad_clients], out=lambda _: None)
    for record in history[1:]:
        assert record["accepted"] == 2 and record["rejected"] == 2, record
        reasons = sorted(r["reason"] for r in record["rejections"])
        assert "non-finite" in reasons[1] and "'fc1.weight' has shape [64, 31], expected [64, 32]" in reasons[0]
        assert np.isfinite(record["accuracy"])
    assert history[2]["accuracy"] > history[0]["accuracy"] + 0.2, [r["accuracy"] for r in history]
    _check_global_model(tmp_path / "global", history[2]["accuracy"])
