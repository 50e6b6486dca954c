"""Federated learning on Flower (optional extra ``flower``): ``pip install 'onnxtrain[flower]'``.

- :func:`make_client_app`: a Flower ``ClientApp`` that trains the onnxtrain artifacts on the device's own data
  and replies with the new trainable parameters and ``"num-examples"``; it also evaluates on request.
- :func:`make_server_app`: a Flower ``ServerApp`` running FedAvg (weighted by ``"num-examples"``) from the
  checkpoint's parameters, rejecting malformed updates (:class:`ValidatingFedAvg`) and writing the global
  checkpoint and inference model after every round.
- :func:`simulate`: N clients on a non-IID split of the digits, on Flower's simulation engine.
- ``onnxtrain.federated.app``: ``client_app`` and ``server_app`` configured from Flower's run and node
  config, for ``flwr run`` on a deployment (SuperLink + SuperNodes); see ``docs/federated.md``.

Only ``onnxtrain.federated`` imports Flower, and only when one of the names above is used. Flower's
telemetry, its update check and Ray's usage statistics are switched off unless the environment already
says otherwise (``FLWR_TELEMETRY_ENABLED``, ``FLWR_DISABLE_UPDATE_CHECK``, ``RAY_USAGE_STATS_ENABLED``).
"""

from __future__ import annotations

import importlib
import os

# Set before flwr (or ray) is first imported: flwr reads these at import time.
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

__all__ = ["ParamSpec", "UpdateRejected", "ClientSettings", "make_client_app", "ServerSettings", "make_server_app",
           "ValidatingFedAvg", "simulate"]

_LAZY = {"ParamSpec": "spec", "UpdateRejected": "spec", "ClientSettings": "client", "make_client_app": "client",
         "ServerSettings": "server", "make_server_app": "server", "ValidatingFedAvg": "server",
         "simulate": "simulation"}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'onnxtrain.federated' has no attribute {name!r}")
    return getattr(importlib.import_module(f"onnxtrain.federated.{_LAZY[name]}"), name)
