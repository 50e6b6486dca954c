"""CheckpointState and Parameter, as in onnxruntime.training.api."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping

import numpy as np

from onnxtrain.checkpoint import CheckpointData, load_checkpoint, save_checkpoint
from onnxtrain.runtime.arguments import flag
from onnxtrain.runtime.values import TrainingValues

__all__ = ["CheckpointState", "Parameter", "Parameters", "Buffers", "Properties"]


class Parameter:
    """One named parameter of a :class:`CheckpointState` (``data``, ``grad``, ``requires_grad``)."""

    def __init__(self, values: TrainingValues, name: str):
        self._values, self.name = values, name

    @property
    def requires_grad(self) -> bool:
        return self._values.is_trainable(self.name)

    @property
    def data(self) -> np.ndarray:
        """A read-only copy of the parameter's current value; assign ``parameter.data = array`` to change it.

        The peer returns a view of its buffer, which a script may edit in place (``p.data[:] = 0``). Here the
        parameter's memory may be swapped for a prepared update at the next ``optimizer.step()``, so an edit of a
        view could be lost; editing the copy raises numpy's "read-only" ValueError instead of doing nothing."""
        return _read_only(self._values.value(self.name).copy(), f"parameter {self.name!r}'s .data")

    @data.setter
    def data(self, value: np.ndarray) -> None:
        self._values.set_value(self.name, value)

    @property
    def grad(self) -> np.ndarray | None:
        """A read-only copy of the accumulated gradient (None for frozen parameters)."""
        if not self.requires_grad:
            return None
        return _read_only(self._values.gradient(self.name).copy(), f"parameter {self.name!r}'s .grad")

    def __repr__(self) -> str:
        value = self._values.value(self.name)
        return (f"Parameter(name={self.name!r}, shape={tuple(value.shape)}, dtype={value.dtype}, "
                f"requires_grad={self.requires_grad})")


class Parameters:
    """``state.parameters[name]`` -> Parameter; ``state.parameters[name] = array`` sets its value.

    As the peer's, iterating yields ``(name, Parameter)`` pairs (``for name, param in state.parameters``);
    ``name in state.parameters``, ``len``, ``keys()``, ``values()`` and ``items()`` work as for a dict.
    """

    def __init__(self, values: TrainingValues):
        self._values = values

    def __getitem__(self, name: str) -> Parameter:
        if name not in self:
            raise KeyError(f"no parameter named {name!r}; the checkpoint has {len(self)} parameters "
                           f"(e.g. {self.keys()[:5]})")
        if name in self._values.unloaded:
            raise RuntimeError(f"Please load the parameter states first: {name!r} comes from a nominal checkpoint "
                               "(shapes only); Module.copy_buffer_to_parameters(buffer, trainable_only=False) loads "
                               "the values")
        return Parameter(self._values, name)

    def __setitem__(self, name: str, value: np.ndarray) -> None:
        if self._values.unloaded:
            raise RuntimeError("Please load all the parameter states first: the checkpoint is nominal (shapes "
                               "only); Module.copy_buffer_to_parameters(buffer, trainable_only=False) loads them")
        self[name].data = value

    def __contains__(self, name: object) -> bool:
        return name in self._values.params or name in self._values.frozen

    def keys(self) -> list[str]:
        """Trainable parameter names, then frozen ones."""
        return self._values.names()

    def values(self) -> list[Parameter]:
        return [self[n] for n in self.keys()]

    def items(self) -> list[tuple[str, Parameter]]:
        return [(n, self[n]) for n in self.keys()]

    def __iter__(self) -> Iterator[tuple[str, Parameter]]:
        return iter(self.items())

    def __len__(self) -> int:
        return len(self._values.params.offsets) + len(self._values.frozen)

    def __repr__(self) -> str:
        return f"Parameters({self.keys()})"


class Buffers(Mapping[str, np.ndarray]):
    """Non-parameter state the training graph updates (BatchNorm running statistics): ``state.buffers[name]``
    is a copy; ``state.buffers[name] = array`` sets it (shape and dtype checked)."""

    def __init__(self, values: TrainingValues):
        self._values = values

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._values.buffers:
            raise KeyError(f"no buffer named {name!r}; buffers: {sorted(self._values.buffers)[:8]}")
        return self._values.buffers[name].copy()

    def __setitem__(self, name: str, value) -> None:
        self._values.set_buffer(name, value)

    def __iter__(self) -> Iterator[str]:
        return iter(self._values.buffers)

    def __len__(self) -> int:
        return len(self._values.buffers)


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
        self._values[key] = _property_value(key, value)

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


