"""The Flower ClientApp: the onnxtrain runtime on the device's own data.

``train``: load the global trainable parameters and buffers (BatchNorm running statistics) from ``"arrays"``,
train E local epochs (with FedProx's proximal term when the config carries ``proximal-mu`` > 0), reply with
the new ones and ``"num-examples"``. ``evaluate``: load them, evaluate on the device's validation data, reply
with ``"eval-loss"``, ``"eval-accuracy"`` and ``"num-examples"``. Frozen parameters come from the device's own
checkpoint and never leave it.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from onnxtrain.data.convert import read_npz
from onnxtrain.data.dataset import DatasetError
from onnxtrain.federated import example
from onnxtrain.federated._flower import (
    ClientApp,
    Context,
    Message,
    MetricRecord,
    RecordDict,
    from_record,
    logger,
    setting,
    to_record,
)
from onnxtrain.federated.local import LocalModel, compare_fingerprints
from onnxtrain.federated.proximal import check_mu
from onnxtrain.federated.spec import UpdateRejected

__all__ = ["ClientSettings", "DataFn", "make_client_app", "default_data", "DigitsPartition"]

#: ``data(context) -> (x_train, y_train, x_val, y_val)``: the device's local data.
DataFn = Callable[[Context], "tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]"]


@dataclass
class ClientSettings:
    """Defaults of the ClientApp. Each one can be set per message (the server's config), per device (node
    config) or per run (run config) under the key in the comment, looked up in that order.

    ``data`` defaults to :func:`default_data`: an ``.npz`` named by ``data-path``, or the digits demo partition
    named by ``partition-id`` / ``num-partitions`` (which Flower's simulation engine sets on every node).
    """

    artifacts_dir: str | None = None   # "artifacts-dir"
    local_epochs: int = 1              # "local-epochs"
    batch_size: int = 32               # "batch-size"
    learning_rate: float = 0.05        # "learning-rate"
    seed: int = 0                      # "seed": shuffling, and the demo's split
    threads: int = 1                   # "threads": onnxruntime intra-op threads
    data: DataFn | None = None


def make_client_app(settings: ClientSettings | None = None, mods: Sequence | None = None) -> ClientApp:
    """A ClientApp with ``train`` and ``evaluate`` handlers; ``mods`` are Flower mods wrapped around both."""
    settings = settings or ClientSettings()
    app = ClientApp(mods=list(mods or []))

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        config = msg.content.config_records.get("config")
        model = _open(settings, context, config)
        model.spec.load_into(model.state, from_record(msg.content["arrays"]))
        _check_same_model(model, context, config)
        x, y, _, _ = _data(settings, context)
        server_round = int(config.get("server-round", 0)) if config else 0
        mu = _proximal_mu(context, config)
        seed = setting("seed", context, config, settings.seed)
        device = int(context.node_config.get("partition-id", context.node_id % 2**32))   # stable across runs
        rng = np.random.default_rng([seed, device, server_round])
        loss = model.fit(x, y, epochs=_device_setting("local-epochs", context, config, settings.local_epochs),
                         batch_size=_device_setting("batch-size", context, config, settings.batch_size),
                         learning_rate=setting("learning-rate", context, config, settings.learning_rate), rng=rng,
                         proximal_mu=mu)
        metrics = MetricRecord({"num-examples": len(x), "train-loss": loss,
                                "skipped-steps": model.optimizer.skipped_steps})
        return Message(RecordDict({"arrays": to_record(model.spec.values(model.state)), "metrics": metrics}),
                       reply_to=msg)

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        config = msg.content.config_records.get("config")
        model = _open(settings, context, config, train=False)
        model.spec.load_into(model.state, from_record(msg.content["arrays"]))
        _check_same_model(model, context, config)
        _, _, x_val, y_val = _data(settings, context)
        result = model.evaluate(x_val, y_val, batch_size=max(256, setting("batch-size", context, config,
                                                                          settings.batch_size)))
        metrics = {"num-examples": result.num_examples, "eval-loss": result.loss}
        if result.accuracy is not None:
            metrics["eval-accuracy"] = result.accuracy
        return Message(RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)

    return app


def _device_setting(key: str, context: Context, config, default: int) -> int:
    """``local-epochs`` and ``batch-size`` are device limits (memory, time): the node config, when it sets
    them, wins over the server's message; the value must be a positive integer."""
    source = {key: context.node_config[key]} if key in context.node_config else config
    value = setting(key, context, source, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"node {context.node_id}: setting {key!r} must be a positive integer, got {value!r}")
    return value


def _check_same_model(model: LocalModel, context: Context, config) -> None:
    """Refuse to train when the server's artifacts are not this device's, even with matching parameters."""
    theirs = config.get("model-fingerprint") if config else None
    if theirs is None:
        return
    differ = compare_fingerprints(model.fingerprint, theirs)
    if differ:
        raise UpdateRejected(f"node {context.node_id}: the artifacts in {os.path.dirname(model.paths['eval'])!r} "
                             f"are not those of the server: {differ} (fingerprint {model.fingerprint!r}, "
                             f"server {theirs!r}); give every device a copy of the server's artifacts")


def _proximal_mu(context: Context, config) -> float:
    """FedProx's proximal weight: ``proximal-mu`` (Flower's FedProx sends it every round); 0 trains as FedAvg."""
    value = setting("proximal-mu", context, config, None)
    if value is None:
        return 0.0
    try:
        return check_mu(value)
    except ValueError as exc:
        raise ValueError(f"node {context.node_id}: {exc}") from None


def _open(settings: ClientSettings, context: Context, config, train: bool = True) -> LocalModel:
    artifacts_dir = setting("artifacts-dir", context, config, settings.artifacts_dir)
    return LocalModel(artifacts_dir, threads=setting("threads", context, config, settings.threads), train=train)


def _data(settings: ClientSettings, context: Context):
    x, y, x_val, y_val = (settings.data or default_data)(context)
    if len(x) == 0:
        raise ValueError(f"node {context.node_id} has no training examples")
    logger.debug("node %s: %d training and %d validation examples", context.node_id, len(x), len(x_val))
    return x, y, x_val, y_val


def default_data(context: Context) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The device's data from its node config:

    - ``data-path``: an ``.npz`` with ``x`` and ``y`` (and optionally ``x_val`` and ``y_val``; without them the
      device evaluates on its training data);
    - ``partition-id`` and ``num-partitions``: the digits demo's non-IID partition (:class:`DigitsPartition`
      with ``alpha`` and ``seed`` from the run config).
    """
    path = setting("data-path", context, None, None)
    if path:
        return _load_npz(os.fspath(path))
    if "partition-id" in context.node_config and "num-partitions" in context.node_config:
        return DigitsPartition(setting("alpha", context, None, 0.5), setting("seed", context, None, 0))(context)
    raise ValueError(f"node {context.node_id} has no data: start the SuperNode with --node-config "
                     "'data-path=\"/path/to/data.npz\"' (arrays x, y and optionally x_val, y_val), or "
                     "'partition-id=0 num-partitions=3' for the digits demo, or pass ClientSettings(data=...)")


@dataclass(frozen=True)
class DigitsPartition:
    """Data function of the digits demo: the node's Dirichlet(``alpha``) partition, by its ``partition-id``."""

    alpha: float = 0.5
    seed: int = 0

    def __call__(self, context: Context) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        try:
            pid, n = int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
        except KeyError:
            raise ValueError(f"node {context.node_id} has no 'partition-id' and 'num-partitions' in its node "
                             f"config ({dict(context.node_config)}); start it with --node-config "
                             "'partition-id=0 num-partitions=3'") from None
        return _digits_partition(pid, n, float(self.alpha), int(self.seed))


def _load_npz(path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The device's data file through onnxtrain.data: ``x``, ``y`` and, if present, ``x_val``, ``y_val`` (the
    training arrays validate the model otherwise)."""
    train = read_npz(path).validate(path)
    try:
        val = read_npz(path, "x_val", "y_val").validate(f"{path} (validation arrays)")
    except DatasetError as exc:
        if "has no array" not in str(exc):
            raise
        val = train
    return train.x, train.y, val.x, val.y


@functools.lru_cache(maxsize=16)
def _digits_partition(partition_id: int, num_partitions: int, alpha: float, seed: int):
    return example.load_partition(partition_id, num_partitions, alpha=alpha, seed=seed)
