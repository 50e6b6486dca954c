"""The ClientApp and ServerApp for Flower's deployment runtime (``flwr run`` on a SuperLink and SuperNodes).

Name them in the Flower App's ``pyproject.toml`` (:func:`app_pyproject` writes one)::

    [tool.flwr.app.components]
    serverapp = "onnxtrain.federated.app:server_app"
    clientapp = "onnxtrain.federated.app:client_app"

Both read their settings from Flower's config: the run config (``[tool.flwr.app.config]``, overridable with
``flwr run --run-config``) and, on each device, the node config (``flower-supernode --node-config``), which
wins for device-specific keys such as ``artifacts-dir`` and ``data-path``. See ``docs/federated.md``.
"""

from __future__ import annotations

from onnxtrain.federated.client import make_client_app
from onnxtrain.federated.server import make_server_app

__all__ = ["client_app", "server_app", "RUN_CONFIG", "app_pyproject"]

client_app = make_client_app()
server_app = make_server_app()

#: The run config keys the two apps read, with the demo's values.
RUN_CONFIG = {
    "artifacts-dir": "",               # absolute path, on the server and on every device (node config overrides)
    "output-dir": "",                  # absolute path on the server: checkpoint, model.onnx, history.jsonl
    "num-server-rounds": 3,
    "min-nodes": 2,                    # wait for this many SuperNodes; train and evaluate on at least as many
    "fraction-train": 1.0,
    "fraction-evaluate": 1.0,
    "local-epochs": 2,
    "batch-size": 32,
    "learning-rate": 0.1,
    "test-data": "",                   # server: optional .npz (x, y) on which to measure the global model
    "round-timeout": 3600.0,           # server: seconds to wait for the replies of a round
    "strategy": "FedAvg",              # server: a Flower strategy derived from FedAvg, by name
    "proximal-mu": 0.0,                # FedProx's proximal weight (the server sends it with strategy "FedProx")
    "initial-checkpoint": "",          # server: optional global checkpoint of an earlier run to resume from
    "alpha": 0.5,                      # the digits demo's Dirichlet split (node config overrides)
    "seed": 0,                         # the demo's split and the shuffling (node config overrides)
}


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(value)


def app_pyproject(name: str = "onnxtrain-federated", publisher: str = "onnxtrain", flwr_spec: str = ">=1.42",
                  **run_config) -> str:
    """The ``pyproject.toml`` of a Flower App that runs these apps; ``run_config`` overrides :data:`RUN_CONFIG`
    (use underscores for dashes: ``num_server_rounds=5``)."""
    config = dict(RUN_CONFIG)
    for key, value in run_config.items():
        key = key.replace("_", "-")
        if key not in config:
            raise ValueError(f"unknown run config key {key!r}; known: {sorted(config)}")
        config[key] = value
    lines = [
        "[build-system]", 'requires = ["hatchling"]', 'build-backend = "hatchling.build"', "",
        "[project]", f'name = "{name}"', 'version = "1.0.0"',
        'description = "Federated training of onnxtrain artifacts on Flower"', 'license = "MIT"',
        f'dependencies = ["onnxtrain[flower]", "flwr{flwr_spec}"]', "",
        "[tool.hatch.build.targets.wheel]", 'packages = ["."]', "",
        "[tool.flwr.app]", f'publisher = "{publisher}"', "",
        "[tool.flwr.app.components]", 'serverapp = "onnxtrain.federated.app:server_app"',
        'clientapp = "onnxtrain.federated.app:client_app"', "",
        "[tool.flwr.app.config]", *(f"{key} = {_toml_value(value)}" for key, value in config.items()), "",
    ]
    return "\n".join(lines)
