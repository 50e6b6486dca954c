"""``simulate``: N clients on a non-IID split of the digits, on Flower's simulation engine (Ray), in-process."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import math
import os
import sys
from collections.abc import Callable, Sequence

from onnxtrain.errors import OnnxTrainError
from onnxtrain.federated import example
from onnxtrain.federated.client import ClientSettings, DigitsPartition, make_client_app
from onnxtrain.federated.server import ServerSettings, make_server_app, validating

__all__ = ["simulate", "format_table", "plot_history"]

_COLUMNS = [("round", "round", "{:d}"), ("accepted", "accepted", "{:d}"), ("rejected", "rejected", "{:d}"),
            ("failed", "failed", "{:d}"),
            ("train-loss", "train loss", "{:.4f}"), ("client-accuracy", "client acc", "{:.4f}"),
            ("loss", "global loss", "{:.4f}"), ("accuracy", "global acc", "{:.4f}"), ("seconds", "time", "{:.1f}s")]


def simulate(clients: int = 3, rounds: int = 3, *, output_dir: str | os.PathLike = "federated-run",
             artifacts_dir: str | os.PathLike | None = None, local_epochs: int = 2, batch_size: int = 32,
             learning_rate: float = 0.1, alpha: float = 0.5, seed: int = 0, hidden: int = 32,
             frozen: Sequence[str] = (), client_mods: Sequence | None = None, verbose: bool = False,
             plot: str | os.PathLike | None = None, out: Callable[[str], None] | None = None,
             strategy: str | type = "FedAvg", strategy_args: dict | None = None) -> list[dict]:
    """Run FedAvg (or ``strategy``) with ``clients`` simulated devices for ``rounds`` rounds; return the
    per-round history.

    Args:
        output_dir: receives ``artifacts/`` (unless ``artifacts_dir`` is given), ``global/`` (the global
            ``checkpoint``, ``model.onnx`` and ``history.jsonl``, rewritten after every round) and the plot.
        artifacts_dir: artifacts of a model taking digits ([batch, 64] float32, labels int64 in 0..9);
            default: the demo MLP 64-``hidden``-10, with ``frozen`` parameters kept on the devices.
        alpha: Dirichlet concentration of the label split (smaller is more skewed).
        client_mods: Flower mods wrapped around every client (e.g. to inject faults in tests).
        plot: where to save the accuracy plot (needs matplotlib); default ``output_dir/accuracy.png``
            when matplotlib is installed.
        out: where progress lines and the table go (default: print).
        strategy, strategy_args: a Flower strategy derived from FedAvg (class or name in
            ``flwr.serverapp.strategy``, e.g. ``"FedMedian"``) and its extra keyword arguments.

    Raises:
        RuntimeError: no round accepted a single client update (every client failed or was rejected).
    """
    if importlib.util.find_spec("ray") is None:   # flwr would sys.exit() without it
        raise OnnxTrainError("Flower's simulation engine needs Ray: pip install 'flwr[simulation]'")
    from flwr.simulation import run_simulation

    out = out or (lambda line: print(line, flush=True))
    _check_arguments(clients=clients, rounds=rounds, local_epochs=local_epochs, batch_size=batch_size,
                     learning_rate=learning_rate, alpha=alpha, hidden=hidden)
    strategy_name = validating(strategy).__name__.removeprefix("Validating")   # an unknown name fails here
    example.load_partition(0, clients, alpha=alpha, seed=seed)   # too many clients for the digits fails here
    output_dir = os.fspath(output_dir)
    if artifacts_dir is None:
        artifacts_dir = os.path.join(output_dir, "artifacts")
        example.build_artifacts(artifacts_dir, hidden=hidden, frozen=tuple(frozen), seed=seed)
    global_dir = os.path.join(output_dir, "global")

    def progress(record: dict) -> None:
        line = format_table([record], header=False)
        if record["round"] == 0:
            line = format_table([], header=True) + "\n" + line
        out(line)

    server = make_server_app(ServerSettings(
        artifacts_dir=os.fspath(artifacts_dir), output_dir=global_dir, num_rounds=rounds, min_nodes=clients,
        local_epochs=local_epochs, batch_size=batch_size, learning_rate=learning_rate,
        test_data=lambda: example.test_set(seed), on_round=progress, strategy=strategy,
        strategy_args=strategy_args))
    client = make_client_app(ClientSettings(artifacts_dir=os.fspath(artifacts_dir), seed=seed,
                                            data=DigitsPartition(alpha, seed)), mods=client_mods)
    out(f"{strategy_name}: {clients} clients (digits, Dirichlet alpha={alpha}), {rounds} rounds, {local_epochs} local "
        f"epoch(s); global model in {global_dir}")
    backend_config = {"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                      "init_args": {"logging_level": "WARNING" if verbose else "ERROR", "log_to_driver": verbose}}
    with _quiet_flower(verbose):
        run_simulation(server_app=server, client_app=client, num_supernodes=clients, backend_config=backend_config)
    with open(os.path.join(global_dir, "history.jsonl")) as f:
        history = [json.loads(line) for line in f if line.strip()]
    _check_progress(history, rounds)
    final = history[-1]
    if final.get("accuracy") is not None:
        out(f"global accuracy {history[0]['accuracy']:.4f} -> {final['accuracy']:.4f} after {rounds} rounds")
    plot_path = plot_history(history, plot or os.path.join(output_dir, "accuracy.png"), required=plot is not None)
    if plot_path:
        out(f"plot: {plot_path}")
    return history


def _check_progress(history: list[dict], rounds: int) -> None:
    """A run that ended early, or in which no round accepted an update, is an error, not a result."""
    if len(history) != rounds + 1:
        raise RuntimeError(f"the simulation ended after {len(history) - 1} of {rounds} rounds; rerun with "
                           "--verbose to see Flower's log")
    if not any(r.get("accepted") for r in history[1:]):
        reasons = [f["reason"] for r in history for f in r.get("failures", []) + r.get("rejections", [])]
        raise RuntimeError(f"no client update was accepted in {rounds} round(s), the global model is the initial "
                           f"one; first reason: {reasons[0] if reasons else 'unknown (rerun with --verbose)'}")


def _check_arguments(**values) -> None:
    """Refuse what would make every client fail in every round, before Ray starts."""
    for name in ("clients", "rounds", "local_epochs", "batch_size", "hidden"):
        if not isinstance(values[name], int) or values[name] < 1:
            raise ValueError(f"{name.replace('_', '-')} must be a positive integer, got {values[name]!r}")
    for name in ("learning_rate", "alpha"):
        if not (values[name] > 0 and math.isfinite(values[name])):
            raise ValueError(f"{name.replace('_', '-')} must be positive and finite, got {values[name]!r}")


def format_table(history: list[dict], header: bool = True) -> str:
    """Per-round metrics as a fixed-width table; missing values show as '-'."""
    widths = [max(len(title), 8) for _, title, _ in _COLUMNS]
    lines = ["  ".join(title.rjust(w) for (_, title, _), w in zip(_COLUMNS, widths))] if header else []
    for record in history:
        cells = []
        for (key, _, fmt), w in zip(_COLUMNS, widths):
            value = record.get(key)
            cells.append(("-" if value is None else fmt.format(value)).rjust(w))
        lines.append("  ".join(cells))
    return "\n".join(lines)


def plot_history(history: list[dict], path: str | os.PathLike, required: bool = False) -> str | None:
    """Save global (and client) accuracy per round to ``path``; None if matplotlib is missing and not required."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        if required:
            raise ImportError("plotting needs matplotlib: pip install 'onnxtrain[plot]'") from None
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label in (("accuracy", "global model (server test set)"), ("client-accuracy", "clients (local val)")):
        points = [(r["round"], r[key]) for r in history if r.get(key) is not None]
        if points:
            ax.plot(*zip(*points), marker="o", label=label)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("round")
    ax.set_ylabel("accuracy")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.fspath(path), dpi=100)
    plt.close(fig)
    return os.fspath(path)


class _DropDeprecation(logging.Filter):
    """flwr 1.42 marks run_simulation deprecated in favour of `flwr run`, which needs a managed SuperLink
    daemon; the in-process engine is what an embedded simulation wants, so its notice is not shown."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "run_simulation` function is deprecated" not in record.getMessage()


@contextlib.contextmanager
def _quiet_flower(verbose: bool):
    flwr_logger = logging.getLogger("flwr")
    level, drop = flwr_logger.level, _DropDeprecation()
    flwr_logger.addFilter(drop)
    if not verbose:
        flwr_logger.setLevel(logging.WARNING)   # rejections (warnings) and errors still show
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")   # silences a Ray FutureWarning; CPU only
    sys.stdout.flush()
    try:
        yield
    finally:
        flwr_logger.setLevel(level)
        flwr_logger.removeFilter(drop)
