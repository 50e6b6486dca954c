"""The ServerApp's strategy loop with Flower's strategies, on an in-process Grid (no Ray): what the global
model becomes, failures, resuming, and clients holding other artifacts."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import Context, RecordDict  # noqa: E402

from onnxtrain.api import CheckpointState  # noqa: E402
from onnxtrain.federated.client import ClientSettings, make_client_app  # noqa: E402
from onnxtrain.federated.server import ServerSettings, run, validating  # noqa: E402
from onnxtrain.federated.spec import ParamSpec, UpdateRejected  # noqa: E402

from .local_grid import LocalGrid  # noqa: E402


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """Artifacts of a 64-4-10 MLP (plain SGD: one local step is w - lr * grad)."""
    from onnxtrain.federated.example import build_artifacts

    directory = tmp_path_factory.mktemp("mlp4")
    build_artifacts(directory, hidden=4, momentum=0.0)
    return directory


def _data(context: Context):
    """Partition p holds 8 * (p + 1) examples, so that the weights of FedAvg differ."""
    pid = int(context.node_config["partition-id"])
    rng = np.random.default_rng(pid)
    n = 8 * (pid + 1)
    x, y = rng.random((n, 64), dtype=np.float32), rng.integers(0, 10, n).astype(np.int64)
    return x, y, x, y


def _run(artifacts, output_dir, clients: int = 3, rounds: int = 1, apps=None, **settings):
    client = make_client_app(ClientSettings(artifacts_dir=str(artifacts), data=_data))
    settings = ServerSettings(artifacts_dir=str(artifacts), output_dir=str(output_dir), num_rounds=rounds,
                              min_nodes=clients - len(apps or {}), local_epochs=1, batch_size=64,
                              learning_rate=0.1, **settings)
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={})
    with LocalGrid(client, [{"partition-id": p} for p in range(clients)], apps=apps) as grid:
        run(grid, context, settings)
    history = [json.loads(line) for line in (output_dir / "history.jsonl").read_text().splitlines()]
    return grid, history


def _global(output_dir) -> dict[str, np.ndarray]:
    state = CheckpointState.load_checkpoint(output_dir / "checkpoint")
    return ParamSpec.from_state(state).values(state)


def test_global_model_is_the_num_examples_weighted_mean_of_the_replies(small, tmp_path):
    grid, history = _run(small, tmp_path)
    weights = np.array([s["metrics"]["num-examples"] for s in grid.sent], np.float64)
    assert sorted(weights) == [8, 16, 24]
    result = _global(tmp_path)
    for name, value in result.items():
        expected = sum(w * s["arrays"][name] for w, s in zip(weights, grid.sent)) / weights.sum()
        assert value.dtype == np.float32
        np.testing.assert_allclose(value, expected, rtol=1e-5, atol=1e-7, err_msg=name)
    assert not np.allclose(result["fc2.weight"], grid.sent[0]["arrays"]["fc2.weight"])
    assert history[1]["accepted"] == 3 and history[1]["failed"] == 0


def test_fedmedian_takes_the_elementwise_median(small, tmp_path):
    grid, _ = _run(small, tmp_path, strategy="FedMedian")
    for name, value in _global(tmp_path).items():
        np.testing.assert_array_equal(value, np.median([s["arrays"][name] for s in grid.sent], axis=0))


@pytest.mark.parametrize("strategy", ["FedAdam", "FedYogi"])
def test_adaptive_strategies_keep_the_checkpoint_dtype_across_rounds(small, tmp_path, strategy):
    """FedAdam averages to float64; the clients and the global checkpoint take it back as float32."""
    grid, history = _run(small, tmp_path, rounds=2, strategy=strategy)
    assert [r["accepted"] for r in history[1:]] == [3, 3] and [r["failed"] for r in history[1:]] == [0, 0]
    assert all(v.dtype == np.float32 and np.isfinite(v).all() for v in _global(tmp_path).values())


def test_a_failing_client_and_a_client_of_another_model_are_reported_by_node(small, tmp_path_factory, tmp_path,
                                                                              caplog):
    from onnxtrain.federated.example import build_artifacts

    other = tmp_path_factory.mktemp("mlp5")
    build_artifacts(other, hidden=5)

    def broken(msg, context):
        raise RuntimeError("disk full")

    apps = {103: make_client_app(ClientSettings(artifacts_dir=str(other), data=_data)), 104: broken}
    with caplog.at_level(logging.WARNING, logger="flwr"):
        grid, history = _run(small, tmp_path, clients=5, apps=apps)
    record = history[1]
    assert record["accepted"] == 3 and record["failed"] == 2
    reasons = {f["node"]: f["reason"] for f in record["failures"]}
    assert "'fc1.weight' has shape [64, 4], expected [64, 5]" in reasons[103]
    assert "disk full" in reasons[104]
    assert "round 1: node 103 failed" in caplog.text and "round 1: node 104 failed" in caplog.text
    assert "round 1: node 104 failed: disk full" in caplog.text
    assert "round 1: node 104 failed to evaluate: disk full" in caplog.text


def test_resume_from_a_global_checkpoint(small, tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    _run(small, first)
    trained = _global(first)
    _, history = _run(small, second, rounds=0, initial_checkpoint=str(first / "checkpoint"))
    assert [r["round"] for r in history] == [0]
    for name, value in _global(second).items():
        np.testing.assert_array_equal(value, trained[name], err_msg=name)


def test_resume_refuses_a_checkpoint_of_another_model(small, tmp_path_factory, tmp_path):
    from onnxtrain.federated.example import build_artifacts

    other = tmp_path_factory.mktemp("mlp6")
    build_artifacts(other, hidden=6)
    with pytest.raises(UpdateRejected, match=r"initial-checkpoint .* does not fit .*'fc1.weight' has shape "
                                             r"\[64, 6\], expected \[64, 4\]"):
        _run(small, tmp_path, rounds=0, initial_checkpoint=str(other / "checkpoint"))
    with pytest.raises(FileNotFoundError, match="initial-checkpoint .*nope' does not exist"):
        _run(small, tmp_path, rounds=0, initial_checkpoint=str(tmp_path / "nope"))


def test_fedprox_at_mu_zero_is_fedavg_bit_for_bit(small, tmp_path):
    """Flower's FedProx in the strategy loop (the proximal term itself: test_proximal.py). The replies are compared
    by node: Flower samples the nodes in a random order, so the global mean's rounding (not its value) changes
    from run to run, FedAvg's too."""
    fedavg, _ = _run(small, tmp_path / "fedavg")
    zero, history = _run(small, tmp_path / "mu0", strategy="FedProx", strategy_args={"proximal_mu": 0.0})
    assert history[1]["accepted"] == 3
    replies = {s["node"]: s["arrays"] for s in zero.sent}
    assert len(fedavg.sent) == len(replies) == 3
    for sent in fedavg.sent:
        for name, value in sent["arrays"].items():
            np.testing.assert_array_equal(replies[sent["node"]][name], value, err_msg=f"node {sent['node']}: {name}")