class _ReadOnlyCopy(np.ndarray):
    """The array ``Parameter.data`` and ``Parameter.grad`` return: a read-only copy whose in-place edits (``p.data[:]
    = 0``, ``p.data += 1``) raise an error that says how to set the parameter, instead of numpy's "assignment
    destination is read-only". Arrays computed from it are plain and writeable."""

    what = "the copy"

    def __array_finalize__(self, obj) -> None:
        self.what = getattr(obj, "what", type(self).what)

    def __array_wrap__(self, array, context=None, return_scalar=False):
        result = np.asarray(array)  # computed arrays: plain ndarrays
        return result[()] if return_scalar else result

    def __repr__(self) -> str:
        return repr(self.view(np.ndarray))

    def __reduce__(self):  # pickled (and deep-copied) as the plain array it shows
        return np.asarray(self).copy().__reduce__()

    def copy(self, order="C") -> np.ndarray:
        """A plain, writeable copy."""
        return np.array(self.view(np.ndarray), order=order, copy=True)

    def __copy__(self) -> np.ndarray:
        return self.copy()

    def __deepcopy__(self, memo) -> np.ndarray:
        return self.copy()

    def _refuse(self, *args, **kwargs):
        if not self.flags.writeable:
            raise ValueError(f"{self.what} is a read-only copy, so an edit in place would change nothing; assign a "
                             "whole array instead: state.parameters[name].data = new_array (or module."
                             "copy_buffer_to_parameters for all of them)")
        return None


def _in_place(method: str):
    base = getattr(np.ndarray, method)

    def method_(self, *args, **kwargs):
        self._refuse()
        return base(self, *args, **kwargs)
    method_.__name__ = method
    return method_


for _method in ("__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__ipow__",
                "__imod__", "__imatmul__", "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__", "fill",
                "sort", "put", "itemset", "resize"):
    if hasattr(np.ndarray, _method):
        setattr(_ReadOnlyCopy, _method, _in_place(_method))


def _read_only(array: np.ndarray, what: str) -> np.ndarray:
    view = array.view(_ReadOnlyCopy)
    view.what = what
    view.flags.writeable = False
    return view


_INT64 = np.iinfo(np.int64)


def _property_value(key: str, value: object) -> int | float | str:
    """``value`` as the int, float or str a checkpoint stores: numpy scalars (``(pred == y).sum()``) become
    Python numbers and a bool an int (1 or 0), as the peer stores them; an int must fit in int64."""
    if isinstance(value, (bool, np.bool_)):
        return int(value)
    if isinstance(value, np.generic) and isinstance(value, (np.integer, np.floating, np.str_)):
        value = value.item()
    if isinstance(value, int):
        if not _INT64.min <= value <= _INT64.max:
            raise ValueError(f"property {key!r} = {value} does not fit in int64, as checkpoint ints must; "
                             "store it as a str or a float")
        return value
    if isinstance(value, (float, str)):
        return value
    raise TypeError(f"property {key!r} must be an int, float or str (or a numpy scalar of one), got "
                    f"{type(value).__name__}")


_LONGEST_PATH = 4096


def _checkpoint_path(uri, what: str) -> str | os.PathLike:
    """``uri`` as a path: a bytes path is decoded (the peer's binding takes one); bytes that cannot be a path (a
    checkpoint read into memory) are a TypeError saying so."""
    if isinstance(uri, (bytes, bytearray, memoryview)):
        raw = bytes(uri)
        if b"\0" in raw or len(raw) > _LONGEST_PATH:
            raise TypeError(f"CheckpointState.{what} takes the checkpoint's path, got {len(raw)} bytes that are not "
                            "a path (a checkpoint's content?): write them to a file and pass its path")
        return os.fsdecode(raw)
    if not isinstance(uri, (str, os.PathLike)):
        raise TypeError(f"CheckpointState.{what}: checkpoint_uri must be a path (str or os.PathLike), got "
                        f"{type(uri).__name__}")
    if not os.fspath(uri):
        raise ValueError(f"CheckpointState.{what}: checkpoint_uri is empty; give the checkpoint file's path")
    return uri


