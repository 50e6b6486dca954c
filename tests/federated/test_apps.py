"""The ClientApp and the validating FedAvg, called directly with hand-made Flower messages (no engine)."""

from __future__ import annotations

import time

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Metadata, MetricRecord, RecordDict  # noqa: E402
from flwr.app.message.message import make_message  # noqa: E402

from onnxtrain.federated._flower import from_record, to_record  # noqa: E402
from onnxtrain.federated.client import ClientSettings, DigitsPartition, make_client_app  # noqa: E402
from onnxtrain.federated.server import ValidatingFedAvg  # noqa: E402
from onnxtrain.federated.spec import ParamSpec, UpdateRejected  # noqa: E402


def _message(content: RecordDict, message_type: str = "train", src: int = 0, dst: int = 1):
    metadata = Metadata(run_id=1, message_id="", src_node_id=src, dst_node_id=dst, reply_to_message_id="",
                        group_id="1", created_at=time.time(), ttl=60.0, message_type=message_type)
    return make_message(metadata, content)


def _context(partition_id: int = 0, node_id: int = 1) -> Context:
    return Context(run_id=1, node_id=node_id, node_config={"partition-id": partition_id, "num-partitions": 3},
                   state=RecordDict(), run_config={})


def _initial(artifacts) -> tuple[ParamSpec, dict[str, np.ndarray]]:
    from onnxtrain.api import CheckpointState

    state = CheckpointState.load_checkpoint(artifacts / "checkpoint")
    spec = ParamSpec.from_state(state)
    return spec, spec.values(state)


def test_client_trains_and_replies_with_trainable_parameters_and_num_examples(frozen_artifacts):
    app = make_client_app(ClientSettings(artifacts_dir=str(frozen_artifacts), data=DigitsPartition()))
    spec, initial = _initial(frozen_artifacts)
    msg = _message(RecordDict({"arrays": to_record(initial),
                               "config": ConfigRecord({"local-epochs": 1, "learning-rate": 0.1, "server-round": 1})}))
    reply = app(msg, _context())
    assert not reply.has_error()
    arrays = from_record(reply.content["arrays"])
    assert list(arrays) == ["fc2.weight", "fc2.bias"]          # the frozen fc1 stays on the device
    assert not np.allclose(arrays["fc2.weight"], initial["fc2.weight"])
    metrics = reply.content["metrics"]
    x_train = DigitsPartition()(_context())[0]
    assert metrics["num-examples"] == len(x_train)
    assert np.isfinite(metrics["train-loss"])


def test_client_evaluates_on_request(mlp_artifacts):
    app = make_client_app(ClientSettings(artifacts_dir=str(mlp_artifacts), data=DigitsPartition()))
    _, initial = _initial(mlp_artifacts)
    reply = app(_message(RecordDict({"arrays": to_record(initial), "config": ConfigRecord()}), "evaluate"),
                _context(partition_id=2))
    metrics = reply.content["metrics"]
    assert metrics["num-examples"] == len(DigitsPartition()(_context(partition_id=2))[2])
    assert 0.0 <= metrics["eval-accuracy"] <= 1.0 and np.isfinite(metrics["eval-loss"])


def test_client_refuses_parameters_that_do_not_fit_its_checkpoint(mlp_artifacts):
    app = make_client_app(ClientSettings(artifacts_dir=str(mlp_artifacts), data=DigitsPartition()))
    _, initial = _initial(mlp_artifacts)
    initial["fc1.weight"] = initial["fc1.weight"][:, :31]
    with pytest.raises(UpdateRejected, match=r"'fc1.weight' has shape \[64, 31\], expected \[64, 32\]"):
        app(_message(RecordDict({"arrays": to_record(initial), "config": ConfigRecord()})), _context())


def test_client_without_data_says_how_to_give_it_some(mlp_artifacts):
    app = make_client_app(ClientSettings(artifacts_dir=str(mlp_artifacts)))
    _, initial = _initial(mlp_artifacts)
    context = Context(run_id=1, node_id=7, node_config={}, state=RecordDict(), run_config={})
    with pytest.raises(ValueError, match="node 7 has no data: start the SuperNode with --node-config"):
        app(_message(RecordDict({"arrays": to_record(initial), "config": ConfigRecord()})), context)


def _reply(arrays: dict, num_examples, src: int, **extra_metrics):
    return _message(RecordDict({"arrays": to_record(arrays),
                                "metrics": MetricRecord({"num-examples": num_examples, **extra_metrics})}), src=src)


def test_fedavg_drops_bad_updates_and_averages_the_rest_by_examples(mlp_artifacts, caplog):
    spec, initial = _initial(mlp_artifacts)
    ones = {n: np.ones_like(v) for n, v in initial.items()}
    threes = {n: np.full_like(v, 3.0) for n, v in reversed(initial.items())}   # any order is fine
    nan = {n: v.copy() for n, v in ones.items()}
    nan["fc2.bias"][0] = np.nan
    shape = dict(ones, **{"fc1.weight": np.ones((64, 31), np.float32)})
    renamed = {("w" if n == "fc1.weight" else n): v for n, v in ones.items()}
    replies = [_reply(ones, 10, 1), _reply(threes, 30, 2, extra=1.0), _reply(nan, 1000, 3), _reply(shape, 10, 4),
               _reply(renamed, 10, 5), _reply(ones, 0, 6)]
    strategy = ValidatingFedAvg(spec)
    arrays, metrics = strategy.aggregate_train(1, replies)
    averaged = from_record(arrays)
    assert list(averaged) == list(spec.names)                      # the global model keeps the checkpoint order
    for name, value in averaged.items():
        assert value.dtype == np.float32
        np.testing.assert_allclose(value, 2.5, err_msg=name)       # (10 * 1 + 30 * 3) / 40
    info = strategy.rounds[1]
    assert info["accepted"] == 2
    reasons = {r["node"]: r["reason"] for r in info["rejected"]}
    assert sorted(reasons) == [3, 4, 5, 6]
    assert "non-finite" in reasons[3] and "shape [64, 31], expected [64, 32]" in reasons[4]
    assert "missing ['fc1.weight']" in reasons[5] and "unexpected ['w']" in reasons[5]
    assert "'num-examples' must be a positive number" in reasons[6]
    assert "rejected the update of node 3" in caplog.text


