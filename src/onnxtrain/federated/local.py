"""A device's side of a round, without Flower: open the artifacts, train E epochs, evaluate.

The server uses the same code to write and evaluate the global model.
"""

from __future__ import annotations

import functools
import hashlib
import os
from dataclasses import dataclass

import numpy as np

from onnxtrain.api import CheckpointState, Module, Optimizer
from onnxtrain.conventions import ARTIFACT_FILES
from onnxtrain.federated.proximal import ProximalOptimizer, check_mu
from onnxtrain.federated.spec import ParamSpec
from onnxtrain.runtime.loop import batches, evaluate, train_epoch

__all__ = ["ARTIFACT_FILES", "artifact_paths", "LocalModel", "Evaluation", "compare_fingerprints"]


def artifact_paths(artifacts_dir: str | os.PathLike | None, need_optimizer: bool = True) -> dict[str, str]:
    """The paths of the artifacts written by generate_artifacts into ``artifacts_dir``; missing ones are an error."""
    if not artifacts_dir:
        raise ValueError("no artifacts directory: set 'artifacts-dir' in the run config or node config "
                         "(or pass artifacts_dir=... to the settings)")
    paths = {kind: os.path.join(os.fspath(artifacts_dir), name) for kind, name in ARTIFACT_FILES.items()}
    missing = [p for kind, p in paths.items() if not os.path.exists(p) and (need_optimizer or kind != "optimizer")]
    if missing:
        raise FileNotFoundError(f"artifacts missing in {os.fspath(artifacts_dir)!r}: {missing}; write them with "
                                "onnxtrain.artifacts.generate_artifacts(..., artifact_directory=...)")
    return paths


@dataclass
class Evaluation:
    loss: float
    accuracy: float | None   # None when the artifacts return no predictions after the loss
    num_examples: int


class LocalModel:
    """The artifacts of one device (or of the server) opened on a fresh copy of the checkpoint.

    Args:
        artifacts_dir: the directory holding the four artifacts.
        threads: onnxruntime intra-op threads (1 keeps several simulated clients from fighting over cores;
            0 is onnxruntime's default, one per core).
        train: open the training and optimizer graphs (the server only evaluates and exports).
    """

    def __init__(self, artifacts_dir: str | os.PathLike, threads: int = 1, train: bool = True):
        import onnxruntime as ort

        self.paths = artifact_paths(artifacts_dir, need_optimizer=train)
        self.state = CheckpointState.load_checkpoint(self.paths["checkpoint"])
        self.spec = ParamSpec.from_state(self.state)
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        self.module = Module(self.paths["training"], self.state, self.paths["eval"], session_options=options)
        self.optimizer = Optimizer(self.paths["optimizer"], self.module) if train else None

    def fit(self, x: np.ndarray, y: np.ndarray, epochs: int, batch_size: int, learning_rate: float,
            rng: np.random.Generator, proximal_mu: float = 0.0) -> float:
        """Train ``epochs`` passes over shuffled mini-batches; return the mean training loss of the last epoch.

        With ``proximal_mu > 0`` (FedProx) every step also minimizes ``proximal_mu/2 * ||w - w_global||^2``, with
        ``w_global`` the trainable parameters as they are when ``fit`` is called (the round's global model);
        the returned loss is the data loss alone.
        """
        if self.optimizer is None:
            raise RuntimeError("this LocalModel was opened with train=False")
        if len(x) == 0:
            raise ValueError("no training examples on this device")
        optimizer = self.optimizer
        if check_mu(proximal_mu) > 0:
            optimizer = ProximalOptimizer(self.module, self.optimizer, proximal_mu)
            # The fused training call would compute an update without the proximal term, only for the step to
            # throw it away and run the optimizer graph again: run the two graphs separately (same results).
            self.module.training_run.fuse = False
        self.optimizer.set_learning_rate(learning_rate)
        self.module.train()
        seed, loss = int(rng.integers(2**31)), float("nan")
        for epoch in range(epochs):
            loss = train_epoch(self.module, optimizer,
                               batches(x, y, batch_size, shuffle=True, seed=seed, epoch=epoch)).loss
        return loss

    def evaluate(self, x: np.ndarray, y: np.ndarray, batch_size: int = 256) -> Evaluation:
        """Mean loss and, if the eval graph returns predictions after the loss, accuracy (argmax on axis 1)."""
        if len(x) == 0:
            raise ValueError("no evaluation examples")
        self.module.eval()
        has_predictions = len(self.module.output_names()) > 1
        result = evaluate(self.module, batches(x, y, batch_size), metrics=["accuracy"] if has_predictions else [])
        return Evaluation(result.loss, result.metrics.get("accuracy"), result.num_examples)

    @functools.cached_property
    def fingerprint(self) -> str:
        """``graphs:<hash> frozen:<hash>``: the training and eval graphs' bytes, and the names, shapes and
        values of the frozen parameters, which never travel, so the server and the devices compare these."""
        graphs = hashlib.sha256()
        for kind in ("training", "eval"):
            graphs.update(_file_digest(self.paths[kind]).encode())
        frozen = hashlib.sha256()
        for name, param in self.state.parameters.items():
            if not param.requires_grad:
                data = np.ascontiguousarray(param.data)
                frozen.update(f"{name}:{data.dtype}:{data.shape}".encode())
                frozen.update(data.tobytes())
        return f"graphs:{graphs.hexdigest()[:16]} frozen:{frozen.hexdigest()[:16]}"

    def save(self, directory: str | os.PathLike, model_name: str = "model.onnx") -> dict[str, str]:
        """Write ``checkpoint`` and the inference model ``model_name`` into ``directory``, each atomically."""
        os.makedirs(directory, exist_ok=True)
        paths = {"checkpoint": os.path.join(directory, ARTIFACT_FILES["checkpoint"]),
                 "model": os.path.join(directory, model_name)}
        CheckpointState.save_checkpoint(self.state, paths["checkpoint"])
        self.module.export_model_for_inferencing(paths["model"])
        return paths


def _file_digest(path: str) -> str:
    stat = os.stat(path)
    return _cached_digest(os.path.abspath(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=32)
def _cached_digest(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def compare_fingerprints(mine: str, theirs: str) -> str | None:
    """What differs between two :attr:`LocalModel.fingerprint` values, or None if they are equal."""
    parts = dict(p.split(":", 1) for p in mine.split())
    other = dict(p.split(":", 1) for p in str(theirs).split() if ":" in p)
    what = {"graphs": "the training or eval graph is different", "frozen": "the frozen parameters are different"}
    differ = [what[k] for k in parts if other.get(k) != parts[k]]
    return " and ".join(differ) if differ else None