def test_validating_names_the_known_strategies():
    assert validating("Krum").__name__ == "ValidatingKrum"
    with pytest.raises(ValueError, match=r"strategy 'FedSGD' is not a Flower strategy derived from FedAvg; "
                                         r"known: \[.*'FedMedian'"):
        validating("FedSGD")


def _train_once(artifacts, node_config: dict, config: dict) -> dict[str, np.ndarray]:
    from flwr.app import ConfigRecord

    from onnxtrain.federated._flower import from_record, to_record

    from .test_apps import _initial, _message

    _, initial = _initial(artifacts)
    app = make_client_app(ClientSettings(artifacts_dir=str(artifacts), data=_data))
    context = Context(run_id=1, node_id=5, node_config={"partition-id": 2, **node_config}, state=RecordDict(),
                      run_config={})
    msg = _message(RecordDict({"arrays": to_record(initial), "config": ConfigRecord({"learning-rate": 0.1, **config})}))
    return from_record(app(msg, context).content["arrays"])


def test_node_config_sets_the_devices_own_batch_size_and_local_epochs(small):
    server = {"batch-size": 64, "local-epochs": 1, "server-round": 1}
    own = _train_once(small, {"batch-size": 4, "local-epochs": 3}, server)
    same = _train_once(small, {}, dict(server, **{"batch-size": 4, "local-epochs": 3}))
    plain = _train_once(small, {}, server)
    for name in own:
        np.testing.assert_array_equal(own[name], same[name], err_msg=name)
    assert not np.allclose(own["fc2.weight"], plain["fc2.weight"])