def test_fedavg_keeps_the_global_model_when_every_update_is_bad(mlp_artifacts):
    spec, initial = _initial(mlp_artifacts)
    nan = {n: np.full_like(v, np.nan) for n, v in initial.items()}
    arrays, _ = ValidatingFedAvg(spec).aggregate_train(2, [_reply(nan, 10, 1), _reply(nan, 10, 2)])
    assert arrays is None   # Strategy.start keeps the previous global arrays


def test_records_keep_order_and_refuse_undecodable_arrays():
    arrays = {"b": np.arange(3, dtype=np.float32), "a": np.eye(2, dtype=np.float32)}
    back = from_record(to_record(arrays))
    assert list(back) == ["b", "a"]
    np.testing.assert_array_equal(back["a"], arrays["a"])
    garbage = ArrayRecord({"a": Array(dtype="float32", shape=(2, 2), stype="numpy.ndarray", data=b"not npy")})
    with pytest.raises(UpdateRejected, match="parameter 'a' cannot be decoded"):
        from_record(garbage)


@pytest.fixture(scope="module")
def bn_artifacts(tmp_path_factory):
    """A small Conv + BatchNorm (training mode) model: its running statistics are checkpoint buffers."""
    from onnxtrain.artifacts import LossType, OptimType, generate_artifacts
    from tests import models

    directory = tmp_path_factory.mktemp("conv_bn")
    generate_artifacts(models.conv_bn(), loss=LossType.CrossEntropyLoss, optimizer=OptimType.AdamW,
                       artifact_directory=directory)
    return directory


def _bn_data(context: Context):
    rng = np.random.default_rng(int(context.node_config.get("partition-id", 0)))
    x = (rng.standard_normal((24, 2, 6, 6)) * 2 + 1).astype(np.float32)
    y = rng.integers(0, 3, 24).astype(np.int64)
    return x, y, x, y


def test_batchnorm_statistics_travel_and_are_averaged(bn_artifacts, tmp_path):
    """The devices send the running statistics their training updated; FedAvg averages them like the
    parameters; the server's global model (what it evaluates and exports) takes the average."""
    from onnxtrain.api import CheckpointState
    from onnxtrain.federated.server import GlobalModel

    spec, initial = _initial(bn_artifacts)
    assert spec.buffers == {"bn.running_mean", "bn.running_var"}
    assert list(spec.names)[-2:] == ["bn.running_mean", "bn.running_var"]
    app = make_client_app(ClientSettings(artifacts_dir=str(bn_artifacts), data=_bn_data, batch_size=8))
    config = ConfigRecord({"local-epochs": 1, "learning-rate": 0.01, "server-round": 1})
    sent = [from_record(app(_message(RecordDict({"arrays": to_record(initial), "config": config})),
                            _context(partition_id=p)).content["arrays"]) for p in (0, 1)]
    for arrays in sent:
        assert not np.allclose(arrays["bn.running_mean"], initial["bn.running_mean"])   # trained on the data
    assert not np.allclose(sent[0]["bn.running_mean"], sent[1]["bn.running_mean"])      # each on its own

    strategy = ValidatingFedAvg(spec)
    averaged, _ = strategy.aggregate_train(1, [_reply(sent[0], 10, 1), _reply(sent[1], 30, 2)])
    averaged = from_record(averaged)
    for name in spec.buffers:
        np.testing.assert_allclose(averaged[name], (10 * sent[0][name] + 30 * sent[1][name]) / 40, rtol=1e-6)

    paths = GlobalModel(str(bn_artifacts), str(tmp_path), strategy)(1, to_record(averaged))
    assert paths is None   # no server test data: no metrics
    saved = CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    for name in spec.buffers:
        np.testing.assert_array_equal(saved.buffers[name], averaged[name])


def test_a_bad_buffer_is_refused_by_name(bn_artifacts):
    spec, initial = _initial(bn_artifacts)
    initial["bn.running_var"][1] = np.nan
    with pytest.raises(UpdateRejected, match=r"buffer 'bn.running_var' has 1 non-finite"):
        spec.check(initial)
    del initial["bn.running_mean"]
    with pytest.raises(UpdateRejected, match=r"missing \['bn.running_mean'\]"):
        spec.check(initial)


def test_every_documented_run_config_key_can_be_set_in_the_app_pyproject():
    """Flower refuses a --run-config override of a key the app's pyproject does not list."""
    import re
    from pathlib import Path

    from onnxtrain.federated.app import app_pyproject

    table = Path(__file__).parents[2].joinpath("docs", "federated.md").read_text()
    documented = {k for row in re.findall(r"^\| (`[^|]*`) \| run", table, re.M) for k in re.findall(r"`([^`]+)`", row)}
    text = app_pyproject(round_timeout=60.0, alpha=0.3, seed=1)
    assert "round-timeout" in documented and {"alpha", "seed"} <= documented
    for key in documented:
        assert re.search(rf"^{re.escape(key)} = ", text, re.M), key
    assert "round-timeout = 60.0" in text and "alpha = 0.3" in text and "seed = 1" in text
