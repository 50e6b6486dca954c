"""User inputs: checked against a graph's declared inputs before a run; outputs returned as OrtValues."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from onnxtrain.errors import InputError
from onnxtrain.runtime.backends.base import TensorMeta

__all__ = ["check_inputs", "describe", "owned_ortvalue"]


def describe(meta: TensorMeta) -> str:
    dims = "?" if meta.shape is None else "[" + ", ".join(str(d) if d is not None else "?" for d in meta.shape) + "]"
    return f"{meta.dtype}{dims}"


def check_inputs(metas: Sequence[TensorMeta], values: Sequence[np.ndarray], what: str) -> list[np.ndarray]:
    """Return ``values`` as contiguous arrays, or raise InputError naming the first mismatching input."""
    if len(values) != len(metas):
        expected = ", ".join(f"{m.name}: {describe(m)}" for m in metas)
        raise InputError(f"{what} takes {len(metas)} inputs ({expected}), got {len(values)}")
    arrays = []
    symbols: dict[str, int] = {}
    for meta, value in zip(metas, values):
        array = value if type(value) is np.ndarray else np.asarray(value)
        if array.dtype != meta.dtype:
            if meta.dtype == object and array.dtype.kind == "U":  # string tensors: onnxruntime takes object arrays
                array = array.astype(object)
            else:
                raise InputError(f"{what}: input {meta.name!r} expects dtype {meta.dtype}, got {array.dtype} "
                                 f"(expected {describe(meta)}, got {array.dtype}{list(array.shape)})")
        if meta.shape is not None:
            if array.ndim != len(meta.shape):
                raise InputError(f"{what}: input {meta.name!r} expects rank {len(meta.shape)} "
                                 f"({describe(meta)}), got shape {list(array.shape)}")
            for axis, (want, got) in enumerate(zip(meta.shape, array.shape)):
                if isinstance(want, int) and want != got:
                    raise InputError(f"{what}: input {meta.name!r} expects shape {describe(meta)}, got "
                                     f"{list(array.shape)} (axis {axis} should be {want})")
                if isinstance(want, str):
                    if symbols.setdefault(want, got) != got:
                        raise InputError(f"{what}: input {meta.name!r} has {want}={got} on axis {axis}, but an "
                                         f"earlier input has {want}={symbols[want]}")
        arrays.append(array if array.flags.c_contiguous else np.ascontiguousarray(array))
    return arrays


def owned_ortvalue(array: np.ndarray):
    """An OrtValue holding its own copy of ``array`` (``ortvalue_from_numpy`` borrows the numpy memory)."""
    import onnxruntime as ort

    array = np.ascontiguousarray(array)
    value = ort.OrtValue.ortvalue_from_shape_and_type(array.shape, array.dtype, "cpu")
    value.update_inplace(array)
    return value
