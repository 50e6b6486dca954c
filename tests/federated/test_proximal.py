"""FedProx: the client's local objective gets the proximal term mu/2 * ||w - w_global||^2.

Checked against numpy by hand (the MLP's gradient, the proximal gradient mu * (w - w_global), the SGD and AdamW
updates), bit for bit against FedAvg at mu = 0, and on Flower's FedProx strategy over a non-IID split, where the
clients' weights end closer to the global ones than FedAvg's do.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import ConfigRecord, Context, RecordDict  # noqa: E402

from onnxtrain.api import CheckpointState  # noqa: E402
from onnxtrain.federated._flower import from_record, to_record  # noqa: E402
from onnxtrain.federated.client import ClientSettings, DigitsPartition, make_client_app  # noqa: E402
from onnxtrain.federated.example import test_set  # noqa: E402
from onnxtrain.federated.local import LocalModel  # noqa: E402
from onnxtrain.federated.proximal import ProximalOptimizer  # noqa: E402
from onnxtrain.federated.server import ServerSettings, run  # noqa: E402
from onnxtrain.federated.spec import ParamSpec  # noqa: E402

from .local_grid import LocalGrid  # noqa: E402
from .test_apps import _message  # noqa: E402

LR, WD, BETAS, EPS = 0.05, 0.01, (0.9, 0.999), 1e-8


@pytest.fixture(scope="module", params=["SGD", "AdamW"])
def artifacts(request, tmp_path_factory):
    """(optimizer name, artifacts of a 64-6-10 MLP with plain SGD or torch's AdamW with weight decay)."""
    from onnxtrain.artifacts import LossType, generate_artifacts
    from onnxtrain.blocks import SGD, AdamW
    from onnxtrain.federated.example import mlp_model

    directory = tmp_path_factory.mktemp(request.param)
    optimizer = SGD() if request.param == "SGD" else AdamW(betas=BETAS, eps=EPS, weight_decay=WD, mode="torch")
    generate_artifacts(mlp_model((64, 6, 10)), requires_grad=None, loss=LossType.CrossEntropyLoss,
                       optimizer=optimizer, artifact_directory=directory, additional_output_names=["output"])
    return request.param, directory


def _batch(n: int = 12, seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.random((n, 64), dtype=np.float32), rng.integers(0, 10, n).astype(np.int64)


# -- the reference, by hand in float64 ---------------------------------------------------------------------------
def _loss_gradient(p: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
    """d/dp of the mean cross-entropy of softmax(relu(x W1 + b1) W2 + b2)."""
    z1 = x @ p["fc1.weight"] + p["fc1.bias"]
    a = np.maximum(z1, 0)
    z2 = a @ p["fc2.weight"] + p["fc2.bias"]
    e = np.exp(z2 - z2.max(1, keepdims=True))
    dz2 = (e / e.sum(1, keepdims=True) - np.eye(10)[y]) / len(y)
    dz1 = (dz2 @ p["fc2.weight"].T) * (z1 > 0)
    return {"fc1.weight": x.T @ dz1, "fc1.bias": dz1.sum(0), "fc2.weight": a.T @ dz2, "fc2.bias": dz2.sum(0)}


def _reference(kind: str, p0: dict, w_global: dict, mu: float, x, y, steps: int) -> dict[str, np.ndarray]:
    """``steps`` full-batch steps on loss + mu/2 ||w - w_global||^2: SGD, or torch.optim.AdamW."""
    p = {n: v.astype(np.float64) for n, v in p0.items()}
    m = {n: np.zeros_like(v) for n, v in p.items()}
    v2 = {n: np.zeros_like(v) for n, v in p.items()}
    for t in range(1, steps + 1):
        loss_grad = _loss_gradient(p, x.astype(np.float64), y)
        for n in p:
            g = loss_grad[n] + mu * (p[n] - w_global[n])       # the proximal term's gradient
            if kind == "SGD":
                p[n] = p[n] - LR * g
                continue
            p[n] = p[n] * (1 - LR * WD)                           # decoupled weight decay
            m[n] = BETAS[0] * m[n] + (1 - BETAS[0]) * g
            v2[n] = BETAS[1] * v2[n] + (1 - BETAS[1]) * g * g
            m_hat, v_hat = m[n] / (1 - BETAS[0] ** t), v2[n] / (1 - BETAS[1] ** t)
            p[n] = p[n] - LR * m_hat / (np.sqrt(v_hat) + EPS)
    return p


def _assert_close(ours: dict, expected: dict, without_term: dict) -> None:
    for name, value in expected.items():
        np.testing.assert_allclose(ours[name], value, rtol=2e-4, atol=2e-6, err_msg=name)
    # without the proximal term the result is outside ten times that tolerance: the check above can tell
    assert not all(np.allclose(without_term[n], v, rtol=2e-3, atol=2e-5) for n, v in expected.items())


def _checkpoint(directory) -> dict[str, np.ndarray]:
    state = CheckpointState.load_checkpoint(directory / "checkpoint")
    return ParamSpec.from_state(state).values(state)


# -- (a) the steps, against the hand-computed ones ---------------------------------------------------------------
def test_proximal_steps_follow_the_hand_computed_gradient(artifacts):
    """Three steps from w0 with w_global elsewhere, so the term pulls from the first step on."""
    kind, directory = artifacts
    x, y = _batch()
    model = LocalModel(directory)
    model.optimizer.set_learning_rate(LR)
    p0 = model.spec.values(model.state)
    rng = np.random.default_rng(1)
    w_global = {n: (v + 0.3 * rng.standard_normal(v.shape)).astype(np.float32) for n, v in p0.items()}
    flat_global = np.concatenate([w_global[n].ravel() for n in model.spec.names])
    proximal = ProximalOptimizer(model.module, model.optimizer, mu=0.5, w_global=flat_global)
    for _ in range(3):
        model.module(x, y)
        proximal.step()
        model.module.lazy_reset_grad()
    _assert_close(model.spec.values(model.state), _reference(kind, p0, w_global, 0.5, x, y, 3),
                  _reference(kind, p0, w_global, 0.0, x, y, 3))


def _client_round(directory, config: dict, x, y, node_config: dict | None = None) -> dict[str, np.ndarray]:
    """One training message to the ClientApp, the global model being the artifacts' checkpoint."""
    app = make_client_app(ClientSettings(artifacts_dir=str(directory), data=lambda context: (x, y, x, y)))
    context = Context(run_id=1, node_id=5, node_config={"partition-id": 0, **(node_config or {})},
                      state=RecordDict(), run_config={})
    msg = _message(RecordDict({"arrays": to_record(_checkpoint(directory)),
                               "config": ConfigRecord({"server-round": 1, **config})}))
    return from_record(app(msg, context).content["arrays"])


def test_the_client_pulls_towards_the_parameters_it_received(artifacts):
    """Two local epochs of one full batch: the first step starts at w_global (no pull), the second does not."""
    kind, directory = artifacts
    x, y = _batch()
    config = {"learning-rate": LR, "local-epochs": 2, "batch-size": len(x), "proximal-mu": 2.0}
    w_global = _checkpoint(directory)
    _assert_close(_client_round(directory, config, x, y), _reference(kind, w_global, w_global, 2.0, x, y, 2),
                  _reference(kind, w_global, w_global, 0.0, x, y, 2))


# -- (b) mu = 0 is FedAvg ----------------------------------------------------------------------------------------
def test_mu_zero_trains_as_fedavg_bit_for_bit(artifacts):
    _, directory = artifacts
    x, y = _batch(40)
    config = {"learning-rate": LR, "local-epochs": 2, "batch-size": 8}
    fedavg = _client_round(directory, config, x, y)
    for mu in (0.0, 0):
        fedprox = _client_round(directory, {**config, "proximal-mu": mu}, x, y)
        for name, value in fedavg.items():
            np.testing.assert_array_equal(fedprox[name], value, err_msg=name)


@pytest.mark.parametrize("mu, message", [
    (-0.1, "node 5: proximal-mu must be finite and non-negative .*got -0.1"),
    (float("nan"), "node 5: proximal-mu must be finite and non-negative"),
    ("0.1", "node 5: proximal-mu must be a number .*got str '0.1'"),
])
def test_a_bad_proximal_mu_is_named(artifacts, mu, message):
    _, directory = artifacts
    x, y = _batch()
    with pytest.raises(ValueError, match=message):
        _client_round(directory, {"learning-rate": LR}, x, y, node_config={"proximal-mu": mu})


# -- (c) Flower's FedProx on non-IID data ------------------------------------------------------------------------
def _drift(mlp_artifacts, output_dir, strategy: str, strategy_args: dict | None = None) -> tuple[dict, list]:
    """``{(round, node): ||w_client - w_global||}`` over all trainable parameters, and the history."""
    client = make_client_app(ClientSettings(artifacts_dir=str(mlp_artifacts), data=DigitsPartition(alpha=0.1)))
    drift = {}

    def measuring(msg, context):
        reply = client(msg, context)
        if msg.metadata.message_type == "train":
            sent, got = from_record(msg.content["arrays"]), from_record(reply.content["arrays"])
            key = (int(msg.content["config"]["server-round"]), int(context.node_config["partition-id"]))
            drift[key] = float(np.sqrt(sum(np.sum((got[n] - w).astype(np.float64) ** 2) for n, w in sent.items())))
        return reply

    settings = ServerSettings(artifacts_dir=str(mlp_artifacts), output_dir=str(output_dir), num_rounds=2,
                              min_nodes=3, local_epochs=5, batch_size=32, learning_rate=0.05, strategy=strategy,
                              strategy_args=strategy_args, test_data=test_set)
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={})
    nodes = [{"partition-id": p, "num-partitions": 3} for p in range(3)]
    with LocalGrid(measuring, nodes) as grid:
        run(grid, context, settings)
    history = [json.loads(line) for line in (output_dir / "history.jsonl").read_text().splitlines()]
    return drift, history


def test_fedprox_keeps_the_clients_closer_to_the_global_model(mlp_artifacts, tmp_path):
    """3 clients on a Dirichlet(0.1) split of the digits, 2 rounds of 5 local epochs: every client, in every
    round, ends nearer the model it received under FedProx (mu = 0.1) than under FedAvg (drift about halved)."""
    fedavg, avg_history = _drift(mlp_artifacts, tmp_path / "fedavg", "FedAvg")
    fedprox, prox_history = _drift(mlp_artifacts, tmp_path / "fedprox", "FedProx", {"proximal_mu": 0.1})
    print(f"drift ||w_client - w_global|| by (round, partition): FedAvg {fedavg}, FedProx mu=0.1 {fedprox}; global "
          f"accuracy FedAvg {[r['accuracy'] for r in avg_history]}, FedProx {[r['accuracy'] for r in prox_history]}")
    assert [r["accepted"] for r in prox_history[1:]] == [3, 3]
    assert sorted(fedprox) == sorted(fedavg) == [(r, p) for r in (1, 2) for p in range(3)]
    for key, avg in fedavg.items():
        assert fedprox[key] < 0.75 * avg, (key, fedavg, fedprox)


def test_a_deployment_sets_mu_in_the_run_config(mlp_artifacts, tmp_path):
    """`flwr run` passes no strategy arguments: the ServerApp gives FedProx the run config's proximal-mu."""
    client = make_client_app(ClientSettings(artifacts_dir=str(mlp_artifacts), data=DigitsPartition()))
    sent_mu = []

    def recording(msg, context):
        if msg.metadata.message_type == "train":
            sent_mu.append(msg.content["config"]["proximal-mu"])
        return client(msg, context)

    nodes = [{"partition-id": p, "num-partitions": 2} for p in range(2)]
    for mu, strategy in ((0.3, "FedProx"), (-1.0, "FedProx")):
        context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                          run_config={"proximal-mu": mu, "strategy": strategy, "num-server-rounds": 1})
        settings = ServerSettings(artifacts_dir=str(mlp_artifacts), output_dir=str(tmp_path / strategy), min_nodes=2)
        with LocalGrid(recording, nodes) as grid:
            if mu < 0:
                with pytest.raises(ValueError, match=r"run config 'proximal-mu' must be finite and non-negative"):
                    run(grid, context, settings)
            else:
                run(grid, context, settings)
    assert sent_mu == [0.3, 0.3]


def test_only_the_trainable_parameters_are_pulled(frozen_artifacts):
    """With fc1 frozen, w_global is fc2 alone (get_contiguous_parameters(trainable_only=True) order)."""
    model = LocalModel(frozen_artifacts)
    proximal = ProximalOptimizer(model.module, model.optimizer, mu=0.1)
    assert proximal.w_global.size == sum(model.state.parameters[n].data.size for n in ("fc2.weight", "fc2.bias"))
    with pytest.raises(ValueError, match=r"w_global must be the 330 trainable parameters as one flat float32 array, "
                                         r"got float32\[2, 165\]"):
        ProximalOptimizer(model.module, model.optimizer, mu=0.1, w_global=proximal.w_global.reshape(2, 165))
    with pytest.raises(ValueError, match="proximal-mu must be a number .*got bool True"):
        ProximalOptimizer(model.module, model.optimizer, mu=True)
