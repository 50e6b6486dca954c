"""The demo federation: an MLP on scikit-learn's digits (bundled, no download), split non-IID across clients.

Everything here is plain numpy and onnx (no Flower), so that the tests, the ``simulate`` command and a
device that loads its own partition all derive the same model and the same split from the same seed.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["DIGITS_FEATURES", "DIGITS_CLASSES", "mlp_model", "build_artifacts", "load_digits", "dirichlet_split",
           "load_partition", "test_set"]

DIGITS_FEATURES, DIGITS_CLASSES = 64, 10
_TEST_FRACTION, _VAL_FRACTION = 0.2, 0.2


def mlp_model(sizes: tuple[int, ...] = (DIGITS_FEATURES, 32, DIGITS_CLASSES), seed: int = 0) -> onnx.ModelProto:
    """An MLP ``input -> [MatMul, Add, Relu] x (L-1) -> MatMul, Add -> output`` with He-initialised weights.

    Parameters are named ``fc{i}.weight`` ([in, out]) and ``fc{i}.bias``; the input is ``input``
    ([batch, sizes[0]], float32) and the logits are ``output`` ([batch, sizes[-1]]).
    """
    rng = np.random.default_rng(seed)
    nodes, inits, x = [], [], "input"
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:]), start=1):
        w = (rng.standard_normal((n_in, n_out)) * np.sqrt(2.0 / n_in)).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"fc{i}.weight"),
                  numpy_helper.from_array(np.zeros(n_out, np.float32), f"fc{i}.bias")]
        last = i == len(sizes) - 1
        nodes += [helper.make_node("MatMul", [x, f"fc{i}.weight"], [f"fc{i}.mm"]),
                  helper.make_node("Add", [f"fc{i}.mm", f"fc{i}.bias"], ["output" if last else f"fc{i}.pre"])]
        if not last:
            nodes.append(helper.make_node("Relu", [f"fc{i}.pre"], [f"fc{i}.out"]))
            x = f"fc{i}.out"
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", sizes[0]])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", sizes[-1]])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="onnxtrain")
    onnx.checker.check_model(model, full_check=True)
    return model


def build_artifacts(artifact_directory: str | os.PathLike, *, hidden: int = 32, frozen: tuple[str, ...] = (),
                    seed: int = 0, momentum: float = 0.9) -> dict[str, str]:
    """Write the demo's training artifacts (SGD with momentum, cross-entropy) to ``artifact_directory``.

    Args:
        frozen: parameters that stay on the device and never travel, e.g. ``("fc1.weight", "fc1.bias")``
            for a frozen first layer (a "backbone").
    """
    from onnxtrain.artifacts import LossType, generate_artifacts
    from onnxtrain.blocks import SGD

    model = mlp_model((DIGITS_FEATURES, hidden, DIGITS_CLASSES), seed)
    names = [i.name for i in model.graph.initializer]
    unknown = sorted(set(frozen) - set(names))
    if unknown:
        raise ValueError(f"frozen parameters {unknown} are not in the demo model (parameters: {names})")
    return generate_artifacts(model, requires_grad=[n for n in names if n not in frozen], frozen_params=list(frozen),
                              loss=LossType.CrossEntropyLoss, optimizer=SGD(momentum=momentum),
                              artifact_directory=artifact_directory, additional_output_names=["output"])


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """All 1797 digits: ``x`` float32 [n, 64] scaled to [0, 1], ``y`` int64 [n]."""
    from sklearn.datasets import load_digits as sk_load_digits

    data = sk_load_digits()
    return (data.data / 16.0).astype(np.float32), data.target.astype(np.int64)


def _train_test_indices(y: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A stratified split: ``_TEST_FRACTION`` of every class goes to the server's test set."""
    rng = np.random.default_rng(seed)
    train, test = [], []
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        n_test = int(round(len(idx) * _TEST_FRACTION))
        test.append(idx[:n_test])
        train.append(idx[n_test:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


def dirichlet_split(y: np.ndarray, num_partitions: int, alpha: float = 0.5, seed: int = 0,
                    min_size: int = 10) -> list[np.ndarray]:
    """Split indices of ``y`` into label-skewed partitions: each class is shared out by Dirichlet(alpha) weights.

    Small ``alpha`` means each client sees few classes (strongly non-IID); large ``alpha`` tends to IID.
    Draws again (up to 100 times) until every partition has at least ``min_size`` examples.
    """
    if num_partitions < 1:
        raise ValueError(f"num_partitions must be at least 1, got {num_partitions}")
    if alpha <= 0:
        raise ValueError(f"alpha must be positive, got {alpha}")
    if num_partitions * min_size > len(y):
        raise ValueError(f"cannot give {num_partitions} partitions at least {min_size} examples each from "
                         f"{len(y)} examples; use fewer clients")
    rng = np.random.default_rng(seed)
    for _ in range(100):
        parts: list[list[int]] = [[] for _ in range(num_partitions)]
        for c in np.unique(y):
            idx = rng.permutation(np.flatnonzero(y == c))
            cuts = (np.cumsum(rng.dirichlet(np.full(num_partitions, alpha))) * len(idx)).astype(int)[:-1]
            for part, chunk in zip(parts, np.split(idx, cuts)):
                part.extend(chunk.tolist())
        if min(len(p) for p in parts) >= min_size:
            return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]
    raise ValueError(f"no Dirichlet(alpha={alpha}) split gave every one of {num_partitions} partitions "
                     f"{min_size} examples; raise alpha or use fewer clients")


def load_partition(partition_id: int, num_partitions: int, alpha: float = 0.5,
                   seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Client ``partition_id``'s digits: ``(x_train, y_train, x_val, y_val)``, with 20% kept for local evaluation.

    The server's test set (:func:`test_set`) is never part of any partition.
    """
    if not 0 <= partition_id < num_partitions:
        raise ValueError(f"partition-id must be in [0, {num_partitions}), got {partition_id}")
    x, y = load_digits()
    train, _ = _train_test_indices(y, seed)
    part = train[dirichlet_split(y[train], num_partitions, alpha, seed)[partition_id]]
    part = np.random.default_rng([seed, partition_id]).permutation(part)
    n_val = max(1, int(round(len(part) * _VAL_FRACTION)))
    return x[part[n_val:]], y[part[n_val:]], x[part[:n_val]], y[part[:n_val]]


def test_set(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The held-out 20% (stratified) on which the server measures the global model's accuracy."""
    x, y = load_digits()
    _, test = _train_test_indices(y, seed)
    return x[test], y[test]


test_set.__test__ = False  # not a pytest test
