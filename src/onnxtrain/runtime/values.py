"""TrainingValues: every value of a training run, in the buffers the sessions bind.

Parameters, gradients and optimizer states are flat double-buffered vectors (storage.py); frozen parameters
and buffers are arrays by name. This object owns them; the graphs read and write them only through
:class:`~onnxtrain.runtime.run.TrainingRun`, and the peer's API objects (CheckpointState, Parameter) only
through the methods here.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from onnxtrain.checkpoint import CheckpointData
from onnxtrain.conventions import TrainingMeta
from onnxtrain.errors import CheckpointError
from onnxtrain.runtime.arguments import sequence_hint
from onnxtrain.runtime.backends.base import TensorMeta
from onnxtrain.runtime.storage import FlatStorage

__all__ = ["TrainingValues"]


def _common_dtype(trainable: dict[str, np.ndarray]) -> np.dtype:
    """The one element type of the trainable parameters (they share flat vectors)."""
    dtypes = {a.dtype for a in trainable.values()} or {np.dtype(np.float32)}
    if len(dtypes) > 1:
        counts = {d: sum(a.dtype == d for a in trainable.values()) for d in dtypes}
        usual = max(counts, key=counts.get)
        odd = next(n for n, a in trainable.items() if a.dtype != usual)
        raise CheckpointError(f"the trainable parameters have several dtypes: {odd!r} is {trainable[odd].dtype}, "
                              f"{counts[usual]} others are {usual} (they share one flat vector; freeze it or cast it)")
    return dtypes.pop()


class TrainingValues:
    """The values of one checkpoint while it trains.

    Attributes:
        params: the trainable parameters (one flat vector, double-buffered).
        grads: their accumulated gradients (same layout, one copy: the training graph updates it in place).
        frozen: parameters fed to the graphs but never updated.
        buffers: state the training graph updates (BatchNorm running statistics).
        properties: the checkpoint's property bag.
        version: incremented by every write of the parameters, the gradients or the step from outside a training
            step; an update computed in advance is valid only for the version it was computed from.
        frozen_version: incremented by every write of a frozen parameter; a session that holds frozen values as
            constants is valid only for the version it was opened with.
    """

    def __init__(self, data: CheckpointData, owned: bool = False):
        """``owned``: ``data`` was read for these values alone (from a checkpoint file), so each trainable array is
        dropped from it once copied into the flat vector: the file's arrays and the vector are never both whole in
        memory (one copy of the parameters more while loading, 427 MB on a BERT-base)."""
        nominal = data.nominal
        if nominal:
            data = data.materialize()
        layout = [(n, a.shape) for n, a in data.trainable.items()]
        dtype = _common_dtype(data.trainable)
        self.params = FlatStorage(layout, dtype)
        # One gradient vector: a training graph overwrites it (reset) or adds into it element by element
        # (``out = buffer + g``, whose only reader of ``buffer`` is that Add), so it can be read and written in
        # the same run; nothing ever throws a gradient away (docs/memory.md).
        self.grads = FlatStorage(layout, dtype, copies=1, releasable=True)
        views = self.params.views()
        for name in list(data.trainable):
            views[name][...] = data.trainable[name]
            if owned and not nominal:
                del data.trainable[name]
        self.frozen = {n: np.asarray(a, order="C") for n, a in data.frozen.items()}
        self.buffers = {n: np.asarray(a, order="C") for n, a in data.buffers.items()}
        self.properties = dict(data.properties)
        self.version = 0
        self.frozen_version = 0
        self._step = data.step
        # from the checkpoint, until an optimizer takes it (each array is then let go: None)
        self._saved_optimizer = {p: dict(states) for p, states in data.optimizer.items()}
        self._optimizer_states: dict[str, FlatStorage] = {}
        # Parameters of a nominal checkpoint that hold no value yet (set_flat_parameters loads them).
        self.unloaded: set[str] = {*data.trainable, *data.frozen} if nominal else set()

    def require_loaded(self) -> None:
        """Raise unless every parameter has a value (a nominal checkpoint has none until they are copied in)."""
        if self.unloaded:
            raise RuntimeError(f"Please load the model parameters first. The checkpoint is nominal (shapes only): "
                               f"{len(self.unloaded)} parameters have no value; "
                               "Module.copy_buffer_to_parameters(buffer, trainable_only=False) loads them")

    def add_to_gradients(self, flat: np.ndarray) -> None:
        """Add ``flat`` (the gradients' layout, length and dtype) to the accumulated gradients, in place."""
        current = self.grads.current
        np.add(current, flat, out=current)
        self.version += 1  # an update computed in advance read the gradients without this term

    # -- the step counter -----------------------------------------------------------------------------------
    @property
    def step(self) -> int:
        """Optimizer steps taken."""
        return self._step

    @step.setter
    def step(self, value: int) -> None:
        if not isinstance(value, (int, np.integer)) or isinstance(value, (bool, np.bool_)):
            raise TypeError(f"step must be an integer, got {type(value).__name__} {value!r}")
        if not 0 <= value <= np.iinfo(np.int64).max:
            raise ValueError(f"step must be a non-negative int64, got {value}")
        self._step = int(value)
        self.version += 1

    def advance_step(self) -> None:
        """One optimizer step was taken (by the run itself: an update computed for this step stays valid)."""
        self._step += 1

    # -- parameters by name ----------------------------------------------------------------------------------
    def is_trainable(self, name: str) -> bool:
        return name in self.params

    def names(self) -> list[str]:
        """Trainable parameters (flat-buffer order), then frozen ones."""
        return [*self.params.offsets, *self.frozen]

    def value(self, name: str) -> np.ndarray:
        """The live array of a parameter (a view into the flat vector for a trainable one)."""
        if name in self.params:
            return self.params.views()[name]
        if name in self.frozen:
            return self.frozen[name]
        raise KeyError(f"no parameter named {name!r}")

    def set_value(self, name: str, value) -> None:
        """Overwrite a parameter, checking shape and dtype."""
        target = self.value(name)
        given, value = value, np.asarray(value)
        if value.shape != target.shape:
            raise ValueError(f"parameter {name!r} has shape {target.shape}, got a value of shape {value.shape}")
        if value.dtype != target.dtype:
            raise TypeError(f"parameter {name!r} has dtype {target.dtype}, got a value of dtype {value.dtype}"
                            + sequence_hint(given, target.dtype))
        target[...] = value
        self.version += 1
        if name in self.frozen:
            self.frozen_version += 1

    def gradient(self, name: str) -> np.ndarray:
        """The live accumulated gradient of a trainable parameter."""
        return self.grads.views()[name]

    def set_buffer(self, name: str, value) -> None:
        """Overwrite a buffer, checking shape and dtype."""
        target = self.buffers.get(name)
        if target is None:
            raise KeyError(f"no buffer named {name!r}; buffers: {sorted(self.buffers)[:8]}")
        value = np.asarray(value)
        if value.shape != target.shape or value.dtype != target.dtype:
            raise ValueError(f"buffer {name!r} is {target.dtype}{list(target.shape)}, got {value.dtype}"
                             f"{list(value.shape)}")
        target[...] = value

    # -- all parameters as one vector ------------------------------------------------------------------------
    def parameter_count(self, trainable_only: bool = True) -> int:
        return self.params.size + (0 if trainable_only else sum(a.size for a in self.frozen.values()))

    def flat_parameters(self, trainable_only: bool = False) -> np.ndarray:
        """Trainable parameters, then frozen ones unless ``trainable_only``, as one vector (the live flat
        vector itself when it is only the trainable ones)."""
        flat = self.params.current
        if not trainable_only and self.frozen:
            flat = np.concatenate([flat, *(a.ravel() for a in self.frozen.values())])
        return flat

    def set_flat_parameters(self, flat: np.ndarray, trainable_only: bool = True) -> None:
        """The inverse of :meth:`flat_parameters` (``flat``: an array, or a Python sequence whose dtype the
        error names)."""
        given, flat = flat, np.asarray(flat)
        expected = self.parameter_count(trainable_only)
        if flat.ndim != 1 or flat.size != expected:
            raise ValueError(f"copy_buffer_to_parameters expects a flat buffer of {expected} elements, got shape "
                             f"{list(flat.shape)}")
        if flat.dtype != self.params.dtype:
            raise TypeError(f"copy_buffer_to_parameters expects dtype {self.params.dtype}, got {flat.dtype}"
                            + sequence_hint(given, self.params.dtype))
        self.params.current[...] = flat[:self.params.size]
        self.version += 1
        offset = self.params.size
        if not trainable_only:
            for a in self.frozen.values():
                a[...] = flat[offset:offset + a.size].reshape(a.shape)
                offset += a.size
            self.frozen_version += 1
        self.unloaded.difference_update([*self.params.offsets, *([] if trainable_only else self.frozen)])

    def graph_values(self) -> dict[str, np.ndarray]:
        """Every parameter and buffer by graph input name (what the training and eval graphs read)."""
        return {**self.params.views(), **self.frozen, **self.buffers}

    def check_matches(self, meta: TrainingMeta) -> None:
        """CheckpointError unless these values are what the training model described by ``meta`` expects."""
        want, have = list(meta.trainable), list(self.params.offsets)
        if want != have:
            missing = [n for n in want if n not in self.params]
            extra = [n for n in have if n not in meta.trainable]
            if missing:
                detail = f"{missing[:5]} trainable in the training model, not in the checkpoint"
            elif extra:
                detail = f"{extra[:5]} trainable in the checkpoint, not in the training model"
            else:
                first = next(i for i, (w, h) in enumerate(zip(want, have)) if w != h)
                detail = (f"the trainable parameters are in another order: position {first} holds {have[first]!r} in "
                          f"the checkpoint, {want[first]!r} in the training model")
            raise CheckpointError(f"the checkpoint does not match the training model: {detail} (a checkpoint of "
                                  "other artifacts?)")
        for kind, present in (("frozen", self.frozen), ("buffers", self.buffers)):
            missing = [n for n in getattr(meta, kind) if n not in present]
            if missing:
                raise CheckpointError(f"the checkpoint does not match the training model: {kind} {missing[:5]} missing")

    def check_declared(self, declared: Iterable[TensorMeta], what: str) -> None:
        """CheckpointError unless every parameter and buffer has the dtype and static dimensions that the
        model ``what`` declares for its input of that name (a checkpoint of another model with the same
        names fails here, not inside the engine at the first step)."""
        values = self.graph_values()
        for meta in declared:
            array = values.get(meta.name)
            if array is None:
                continue
            if array.dtype != meta.dtype:
                raise CheckpointError(f"the checkpoint does not match the {what}: {meta.name!r} is {array.dtype} "
                                      f"in the checkpoint, {meta.dtype} in the {what}")
            if meta.shape is not None and (len(meta.shape) != array.ndim or any(
                    isinstance(want, int) and want != got for want, got in zip(meta.shape, array.shape))):
                expected = tuple(d if isinstance(d, int) else "?" for d in meta.shape)
                raise CheckpointError(f"the checkpoint does not match the {what}: {meta.name!r} has shape "
                                      f"{tuple(array.shape)} in the checkpoint, {expected} in the {what}")

    # -- optimizer state -------------------------------------------------------------------------------------
    def optimizer_states(self, state_names: tuple[str, ...]) -> dict[str, FlatStorage]:
        """Flat storage for each optimizer state, initialised from the checkpoint (zeros if it saved none).

        Raises:
            CheckpointError: the checkpoint saved optimizer state that is not this optimizer's (other state
                names, parameters or shapes): starting from zeros at its step would skew the update.
        """
        new = [s for s in state_names if s not in self._optimizer_states]
        if new and self._saved_optimizer:
            self._check_saved_optimizer(state_names)
        for s in new:
            storage = FlatStorage(self.params.layout, self.params.dtype)
            if self._saved_optimizer:
                for p, view in storage.views().items():
                    view[...] = self._saved_optimizer[p][s]
                    # copied: the checkpoint's array is not kept beside the vector (2 copies of the parameters
                    # for AdamW's moments, for as long as a resumed run lasted); the name stays for the checks
                    self._saved_optimizer[p][s] = None
            self._optimizer_states[s] = storage
        return {s: self._optimizer_states[s] for s in state_names}

    def _check_saved_optimizer(self, state_names: tuple[str, ...]) -> None:
        saved = self._saved_optimizer
        advice = ("; to start this optimizer afresh, save the checkpoint with include_optimizer_state=False and load "
                  "that")
        unknown = [p for p in saved if p not in self.params]
        if unknown:
            raise CheckpointError(f"the checkpoint's optimizer state is for parameters that do not train here: "
                                  f"{unknown[:5]}{advice}")
        views = self.params.views()
        for p, view in views.items():
            states = saved.get(p, {})
            if sorted(states) != sorted(state_names):
                raise CheckpointError(f"the checkpoint's optimizer state of {p!r} is {sorted(states)}, this optimizer "
                                      f"keeps {sorted(state_names)}{advice}")
            for s, array in states.items():
                if array.shape != view.shape or array.dtype != view.dtype:
                    raise CheckpointError(f"the checkpoint's optimizer state {s!r} of {p!r} is {array.dtype}"
                                          f"{list(array.shape)}, expected {view.dtype}{list(view.shape)}")

    # -- memory ----------------------------------------------------------------------------------------------
    def memory(self) -> dict[str, int]:
        """Bytes of the arrays held here, by kind: the memory model of docs/memory.md (parameters and optimizer
        states double-buffered, gradients, frozen parameters and buffers once)."""
        return {"params": self.params.nbytes, "grads": self.grads.nbytes,
                "optimizer_states": sum(s.nbytes for s in self._optimizer_states.values()),
                "frozen": sum(a.nbytes for a in self.frozen.values()),
                "buffers": sum(a.nbytes for a in self.buffers.values())}

    # -- to a checkpoint -------------------------------------------------------------------------------------
    def to_data(self, include_optimizer_state: bool = True, copy: bool = True) -> CheckpointData:
        """Every value, as written to a checkpoint file: copies, or (``copy=False``, for a save that is done before
        anything trains again) views of the live arrays, which a model of several GB cannot afford twice."""
        own = (lambda a: a.copy()) if copy else (lambda a: a)  # noqa: E731
        optimizer = {}
        if include_optimizer_state:
            optimizer = {p: {} for p in self.params.offsets}
            for state_name, storage in self._optimizer_states.items():
                for p, view in storage.views().items():
                    optimizer[p][state_name] = own(view)
            if not self._optimizer_states:
                optimizer = {p: dict(s) for p, s in self._saved_optimizer.items()}
        return CheckpointData(
            trainable={n: own(v) for n, v in self.params.views().items()},
            frozen={n: own(v) for n, v in self.frozen.items()},
            buffers={n: own(v) for n, v in self.buffers.items()},
            optimizer=optimizer, step=self._step, properties=dict(self.properties))

    def __repr__(self) -> str:
        return (f"{len(self.params.offsets)} trainable, {len(self.frozen)} frozen, {len(self.buffers)} buffers, "
                f"step={self._step}, properties={sorted(self.properties)}")
