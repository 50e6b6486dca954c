"""User inputs: checked against a graph's declared inputs before a run; outputs returned as OrtValues."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from onnxtrain.conventions import CLASS_LOSSES
from onnxtrain.errors import InputError
from onnxtrain.runtime.backends.base import TensorMeta

__all__ = ["ClassLabels", "check_inputs", "class_label_inputs", "describe", "owned_ortvalue"]

# ops that pass a label tensor on unchanged but for its layout or integer type
_LABEL_VIEWS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Cast"})


@dataclass(frozen=True)
class ClassLabels:
    """An input that a class loss reads as its labels: each value must be a class index in [0, classes) or the
    loss's ignore_index. onnxruntime wraps a negative label around to a class from the end (-1 is the last
    class) without an error, so the runtime checks them before a run."""

    loss: str
    scores: str  # the value the loss reads the class scores from
    classes: int | None  # None: not declared in the graph (onnxruntime rejects labels above it at run time)
    ignore_index: int | None


def class_label_inputs(model: onnx.ModelProto) -> dict[str, ClassLabels]:
    """The graph inputs that a SoftmaxCrossEntropyLoss or NegativeLogLikelihoodLoss node reads as labels,
    directly or through view and cast nodes."""
    graph = model.graph
    producer = {o: n for n in graph.node for o in n.output}
    inputs = {i.name for i in graph.input}
    shapes = {v.name: v.type.tensor_type.shape for v in (*graph.value_info, *graph.input, *graph.output)}
    found: dict[str, ClassLabels] = {}
    for node in graph.node:
        if node.op_type not in CLASS_LOSSES or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
            continue
        label = node.input[1]
        while label not in inputs and label in producer and producer[label].op_type in _LABEL_VIEWS:
            label = producer[label].input[0]
        if label not in inputs:
            continue
        dims = shapes[node.input[0]].dim if node.input[0] in shapes else []
        classes = dims[1].dim_value if len(dims) > 1 and dims[1].HasField("dim_value") else None
        ignore = next((a.i for a in node.attribute if a.name == "ignore_index"), None)
        found[label] = ClassLabels(node.op_type, node.input[0], classes, ignore)
    return found


def _check_labels(name: str, array: np.ndarray, labels: ClassLabels, what: str) -> None:
    """Raise InputError if ``array`` holds a value that is neither a class index nor the ignore_index."""
    if array.size == 0 or array.dtype.kind not in "iu":
        return
    low, high = array.min(), array.max()
    if low >= 0 and (labels.classes is None or high < labels.classes):
        return
    bad = (array < 0) if labels.classes is None else ((array < 0) | (array >= labels.classes))
    if labels.ignore_index is not None:
        bad &= array != labels.ignore_index
    if not bad.any():
        return
    where = np.unravel_index(int(np.argmax(bad)), array.shape)
    value = int(array[where])
    allowed = f"0 to {labels.classes - 1}" if labels.classes is not None else "from 0 to the number of classes - 1"
    ignore = (f" or equal ignore_index={labels.ignore_index}" if labels.ignore_index is not None else
              "; the loss has no ignore_index (torch's default of -100 is not implied: set it on the loss block)"
              if value < 0 else "")
    raise InputError(f"{what}: input {name!r} holds the class label {value} at index {list(map(int, where))}; "
                     f"{labels.loss} labels must be class indices, {allowed}{ignore}")


def describe(meta: TensorMeta) -> str:
    dims = "?" if meta.shape is None else "[" + ", ".join(str(d) if d is not None else "?" for d in meta.shape) + "]"
    return f"{meta.dtype}{dims}"


def check_inputs(metas: Sequence[TensorMeta], values: Sequence[np.ndarray], what: str,
                 labels: Mapping[str, ClassLabels] | None = None) -> list[np.ndarray]:
    """Return ``values`` as contiguous arrays, or raise InputError naming the first mismatching input or the
    first label (``labels``: the inputs that class losses read) that is not a class index."""
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
        if array.ndim and array.shape[0] == 0 and meta.shape and not isinstance(meta.shape[0], int):
            raise InputError(f"{what}: input {meta.name!r} holds no examples (shape {list(array.shape)}); a step "
                             "needs a batch of at least one")
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
        if labels and meta.name in labels:
            _check_labels(meta.name, array, labels[meta.name], what)
        arrays.append(array if array.flags.c_contiguous else np.asarray(array, order="C"))
    return arrays


def owned_ortvalue(array: np.ndarray):
    """An OrtValue holding its own copy of ``array`` (``ortvalue_from_numpy`` borrows the numpy memory)."""
    import onnxruntime as ort

    array = np.asarray(array, order="C")  # not ascontiguousarray: it makes a 0-d loss 1-d
    value = ort.OrtValue.ortvalue_from_shape_and_type(array.shape, array.dtype, "cpu")
    value.update_inplace(array)
    return value
