"""What a checkpoint holds: named tensors by kind, optimizer state, a step count and properties.

Every tensor has a *tensor key* that names its kind and owner, and is also its name in the safetensors
file: ``trainable/<name>``, ``frozen/<name>``, ``buffer/<name>`` and ``optimizer/<param>/<state>``.
Names may contain "/" and "." (``layers.0.weight``, ``onnx::MatMul_123``); optimizer state names
(``exp_avg``, ``momentum``) may not contain "/", so every key splits back into exactly one owner.

A *nominal* checkpoint has no tensor data, only the dtype and shape of every tensor (its ``specs``): it
describes a model's state without the memory, as onnxruntime-training's nominal checkpoints do.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from onnxtrain.checkpoint.dtypes import dtype_from_name, supported_names
from onnxtrain.errors import CheckpointError

__all__ = ["TensorSpec", "CheckpointData", "KINDS", "tensor_key", "split_tensor_key"]

# Tensor kinds, in the order a checkpoint lists its tensors.
KINDS = ("trainable", "frozen", "buffer", "optimizer")
_FIELDS = {"trainable": "trainable", "frozen": "frozen", "buffer": "buffers"}  # kind -> CheckpointData field


def tensor_key(kind: str, name: str, state: str | None = None) -> str:
    """The key of one tensor: ``tensor_key("trainable", "w") == "trainable/w"``,
    ``tensor_key("optimizer", "w", "exp_avg") == "optimizer/w/exp_avg"``."""
    if not isinstance(name, str):
        raise TypeError(f"{kind} tensor names must be str, got {type(name).__name__} {name!r}")
    if kind == "optimizer":
        if not isinstance(state, str):
            raise TypeError(f"optimizer state of parameter {name!r}: state names must be str, got {state!r}")
        if "/" in state:
            raise ValueError(f"optimizer state {state!r} of parameter {name!r}: state names must not contain '/'")
        return f"optimizer/{name}/{state}"
    if kind not in _FIELDS:
        raise ValueError(f"unknown tensor kind {kind!r}; expected one of {', '.join(KINDS)}")
    if state is not None:
        raise ValueError(f"only optimizer tensors have a state name, but {kind} tensor {name!r} got {state!r}")
    return f"{kind}/{name}"


def split_tensor_key(key: str) -> tuple[str, str, str | None]:
    """Inverse of :func:`tensor_key`: ``"optimizer/a/b/m"`` -> ``("optimizer", "a/b", "m")``,
    ``"trainable/a/b"`` -> ``("trainable", "a/b", None)``. Raises ValueError for any other string."""
    kind, sep, rest = key.partition("/") if isinstance(key, str) else ("", "", "")
    if not sep or kind not in KINDS:
        raise ValueError(f"tensor key {key!r} does not start with one of {', '.join(k + '/' for k in KINDS)}")
    if kind != "optimizer":
        return kind, rest, None
    name, sep, state = rest.rpartition("/")
    if not sep:
        raise ValueError(f"optimizer tensor key {key!r} is not of the form optimizer/<param>/<state>")
    return kind, name, state


@dataclass(frozen=True)
class TensorSpec:
    """The dtype (numpy name: "float32", "int64", "bool", ...) and shape of one tensor."""

    dtype: str
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        if dtype_from_name(self.dtype) is None:
            raise ValueError(f"TensorSpec dtype {self.dtype!r} is not supported; expected one of {supported_names()}")
        shape = tuple(self.shape)
        if not all(isinstance(d, int | np.integer) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise ValueError(f"TensorSpec shape {shape!r} must be a tuple of non-negative ints")
        object.__setattr__(self, "shape", tuple(int(d) for d in shape))

    @classmethod
    def of(cls, array: np.ndarray) -> TensorSpec:
        """The spec of ``array``."""
        return cls(array.dtype.name, array.shape)


@dataclass(eq=False)
class CheckpointData:
    """Everything a checkpoint file holds.

    Attributes:
        trainable: parameters the optimizer updates, by name; their order is kept on a round trip.
        frozen: parameters that are not trained.
        buffers: non-parameter state such as BatchNorm running mean and variance.
        optimizer: per-parameter optimizer state, ``{param: {state: array}}``, e.g.
            ``{"w": {"exp_avg": m, "exp_avg_sq": v}}``. A parameter whose state dict is empty is not stored.
        step: the optimizer step count.
        properties: user values; each an int (within int64), float or str. bool is rejected: it would
            come back as int.
        nominal: True when the checkpoint has no tensor data, only ``specs``.
        specs: for a nominal checkpoint, the dtype and shape of every tensor, keyed by :func:`tensor_key`.

    Instances compare by identity (arrays have no single truth value).
    """

    trainable: dict[str, np.ndarray]
    frozen: dict[str, np.ndarray] = field(default_factory=dict)
    buffers: dict[str, np.ndarray] = field(default_factory=dict)
    optimizer: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    step: int = 0
    properties: dict[str, int | float | str] = field(default_factory=dict)
    nominal: bool = False
    specs: dict[str, TensorSpec] = field(default_factory=dict)

    def tensors(self) -> dict[str, np.ndarray]:
        """Every tensor keyed by :func:`tensor_key`: trainable, frozen, buffers, then optimizer state."""
        if self.nominal:
            raise ValueError("a nominal checkpoint holds no tensor data; call materialize() to get one that does")
        flat: dict[str, np.ndarray] = {}
        for kind, attr in _FIELDS.items():
            for name, array in getattr(self, attr).items():
                flat[tensor_key(kind, name)] = array
        for param, states in self.optimizer.items():
            for state, array in states.items():
                flat[tensor_key("optimizer", param, state)] = array
        for key, array in flat.items():
            if not isinstance(array, np.ndarray):
                raise TypeError(f"tensor {key!r} must be a numpy.ndarray, got {type(array).__name__}; "
                                "wrap it with np.asarray()")
            if dtype_from_name(array.dtype.name) is None:
                raise TypeError(f"tensor {key!r} has dtype {array.dtype}; checkpoints hold {supported_names()}")
        return flat

    def tensor_specs(self) -> dict[str, TensorSpec]:
        """The dtype and shape of every tensor, keyed by :func:`tensor_key`, in :meth:`tensors` order."""
        if self.nominal:
            return dict(self.specs)
        return {key: TensorSpec.of(array) for key, array in self.tensors().items()}

    def nominal_copy(self) -> CheckpointData:
        """A nominal checkpoint with the same tensor names, dtypes and shapes, step and properties, no data."""
        return CheckpointData(trainable={}, step=self.step, properties=dict(self.properties), nominal=True,
                              specs=self.tensor_specs())

    def materialize(self, values: dict[str, np.ndarray] | None = None) -> CheckpointData:
        """A checkpoint with data: ``values[key]`` where given (keyed by :func:`tensor_key`), else the
        current array (for a full checkpoint) or zeros (for a nominal one). Arrays are used, not copied.

        Raises:
            CheckpointError: a value's key is not in the checkpoint, or its dtype or shape differs.
        """
        specs = self.tensor_specs()
        values = dict(values or {})
        unknown = [key for key in values if key not in specs]
        if unknown:
            raise CheckpointError(f"materialize() got values for {unknown}, which the checkpoint does not hold; "
                                  f"it holds {list(specs)}")
        current = {} if self.nominal else self.tensors()
        flat = {}
        for key, spec in specs.items():
            if key in values:
                flat[key] = _checked_value(key, values[key], spec)
            elif key in current:
                flat[key] = current[key]
            else:
                flat[key] = np.zeros(spec.shape, dtype_from_name(spec.dtype))
        return CheckpointData.from_tensors(flat, step=self.step, properties=dict(self.properties))

    @classmethod
    def from_tensors(cls, tensors: dict[str, np.ndarray], *, step: int = 0,
                     properties: dict[str, int | float | str] | None = None) -> CheckpointData:
        """Inverse of :meth:`tensors`: sort tensors keyed by :func:`tensor_key` into their kinds, in order."""
        data = cls(trainable={}, step=step, properties=dict(properties or {}))
        for key, array in tensors.items():
            kind, name, state = split_tensor_key(key)
            if kind == "optimizer":
                data.optimizer.setdefault(name, {})[state] = array
            else:
                getattr(data, _FIELDS[kind])[name] = array
        return data


def _checked_value(key: str, value: object, spec: TensorSpec) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        raise CheckpointError(f"materialize(): value for {key!r} must be a numpy.ndarray, got {type(value).__name__}")
    if value.dtype.name != spec.dtype or value.shape != spec.shape:
        raise CheckpointError(f"materialize(): value for {key!r} is {value.dtype.name}{list(value.shape)}, "
                              f"but the checkpoint expects {spec.dtype}{list(spec.shape)}")
    return value
