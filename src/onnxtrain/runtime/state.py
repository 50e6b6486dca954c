"""CheckpointState and Parameter, as in onnxruntime.training.api."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping

import numpy as np

from onnxtrain.checkpoint import CheckpointData, load_checkpoint, save_checkpoint
from onnxtrain.runtime.storage import FlatStorage

__all__ = ["CheckpointState", "Parameter", "Parameters", "Buffers", "Properties"]


class Parameter:
    """One named parameter of a :class:`CheckpointState` (``data``, ``grad``, ``requires_grad``)."""

    def __init__(self, state: CheckpointState, name: str):
        self._state, self.name = state, name

    @property
    def requires_grad(self) -> bool:
        return self.name in self._state._params

    @property
    def data(self) -> np.ndarray:
        """A copy of the parameter's current value."""
        return self._state._value(self.name).copy()

    @data.setter
    def data(self, value: np.ndarray) -> None:
        self._state._set_value(self.name, value)

    @property
    def grad(self) -> np.ndarray | None:
        """A copy of the accumulated gradient (None for frozen parameters)."""
        if not self.requires_grad:
            return None
        return self._state._grads.views()[self.name].copy()

    def __repr__(self) -> str:
        value = self._state._value(self.name)
        return (f"Parameter(name={self.name!r}, shape={tuple(value.shape)}, dtype={value.dtype}, "
                f"requires_grad={self.requires_grad})")


class Parameters:
    """``state.parameters[name]`` -> Parameter; ``state.parameters[name] = array`` sets its value.

    As the peer's, iterating yields ``(name, Parameter)`` pairs (``for name, param in state.parameters``);
    ``name in state.parameters``, ``len``, ``keys()``, ``values()`` and ``items()`` work as for a dict.
    """

    def __init__(self, state: CheckpointState):
        self._state = state

    def __getitem__(self, name: str) -> Parameter:
        if name not in self:
            raise KeyError(f"no parameter named {name!r}; the checkpoint has {len(self)} parameters "
                           f"(e.g. {self.keys()[:5]})")
        if name in self._state._unloaded:
            raise RuntimeError(f"Please load the parameter states first: {name!r} comes from a nominal checkpoint "
                               "(shapes only); Module.copy_buffer_to_parameters(buffer) loads the values")
        return Parameter(self._state, name)

    def __setitem__(self, name: str, value: np.ndarray) -> None:
        if self._state._unloaded:
            raise RuntimeError("Please load all the parameter states first: the checkpoint is nominal (shapes "
                               "only); Module.copy_buffer_to_parameters(buffer, trainable_only=False) loads them")
        self[name].data = value

    def __contains__(self, name: object) -> bool:
        return name in self._state._params.offsets or name in self._state._frozen

    def keys(self) -> list[str]:
        """Trainable parameter names, then frozen ones."""
        return [*self._state._params.offsets, *self._state._frozen]

    def values(self) -> list[Parameter]:
        return [self[n] for n in self.keys()]

    def items(self) -> list[tuple[str, Parameter]]:
        return [(n, self[n]) for n in self.keys()]

    def __iter__(self) -> Iterator[tuple[str, Parameter]]:
        return iter(self.items())

    def __len__(self) -> int:
        return len(self._state._params.offsets) + len(self._state._frozen)

    def __repr__(self) -> str:
        return f"Parameters({self.keys()})"


class Buffers(Mapping[str, np.ndarray]):
    """Non-parameter state the training graph updates (BatchNorm running statistics): ``state.buffers[name]``
    is a copy; ``state.buffers[name] = array`` sets it (shape and dtype checked)."""

    def __init__(self, state: CheckpointState):
        self._state = state

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._state._buffers:
            raise KeyError(f"no buffer named {name!r}; buffers: {sorted(self._state._buffers)[:8]}")
        return self._state._buffers[name].copy()

    def __setitem__(self, name: str, value) -> None:
        target = self._state._buffers.get(name)
        if target is None:
            raise KeyError(f"no buffer named {name!r}; buffers: {sorted(self._state._buffers)[:8]}")
        value = np.asarray(value)
        if value.shape != target.shape or value.dtype != target.dtype:
            raise ValueError(f"buffer {name!r} is {target.dtype}{list(target.shape)}, got {value.dtype}"
                             f"{list(value.shape)}")
        target[...] = value

    def __iter__(self) -> Iterator[str]:
        return iter(self._state._buffers)

    def __len__(self) -> int:
        return len(self._state._buffers)


class Properties:
    """The checkpoint's property bag: int, float and str values.

    As the peer's, iterating yields ``(name, value)`` pairs; ``in``, ``len``, ``get``, ``keys()``, ``values()``
    and ``items()`` work as for a dict.
    """

    def __init__(self, values: dict):
        self._values = values

    def __getitem__(self, key: str):
        if key not in self._values:
            raise KeyError(f"no property named {key!r}; properties: {sorted(self._values)}")
        return self._values[key]

    def __setitem__(self, key: str, value) -> None:
        if not isinstance(key, str):
            raise TypeError(f"property names must be str, got {key!r}")
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise TypeError(f"property {key!r} must be an int, float or str, got {type(value).__name__}")
        self._values[key] = value

    def __delitem__(self, key: str) -> None:
        del self._values[key]

    def __contains__(self, key: object) -> bool:
        return key in self._values

    def get(self, key: str, default=None):
        return self._values.get(key, default)

    def keys(self) -> list[str]:
        return list(self._values)

    def values(self) -> list:
        return list(self._values.values())

    def items(self) -> list[tuple[str, int | float | str]]:
        return list(self._values.items())

    def __iter__(self) -> Iterator[tuple[str, int | float | str]]:
        return iter(self.items())

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Properties({self._values!r})"


