"""What travels between the server and the devices: the trainable parameters in checkpoint order, then the
buffers (the running statistics of BatchNorm layers that train), averaged like the parameters.

Both sides derive the same :class:`ParamSpec` from their own copy of the checkpoint, so an update is
checked against what the receiver itself holds, never against what the sender claims. Frozen parameters
(a backbone shared by every device) never travel. Plain numpy: no Flower here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from onnxtrain.api import CheckpointState
from onnxtrain.errors import OnnxTrainError

__all__ = ["ParamSpec", "UpdateRejected"]


class UpdateRejected(OnnxTrainError, ValueError):
    """An update that does not fit the checkpoint; the message says what is wrong and what was expected."""


@dataclass(frozen=True)
class ParamSpec:
    """Names, shapes and dtypes of what travels: the trainable parameters in checkpoint order, then the
    buffers (named in ``buffers``)."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[np.dtype, ...]
    buffers: frozenset[str] = frozenset()

    @classmethod
    def from_state(cls, state: CheckpointState) -> ParamSpec:
        trainable = [(n, p.data) for n, p in state.parameters.items() if p.requires_grad]
        if not trainable:
            raise ValueError("the checkpoint has no trainable parameters, so there is nothing to federate; "
                             "generate the artifacts with requires_grad=[...] naming at least one parameter")
        buffers = [(n, state.buffers[n]) for n in state.buffers]
        travel = trainable + buffers
        return cls(tuple(n for n, _ in travel), tuple(a.shape for _, a in travel), tuple(a.dtype for _, a in travel),
                   frozenset(n for n, _ in buffers))

    def _kind(self, name: str) -> str:
        return "buffer" if name in self.buffers else "parameter"

    @classmethod
    def from_checkpoint(cls, path: str | os.PathLike) -> ParamSpec:
        return cls.from_state(CheckpointState.load_checkpoint(path))

    def values(self, state: CheckpointState) -> dict[str, np.ndarray]:
        """The trainable parameters and buffers of ``state``, in order."""
        return {n: state.buffers[n] if n in self.buffers else state.parameters[n].data for n in self.names}

    def check(self, arrays: Mapping[str, np.ndarray], cast_floats: bool = False) -> dict[str, np.ndarray]:
        """Return ``arrays`` in spec order if they match the spec exactly and are finite; else raise
        :class:`UpdateRejected` naming the first problem.

        With ``cast_floats``, a floating-point array of another precision is cast to the spec's dtype (Flower's
        FedAdam and FedYogi return float64 averages of float32 parameters)."""
        missing = [n for n in self.names if n not in arrays]
        extra = [n for n in arrays if n not in self.names]
        if missing or extra:
            detail = "; ".join(s for s in (missing and f"missing {missing[:5]}", extra and f"unexpected {extra[:5]}")
                               if s)
            raise UpdateRejected(f"parameter names do not match the checkpoint's {len(self.names)} trainable "
                                 f"parameters and buffers: {detail}")
        checked = {}
        for name, shape, dtype in zip(self.names, self.shapes, self.dtypes):
            value, kind = arrays[name], self._kind(name)
            if not isinstance(value, np.ndarray):
                raise UpdateRejected(f"{kind} {name!r} is a {type(value).__name__}, expected a numpy array")
            if cast_floats and value.dtype != dtype and _both_float(value.dtype, dtype):
                with np.errstate(over="ignore"):   # what overflows becomes inf, refused below by name
                    value = value.astype(dtype)
            if value.dtype != dtype:
                raise UpdateRejected(f"{kind} {name!r} has dtype {value.dtype}, expected {dtype}")
            if value.shape != shape:
                raise UpdateRejected(f"{kind} {name!r} has shape {list(value.shape)}, expected {list(shape)}")
            bad = value.size - int(np.count_nonzero(np.isfinite(value)))
            if bad:
                raise UpdateRejected(f"{kind} {name!r} has {bad} non-finite values (NaN or inf) "
                                     f"of {value.size}")
            checked[name] = value
        return checked

    def load_into(self, state: CheckpointState, arrays: Mapping[str, np.ndarray]) -> None:
        """Check ``arrays`` and set them as the trainable parameters and buffers of ``state`` (a floating-point
        array of another precision is cast to the checkpoint's dtype)."""
        for name, value in self.check(arrays, cast_floats=True).items():
            if name in self.buffers:
                state.buffers[name] = value
            else:
                state.parameters[name] = value

    def __len__(self) -> int:
        return len(self.names)


def _both_float(a: np.dtype, b: np.dtype) -> bool:
    return bool(np.issubdtype(a, np.floating) and np.issubdtype(b, np.floating))