class CheckpointState:
    """Parameters, buffers, optimizer state and properties of a checkpoint while it trains.

    Attributes:
        values: the :class:`~onnxtrain.runtime.values.TrainingValues` holding every array (shared with the
            Modules and Optimizers created on this state).
        parameters, buffers, properties: the peer's views by name.
    """

    def __init__(self, data: CheckpointData | TrainingValues):
        if not isinstance(data, (CheckpointData, TrainingValues)):
            raise TypeError(f"CheckpointState() takes CheckpointData, got {type(data).__name__}; to read a checkpoint "
                            "file use CheckpointState.load_checkpoint(path) (CheckpointState(path) is the API of "
                            "onnxruntime-training before 1.15)")
        self.values = data if isinstance(data, TrainingValues) else TrainingValues(data)
        self.parameters = Parameters(self.values)
        self.buffers = Buffers(self.values)
        self.properties = Properties(self.values.properties)

    @property
    def step(self) -> int:
        """Optimizer steps taken (setting it makes an update prepared for the old step stale)."""
        return self.values.step

    @step.setter
    def step(self, value: int) -> None:
        self.values.step = value

    # -- the peer's API ---------------------------------------------------------------------------------
    @classmethod
    def load_checkpoint(cls, checkpoint_uri: str | os.PathLike) -> CheckpointState:
        """Load a checkpoint file written by generate_artifacts or save_checkpoint."""
        # the arrays read from the file belong to this state alone: each goes once copied into the flat vector
        return cls(TrainingValues(load_checkpoint(_checkpoint_path(checkpoint_uri, "load_checkpoint")), owned=True))

    @classmethod
    def save_checkpoint(cls, state: CheckpointState, checkpoint_uri: str | os.PathLike,
                        include_optimizer_state: bool = False) -> None:
        """Write ``state`` atomically to ``checkpoint_uri``."""
        if not isinstance(state, CheckpointState):
            swapped = " (the arguments are swapped: save_checkpoint(state, path))" if isinstance(
                checkpoint_uri, CheckpointState) else ""
            raise TypeError(f"CheckpointState.save_checkpoint(state, checkpoint_uri): state must be a "
                            f"CheckpointState, got {type(state).__name__} {state!r:.80}{swapped}")
        include_optimizer_state = flag(include_optimizer_state, "include_optimizer_state",
                                       "CheckpointState.save_checkpoint")
        checkpoint_uri = _checkpoint_path(checkpoint_uri, "save_checkpoint")
        save_checkpoint(state.values.to_data(include_optimizer_state, copy=False), checkpoint_uri,
                        include_optimizer_state=include_optimizer_state)

    # -- onnxruntime-training 1.15's indexing (1.16 split it into `parameters` and `properties`) -------------------
    def __getitem__(self, name: str) -> Parameter | int | float | str:
        """``state[name]``: the parameter of that name (a :class:`Parameter`), else the property."""
        if name in self.parameters:
            return self.parameters[name]
        if name in self.properties:
            return self.properties[name]
        raise KeyError(f"no parameter or property named {name!r} in the checkpoint state; parameters: "
                       f"{self.parameters.keys()[:5]}, properties: {self.properties.keys()}")

    def __setitem__(self, name: str, value) -> None:
        """``state[name] = value``: sets the parameter of that name (an array), else adds or sets a property."""
        if name in self.parameters:
            self.parameters[name] = value
        else:
            self.properties[name] = value

    def __contains__(self, name: object) -> bool:
        return name in self.parameters or name in self.properties

    def __iter__(self):
        # without it, iter() would index state[0], state[1], ... and fail with "no parameter named 0"
        raise TypeError("a CheckpointState is not iterable: iterate state.parameters (name, Parameter pairs) or "
                        "state.properties (name, value pairs)")

    def to_data(self, include_optimizer_state: bool = True) -> CheckpointData:
        """A copy of every value, as written to a checkpoint file."""
        return self.values.to_data(include_optimizer_state)

    def __repr__(self) -> str:
        return f"CheckpointState({self.values!r})"