@pytest.mark.parametrize("node_config, message", [
    ({"batch-size": 0}, "node 5: setting 'batch-size' must be a positive integer, got 0"),
    ({"local-epochs": 1.5}, "setting 'local-epochs' must be an int, got 1.5"),
])
def test_bad_device_settings_are_named(small, node_config, message):
    with pytest.raises(ValueError, match=message):
        _train_once(small, node_config, {"server-round": 1})


def test_a_device_with_other_frozen_weights_or_graphs_is_refused_by_name(tmp_path_factory, tmp_path):
    """Same trainable names and shapes, so the updates would pass every shape check: the fingerprint that the
    server sends catches other frozen parameters and other graphs."""
    import shutil

    import onnx

    from onnxtrain.federated.example import build_artifacts

    mine, reseeded = tmp_path_factory.mktemp("frozen0"), tmp_path_factory.mktemp("frozen1")
    build_artifacts(mine, hidden=4, frozen=("fc1.weight",), seed=0)
    build_artifacts(reseeded, hidden=4, frozen=("fc1.weight",), seed=1)
    regraphed = tmp_path / "regraphed"
    shutil.copytree(mine, regraphed)
    model = onnx.load(regraphed / "eval_model.onnx")
    model.graph.doc_string = "edited"
    onnx.save(model, regraphed / "eval_model.onnx")
    apps = {100 + i: make_client_app(ClientSettings(artifacts_dir=str(d), data=_data))
            for i, d in ((2, reseeded), (3, regraphed))}
    _, history = _run(mine, tmp_path / "out", clients=4, apps=apps)
    reasons = {f["node"]: f["reason"] for f in history[1]["failures"]}
    assert history[1]["accepted"] == 2 and sorted(reasons) == [102, 103]
    assert "are not those of the server: the frozen parameters are different" in reasons[102]
    assert "are not those of the server: the training or eval graph is different" in reasons[103]


def test_server_test_data_file_errors_name_the_setting(small, tmp_path):
    from onnxtrain.data.dataset import DatasetError
    from onnxtrain.federated.server import _npz_test_data

    with pytest.raises(FileNotFoundError, match="test-data '.*missing.npz' does not exist"):
        _npz_test_data(str(tmp_path / "missing.npz"))
    np.savez(tmp_path / "nolabels.npz", x=np.zeros((2, 64), np.float32))
    with pytest.raises(DatasetError, match="test-data: .*nolabels.npz has no array 'y'"):
        _npz_test_data(str(tmp_path / "nolabels.npz"))
    x, y = np.ones((3, 64), np.float32), np.arange(3, dtype=np.int64)
    np.savez(tmp_path / "test.npz", x=x, y=y)
    got = _npz_test_data(str(tmp_path / "test.npz"))
    np.testing.assert_array_equal(got[0], x)
    np.testing.assert_array_equal(got[1], y)


def test_a_failure_reason_from_ray_keeps_the_exception_message():
    from flwr.app import Error, Message

    from onnxtrain.federated.server import _error_reason

    from .test_apps import _message

    ray_reason = ("<class 'ray.exceptions.RayTaskError(ClientAppException)'>:<'ray::ClientAppActor.run() " +
                  "  File \"x.py\", line 1, in f\n" * 40 + "flwr.clientapp.client_app.ClientAppException: \n"
                  "Exception ClientAppException occurred. Message: alpha must be 'positive'\n'>")
    with LocalGrid(None, []):
        reply = Message(Error(code=2, reason=ray_reason), reply_to=_message(RecordDict()))
        assert _error_reason(reply) == "alpha must be 'positive'"
        long = Message(Error(code=2, reason="x" * 900 + " the end"), reply_to=_message(RecordDict()))
        assert _error_reason(long).endswith("the end") and len(_error_reason(long)) == 503
        deployed = Message(Error(code=2, reason="<class 'ValueError'>:<'no 'x' here'>"),
                           reply_to=_message(RecordDict()))
        assert _error_reason(deployed) == "no 'x' here"
