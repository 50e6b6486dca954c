"""Federated LoRA: the Flower client and FedAvg exchange only the adapters and the head, never the base weights."""

from __future__ import annotations

import time

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import ConfigRecord, Context, Metadata, MetricRecord, RecordDict  # noqa: E402
from flwr.app.message.message import make_message  # noqa: E402

from onnxtrain.api import CheckpointState  # noqa: E402
from onnxtrain.artifacts import LoRA, LossType, OptimType, generate_artifacts  # noqa: E402
from onnxtrain.federated._flower import from_record, to_record  # noqa: E402
from onnxtrain.federated.client import ClientSettings, DigitsPartition, make_client_app  # noqa: E402
from onnxtrain.federated.example import DIGITS_CLASSES, DIGITS_FEATURES, mlp_model  # noqa: E402
from onnxtrain.federated.server import ValidatingFedAvg  # noqa: E402
from onnxtrain.federated.spec import ParamSpec  # noqa: E402


def _message(content: RecordDict, src: int = 0):
    metadata = Metadata(run_id=1, message_id="", src_node_id=src, dst_node_id=1, reply_to_message_id="",
                        group_id="1", created_at=time.time(), ttl=60.0, message_type="train")
    return make_message(metadata, content)


def test_clients_and_fedavg_exchange_only_adapters_and_head(tmp_path):
    model = mlp_model((DIGITS_FEATURES, 32, DIGITS_CLASSES), 0)
    generate_artifacts(model, requires_grad=["fc2.*"], loss=LossType.CrossEntropyLoss, optimizer=OptimType.SGD,
                       artifact_directory=tmp_path, additional_output_names=["output"],
                       lora=LoRA(rank=4, alpha=8, targets=["fc1.weight"]))
    state = CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    spec = ParamSpec.from_state(state)
    assert list(spec.names) == ["fc1.lora_A.weight", "fc1.lora_B.weight", "fc2.weight", "fc2.bias"]
    initial = spec.values(state)
    assert sum(v.nbytes for v in initial.values()) == 4 * (4 * 64 + 32 * 4 + 10 * 32 + 10)  # 2,856 bytes

    app = make_client_app(ClientSettings(artifacts_dir=str(tmp_path), data=DigitsPartition()))
    replies = []
    for node in (0, 1):
        context = Context(run_id=1, node_id=node + 1, node_config={"partition-id": node, "num-partitions": 2},
                          state=RecordDict(), run_config={})
        msg = _message(RecordDict({"arrays": to_record(initial), "config": ConfigRecord(
            {"local-epochs": 1, "learning-rate": 0.05, "server-round": 1})}))
        reply = app(msg, context)
        assert not reply.has_error()
        arrays = from_record(reply.content["arrays"])
        assert list(arrays) == list(spec.names)
        assert np.abs(arrays["fc1.lora_B.weight"]).max() > 0  # the adapter trained
        replies.append(_message(RecordDict({"arrays": reply.content["arrays"], "metrics": MetricRecord(
            {"num-examples": reply.content["metrics"]["num-examples"]})}), src=node + 1))
    averaged, _ = ValidatingFedAvg(spec).aggregate_train(1, replies)
    assert list(from_record(averaged)) == list(spec.names)