class CheckpointState:
    """Parameters, buffers, optimizer state and properties, held in flat buffers shared with the Module."""

    def __init__(self, data: CheckpointData):
        nominal = data.nominal
        if nominal:
            data = data.materialize()
        layout = [(n, a.shape) for n, a in data.trainable.items()]
        dtypes = {a.dtype for a in data.trainable.values()} or {np.dtype(np.float32)}
        if len(dtypes) > 1:
            raise ValueError(f"trainable parameters of several dtypes are not supported: {sorted(map(str, dtypes))}")
        dtype = dtypes.pop()
        self._params = FlatStorage(layout, dtype)
        self._grads = FlatStorage(layout, dtype)
        for name, value in data.trainable.items():
            self._params.views()[name][...] = value
        self._frozen = {n: np.ascontiguousarray(a) for n, a in data.frozen.items()}
        self._buffers = {n: np.ascontiguousarray(a) for n, a in data.buffers.items()}
        self._optimizer_data = data.optimizer
        self._optimizer_states: dict[str, FlatStorage] = {}
        self._mutations = 0  # parameter writes through the API (an update prepared before one is stale)
        self.step = data.step
        self._properties = dict(data.properties)
        # Parameters of a nominal checkpoint that hold no value yet (Module.copy_buffer_to_parameters loads them).
        self._unloaded: set[str] = {*data.trainable, *data.frozen} if nominal else set()
        self.parameters = Parameters(self)
        self.buffers = Buffers(self)
        self.properties = Properties(self._properties)

    # -- the peer's API ---------------------------------------------------------------------------------
    @classmethod
    def load_checkpoint(cls, checkpoint_uri: str | os.PathLike) -> CheckpointState:
        """Load a checkpoint file written by generate_artifacts or save_checkpoint."""
        return cls(load_checkpoint(checkpoint_uri))

    @classmethod
    def save_checkpoint(cls, state: CheckpointState, checkpoint_uri: str | os.PathLike,
                        include_optimizer_state: bool = False) -> None:
        """Write ``state`` atomically to ``checkpoint_uri``."""
        save_checkpoint(state.to_data(include_optimizer_state), checkpoint_uri,
                        include_optimizer_state=include_optimizer_state)

    # -- internals shared with Module and Optimizer -------------------------------------------------------
    def require_loaded(self) -> None:
        """Raise unless every parameter has a value (a nominal checkpoint has none until they are copied in)."""
        if self._unloaded:
            raise RuntimeError(f"Please load the model parameters first. The checkpoint is nominal (shapes only): "
                               f"{len(self._unloaded)} parameters have no value; "
                               "Module.copy_buffer_to_parameters(buffer, trainable_only=False) loads them")

    def mark_loaded(self, names) -> None:
        """Record that ``names`` now hold real values."""
        self._unloaded.difference_update(names)

    def to_data(self, include_optimizer_state: bool = True) -> CheckpointData:
        optimizer = {}
        if include_optimizer_state:
            optimizer = {p: {} for p in self._params.offsets}
            for state_name, storage in self._optimizer_states.items():
                for p, view in storage.views().items():
                    optimizer[p][state_name] = view.copy()
            if not self._optimizer_states:
                optimizer = {p: dict(s) for p, s in self._optimizer_data.items()}
        return CheckpointData(
            trainable={n: v.copy() for n, v in self._params.views().items()},
            frozen={n: v.copy() for n, v in self._frozen.items()},
            buffers={n: v.copy() for n, v in self._buffers.items()},
            optimizer=optimizer, step=self.step, properties=dict(self._properties))

    def _value(self, name: str) -> np.ndarray:
        if name in self._params:
            return self._params.views()[name]
        if name in self._frozen:
            return self._frozen[name]
        raise KeyError(f"no parameter named {name!r}")

    def _set_value(self, name: str, value) -> None:
        target = self._value(name)
        value = np.asarray(value)
        if value.shape != target.shape:
            raise ValueError(f"parameter {name!r} has shape {target.shape}, got a value of shape {value.shape}")
        if value.dtype != target.dtype:
            raise TypeError(f"parameter {name!r} has dtype {target.dtype}, got a value of dtype {value.dtype}")
        target[...] = value
        self._mutations += 1

    def optimizer_storage(self, state_names: tuple[str, ...]) -> dict[str, FlatStorage]:
        """Flat storage for each optimizer state, initialised from the checkpoint (zeros if absent)."""
        for s in state_names:
            if s not in self._optimizer_states:
                storage = FlatStorage(self._params.layout, self._params.dtype)
                for p, view in storage.views().items():
                    saved = self._optimizer_data.get(p, {}).get(s)
                    if saved is not None:
                        if saved.shape != view.shape:
                            raise ValueError(f"optimizer state {s!r} of {p!r} has shape {saved.shape}, "
                                             f"expected {view.shape}")
                        view[...] = saved
                self._optimizer_states[s] = storage
        return {s: self._optimizer_states[s] for s in state_names}

    def __repr__(self) -> str:
        return (f"CheckpointState({len(self._params.offsets)} trainable, {len(self._frozen)} frozen, "
                f"{len(self._buffers)} buffers, step={self.step}, properties={sorted(self._properties)})")
