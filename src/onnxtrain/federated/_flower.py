"""The one place that imports Flower: a clear error when it is missing, and ArrayRecord <-> numpy."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np

from onnxtrain.federated.spec import UpdateRejected

try:
    from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import FedAvg, FedProx
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("onnxtrain.federated needs Flower: pip install 'onnxtrain[flower]' "
                      f"(for the simulation engine too: pip install 'flwr[simulation]') ({exc})") from exc

__all__ = ["Array", "ArrayRecord", "ClientApp", "ConfigRecord", "Context", "FedAvg", "FedProx", "Grid", "Message",
           "MetricRecord", "RecordDict", "ServerApp", "logger", "to_record", "from_record", "setting"]

# A child of Flower's logger, so that onnxtrain's lines appear with Flower's (also in `flwr log` / `--stream`).
logger = logging.getLogger("flwr.onnxtrain")


def to_record(arrays: Mapping[str, np.ndarray]) -> ArrayRecord:
    """An ArrayRecord holding ``arrays`` in their order."""
    return ArrayRecord({name: Array(np.asarray(value, order="C")) for name, value in arrays.items()})


def from_record(record: ArrayRecord) -> dict[str, np.ndarray]:
    """Decode an ArrayRecord; an undecodable entry is an :class:`UpdateRejected`."""
    arrays = {}
    for name, array in record.items():
        try:
            arrays[name] = array.numpy()
        except Exception as exc:
            raise UpdateRejected(f"parameter {name!r} cannot be decoded as a numpy array "
                                 f"(stype {array.stype!r}): {exc}") from None
    return arrays


def setting(key: str, context: Context, config: Mapping | None, default):
    """The value of ``key`` from the message's config, else the node config, else the run config, else
    ``default``, converted to the type of ``default`` (when ``default`` is not None)."""
    for source in (config or {}, context.node_config, context.run_config):
        if key in source:
            value = source[key]
            break
    else:
        return default
    if default is None or isinstance(value, type(default)):
        return value
    if isinstance(default, int) and isinstance(value, float) and not value.is_integer():
        raise ValueError(f"setting {key!r} must be an int, got {value!r}")
    try:
        return type(default)(value)
    except (TypeError, ValueError):
        raise ValueError(f"setting {key!r} must be a {type(default).__name__}, got {value!r}") from None
