"""The Flower ServerApp: FedAvg from the checkpoint's parameters, with every update checked before it counts.

After each round (and once before the first) the global model is written to the output directory:
``checkpoint`` (loads with CheckpointState.load_checkpoint), ``model.onnx`` (the inference model) and a line
of ``history.jsonl`` with the round's metrics.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from onnxtrain.federated._flower import (
    ArrayRecord,
    ConfigRecord,
    Context,
    FedAvg,
    FedProx,
    Grid,
    Message,
    MetricRecord,
    RecordDict,
    ServerApp,
    from_record,
    logger,
    setting,
    to_record,
)
from onnxtrain.federated.local import LocalModel, artifact_paths
from onnxtrain.federated.proximal import check_mu
from onnxtrain.federated.spec import ParamSpec, UpdateRejected

__all__ = ["ServerSettings", "ValidatingFedAvg", "validating", "GlobalModel", "make_server_app"]

TestData = Callable[[], "tuple[np.ndarray, np.ndarray]"]


@dataclass
class ServerSettings:
    """Defaults of the ServerApp; each can be set in the run config under the key in the comment.

    ``local-epochs``, ``batch-size`` and ``learning-rate`` are sent to the clients with every round (a client
    uses its own default for any that is unset here).
    """

    artifacts_dir: str | None = None      # "artifacts-dir": the same artifacts the devices hold
    output_dir: str | None = None         # "output-dir": where the global model is written
    num_rounds: int = 3                   # "num-server-rounds"
    min_nodes: int = 2                    # "min-nodes": wait for this many; train and evaluate on at least as many
    fraction_train: float = 1.0           # "fraction-train"
    fraction_evaluate: float = 1.0        # "fraction-evaluate"
    local_epochs: int | None = None       # "local-epochs"
    batch_size: int | None = None         # "batch-size"
    learning_rate: float | None = None    # "learning-rate"
    test_data: TestData | None = None     # default: run config "test-data" (.npz with x, y), else none
    on_round: Callable[[dict], None] | None = None   # called with each round's history record
    timeout: float = 3600.0               # "round-timeout": seconds to wait for the replies of a round
    strategy: str | type = "FedAvg"       # "strategy": a FedAvg-derived strategy of flwr.serverapp.strategy
    strategy_args: dict | None = None     # extra keyword arguments of the strategy, e.g. {"proximal_mu": 0.1}
    initial_checkpoint: str | None = None  # "initial-checkpoint": resume from this global checkpoint


class _Validating:
    """Checks each training reply against the checkpoint's :class:`ParamSpec` and drops bad ones before the
    strategy (the next class in the MRO, a Flower FedAvg or one of its subclasses) aggregates the others.

    A reply is rejected, with a warning naming the node and the reason, when its parameters do not match the
    spec in names, dtypes or shapes, hold NaN or inf, cannot be decoded, or when its ``num-examples`` is not a
    positive finite number. A reply that carries an error (the ClientApp raised) is logged as a warning with
    Flower's reason. If no reply is left, or the aggregate is not finite, the global model stays as it was;
    an aggregate of another float precision (FedAdam's float64) is cast back to the checkpoint's dtypes.
    ``rounds[r]`` records what happened.
    """

    def __init__(self, spec: ParamSpec, **kwargs):
        super().__init__(**kwargs)
        self.spec = spec
        self.rounds: dict[int, dict] = {}

    def reject_reason(self, content: RecordDict) -> str | None:
        """Why a training reply cannot be averaged, or None if it can."""
        if list(content.array_records) != [self.arrayrecord_key]:
            return f"expected one ArrayRecord named {self.arrayrecord_key!r}, got {list(content.array_records)}"
        if len(content.metric_records) != 1:
            return f"expected one MetricRecord, got {list(content.metric_records)}"
        metrics = next(iter(content.metric_records.values()))
        weight = metrics.get(self.weighted_by_key)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight <= 0:
            return f"metric {self.weighted_by_key!r} must be a positive number, got {weight!r}"
        try:
            self.spec.check(from_record(content[self.arrayrecord_key]))
        except UpdateRejected as exc:
            return str(exc)
        return None

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None,
                                                                                   MetricRecord | None]:
        replies = list(replies)
        kept, rejected, failures = [], [], []
        for msg in replies:
            if msg.has_error():
                failures.append({"node": msg.metadata.src_node_id, "reason": _error_reason(msg)})
                logger.warning("round %d: node %s failed: %s", server_round, msg.metadata.src_node_id,
                               failures[-1]["reason"])
            reason = None if msg.has_error() else self.reject_reason(msg.content)
            if reason is None:
                kept.append(msg)
                continue
            rejected.append({"node": msg.metadata.src_node_id, "reason": reason})
            logger.warning("round %d: rejected the update of node %s: %s", server_round, msg.metadata.src_node_id,
                           reason)
        _common_metrics(kept)
        arrays, metrics = super().aggregate_train(server_round, kept)
        if arrays is not None:
            try:   # FedAvg's arithmetic may promote the dtype; the global model keeps the checkpoint's
                dtypes = dict(zip(self.spec.names, self.spec.dtypes))
                averaged = {n: v.astype(dtypes[n], copy=False) if n in dtypes else v
                            for n, v in from_record(arrays).items()}
                arrays = to_record(self.spec.check(averaged))
            except UpdateRejected as exc:
                logger.warning("round %d: the average of the accepted updates is unusable (%s); the global model "
                               "stays as it was", server_round, exc)
                arrays = None
        accepted = sum(1 for m in kept if not m.has_error())
        self.rounds[server_round] = {"accepted": accepted, "rejected": rejected, "failed": len(failures),
                                     "failures": failures, "train": dict(metrics) if metrics else {}}
        if arrays is None and replies:
            logger.warning("round %d: no usable update (%d rejected, %d failed); the global model is unchanged",
                           server_round, len(rejected), self.rounds[server_round]["failed"])
        return arrays, metrics

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        replies = list(replies)
        for msg in replies:
            if msg.has_error():
                logger.warning("round %d: node %s failed to evaluate: %s", server_round, msg.metadata.src_node_id,
                               _error_reason(msg))
        kept = [m for m in replies if m.has_error() or self.weighted_by_key in _metrics(m.content)]
        _common_metrics(kept)
        metrics = super().aggregate_evaluate(server_round, kept)
        self.rounds.setdefault(server_round, {})["evaluate"] = dict(metrics) if metrics else {}
        return metrics


class ValidatingFedAvg(_Validating, FedAvg):
    """Flower's FedAvg (weighted by ``num-examples``) with every training reply checked first; see
    :func:`validating` for the same checks around another strategy."""


def validating(strategy: str | type) -> type:
    """A subclass of the Flower strategy ``strategy`` (a class, or its name in ``flwr.serverapp.strategy``,
    derived from FedAvg) that checks every training reply as :class:`ValidatingFedAvg` does; construct it
    with ``(spec, **strategy_kwargs)``."""
    import flwr.serverapp.strategy as strategies

    cls = getattr(strategies, strategy, None) if isinstance(strategy, str) else strategy
    if not (isinstance(cls, type) and issubclass(cls, FedAvg)):
        known = sorted(n for n in dir(strategies) if isinstance(getattr(strategies, n), type)
                       and issubclass(getattr(strategies, n), FedAvg))
        raise ValueError(f"strategy {strategy!r} is not a Flower strategy derived from FedAvg; "
                         f"known: {known}")
    if cls is FedAvg:
        return ValidatingFedAvg
    return type(f"Validating{cls.__name__}", (_Validating, cls), {"__doc__": _Validating.__doc__})


def _error_reason(msg: Message) -> str:
    """The ClientApp's exception message: the simulation engine wraps it in Ray's traceback, after the last
    "Message:"; the deployment runtime in ``<class '...'>:<'...'>``; a long one keeps its tail."""
    reason = str(msg.error.reason)
    marker = reason.rfind("occurred. Message:")
    if marker >= 0:
        reason = reason[marker + len("occurred. Message:"):].strip()
        reason = reason[:-2] if reason.endswith("'>") else reason
    else:   # the deployment runtime's "<class 'ValueError'>:<'the message'>"
        match = re.fullmatch(r"<class '[\w.]+'>:<'(.*)'>", reason.strip(), re.S)
        reason = match.group(1) if match else reason
    reason = " ".join(reason.split())
    return reason if len(reason) <= 500 else "..." + reason[-500:]


def _metrics(content: RecordDict) -> dict:
    return dict(next(iter(content.metric_records.values()), {}))


def _common_metrics(replies: list[Message]) -> None:
    """Keep only the metric keys every reply has, so that one client's extra metric cannot fail the round
    (FedAvg refuses replies whose MetricRecords differ in keys)."""
    ok = [m for m in replies if not m.has_error()]
    if not ok:
        return
    common = set.intersection(*(set(_metrics(m.content)) for m in ok))
    for m in ok:
        name, record = next(iter(m.content.metric_records.items()))
        if set(record) != common:
            m.content[name] = MetricRecord({k: v for k, v in record.items() if k in common})


class GlobalModel:
    """Writes the global model after each round and evaluates it on the server's test data, if any.

    Used as the strategy's ``evaluate_fn``: called with round 0 (the initial parameters) and after each round.
    """

    def __init__(self, artifacts_dir: str, output_dir: str, strategy: ValidatingFedAvg,
                 test_data: tuple[np.ndarray, np.ndarray] | None = None,
                 on_round: Callable[[dict], None] | None = None, initial_checkpoint: str | None = None):
        self.model = LocalModel(artifacts_dir, threads=0, train=False)
        if initial_checkpoint:
            self._resume(os.fspath(initial_checkpoint))
        self.output_dir, self.strategy, self.test_data, self.on_round = output_dir, strategy, test_data, on_round
        self.history: list[dict] = []
        self._start = time.monotonic()
        os.makedirs(output_dir, exist_ok=True)
        self.history_path = os.path.join(output_dir, "history.jsonl")
        open(self.history_path, "w").close()

    def _resume(self, path: str) -> None:
        """Start from the trainable parameters and buffers of a global checkpoint of an earlier run."""
        from onnxtrain.api import CheckpointState

        if not os.path.isfile(path):
            raise FileNotFoundError(f"initial-checkpoint {path!r} does not exist; give the 'checkpoint' file that "
                                    "an earlier run wrote into its output-dir")
        saved = CheckpointState.load_checkpoint(path)
        try:
            self.model.spec.load_into(self.model.state, self.model.spec.values(saved))
        except (KeyError, UpdateRejected) as exc:
            detail = f"it has no {exc}" if isinstance(exc, KeyError) else str(exc)
            raise UpdateRejected(f"initial-checkpoint {path!r} does not fit the artifacts' checkpoint: "
                                 f"{detail}") from None
        logger.info("resuming from the global model in %s", path)

    def initial_arrays(self) -> ArrayRecord:
        return to_record(self.model.spec.values(self.model.state))

    def __call__(self, server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        self.model.spec.load_into(self.model.state, from_record(arrays))
        paths = self.model.save(self.output_dir)
        info = self.strategy.rounds.get(server_round, {})
        record = {"round": server_round, "seconds": round(time.monotonic() - self._start, 2),
                  "accepted": info.get("accepted"), "rejected": len(info["rejected"]) if "rejected" in info else None,
                  "failed": info.get("failed"),
                  "train-loss": info.get("train", {}).get("train-loss"),
                  "client-accuracy": info.get("evaluate", {}).get("eval-accuracy"),
                  "client-loss": info.get("evaluate", {}).get("eval-loss")}
        metrics = {}
        if self.test_data is not None:
            result = self.model.evaluate(*self.test_data)
            metrics["loss"] = result.loss
            if result.accuracy is not None:
                metrics["accuracy"] = result.accuracy
        record.update(metrics)
        record["rejections"] = info.get("rejected", [])
        record["failures"] = info.get("failures", [])
        self.history.append(record)
        with open(self.history_path, "a") as f:
            f.write(json.dumps(record) + "\n")
        logger.info("round %d: global model written to %s (%s)", server_round, paths["checkpoint"],
                    ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()) or "no server test data")
        if self.on_round is not None:
            self.on_round(record)
        return MetricRecord(metrics) if metrics else None


def make_server_app(settings: ServerSettings | None = None) -> ServerApp:
    """A ServerApp running :class:`ValidatingFedAvg` from the checkpoint in ``artifacts-dir``."""
    settings = settings or ServerSettings()
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        run(grid, context, settings)

    return app


def _strategy_args(strategy_cls: type, strategy_args: dict | None, proximal_mu) -> dict:
    """``strategy_args``, plus FedProx's ``proximal_mu`` from the run config's ``proximal-mu`` (a deployment sets
    no strategy arguments otherwise; FedProx would send its default, 0, which the devices' run config cannot
    override)."""
    args = dict(strategy_args or {})
    if proximal_mu is not None and issubclass(strategy_cls, FedProx) and "proximal_mu" not in args:
        args["proximal_mu"] = check_mu(proximal_mu, "run config 'proximal-mu'")
    return args


def run(grid: Grid, context: Context, settings: ServerSettings):
    """The body of the ServerApp; returns Flower's Result."""
    def get(key, default):
        return setting(key, context, None, default)

    artifacts_dir = get("artifacts-dir", settings.artifacts_dir)
    output_dir = get("output-dir", settings.output_dir)
    if not output_dir:
        raise ValueError("no output directory for the global model: set 'output-dir' in the run config "
                         "(or ServerSettings(output_dir=...))")
    min_nodes = get("min-nodes", settings.min_nodes)
    spec = ParamSpec.from_checkpoint(artifact_paths(artifacts_dir, need_optimizer=False)["checkpoint"])
    strategy_cls = validating(get("strategy", settings.strategy) if isinstance(settings.strategy, str)
                              else settings.strategy)
    strategy = strategy_cls(spec, fraction_train=get("fraction-train", settings.fraction_train),
                            fraction_evaluate=get("fraction-evaluate", settings.fraction_evaluate),
                            min_train_nodes=min_nodes, min_evaluate_nodes=min_nodes, min_available_nodes=min_nodes,
                            **_strategy_args(strategy_cls, settings.strategy_args, get("proximal-mu", None)))
    test_data = settings.test_data() if settings.test_data else _npz_test_data(get("test-data", ""))
    writer = GlobalModel(os.fspath(artifacts_dir), os.fspath(output_dir), strategy, test_data, settings.on_round,
                         initial_checkpoint=get("initial-checkpoint", settings.initial_checkpoint) or None)
    fingerprint = writer.model.fingerprint   # the devices refuse to train other artifacts than these
    train_config = ConfigRecord({k: v for k, v in {
        "local-epochs": get("local-epochs", settings.local_epochs),
        "batch-size": get("batch-size", settings.batch_size),
        "learning-rate": get("learning-rate", settings.learning_rate),
        "model-fingerprint": fingerprint}.items() if v is not None})
    num_rounds = get("num-server-rounds", settings.num_rounds)
    logger.info("%s over %d trainable parameters (%d values) for %d rounds, global model in %s",
                strategy_cls.__name__.removeprefix("Validating"), len(spec), sum(int(np.prod(s)) for s in spec.shapes),
                num_rounds, output_dir)
    return strategy.start(grid=grid, initial_arrays=writer.initial_arrays(), num_rounds=num_rounds,
                          timeout=get("round-timeout", settings.timeout), train_config=train_config,
                          evaluate_config=ConfigRecord({"model-fingerprint": fingerprint}), evaluate_fn=writer)


def _npz_test_data(path: str) -> tuple[np.ndarray, np.ndarray] | None:
    """The server's test set from the run config's ``test-data`` .npz (arrays ``x`` and ``y``), if any."""
    from onnxtrain.data.convert import read_npz
    from onnxtrain.data.dataset import DatasetError

    if not path:
        return None
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"test-data {path!r} does not exist; give an .npz with arrays 'x' and 'y' "
                                "on the server machine (absolute path)")
    try:
        data = read_npz(path).validate(path)
    except DatasetError as exc:
        raise DatasetError(f"test-data: {exc}") from None
    return data.x, data.y
