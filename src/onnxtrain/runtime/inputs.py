"""User inputs: checked against a graph's declared inputs before a run; outputs returned as OrtValues."""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import onnx

from onnxtrain.conventions import CLASS_LOSSES
from onnxtrain.errors import InputError
from onnxtrain.runtime.arguments import sequence_hint
from onnxtrain.runtime.backends.base import TensorMeta

__all__ = ["ClassLabels", "TableIndices", "check_inputs", "class_label_inputs", "table_index_inputs", "describe",
           "owned_ortvalue"]

# ops that pass a label tensor on unchanged but for its layout or integer type
_LABEL_VIEWS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Cast"})


def _traced_input(value: str, producer: Mapping[str, onnx.NodeProto], inputs: Set[str]) -> str | None:
    """The graph input ``value`` is, through view and cast nodes (:data:`_LABEL_VIEWS`), or None."""
    while value not in inputs and value in producer and producer[value].op_type in _LABEL_VIEWS:
        value = producer[value].input[0]
    return value if value in inputs else None


def _first_where(bad: np.ndarray, array: np.ndarray) -> tuple[list[int], int]:
    """The index of the first True of ``bad`` and the value of ``array`` there (what an InputError quotes)."""
    where = np.unravel_index(int(np.argmax(bad)), array.shape)
    return list(map(int, where)), int(array[where])


@dataclass(frozen=True)
class ClassLabels:
    """An input that a class loss reads as its labels: each value must be a class index in [0, classes) or the
    loss's ignore_index. onnxruntime wraps a negative label around to a class from the end (-1 is the last
    class) without an error, so the runtime checks them before a run."""

    loss: str
    scores: str  # the value the loss reads the class scores from
    classes: int | None  # None: not declared in the graph (onnxruntime rejects labels above it at run time)
    ignore_index: int | None
    # scores of rank 3 or more that the loss reads with the classes on axis 1 as the model computes them (no
    # Transpose brought another axis there, as class_axis=-1 does): their name and shape (int, str or None dims).
    # Labels shaped like them without the last axis are per-token labels of a (batch, sequence, vocabulary) model.
    model_scores: tuple[str, tuple] | None = None


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
        label = _traced_input(node.input[1], producer, inputs)
        if label is None:
            continue
        dims = shapes[node.input[0]].dim if node.input[0] in shapes else []
        classes = dims[1].dim_value if len(dims) > 1 and dims[1].HasField("dim_value") else None
        ignore = next((a.i for a in node.attribute if a.name == "ignore_index"), None)
        found[label] = ClassLabels(node.op_type, node.input[0], classes, ignore,
                                   _model_scores(node, producer, shapes, label))
    return found


def _dims(shape: onnx.TensorShapeProto) -> tuple:
    return tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in shape.dim)


def _model_scores(loss: onnx.NodeProto, producer: Mapping[str, onnx.NodeProto],
                  shapes: Mapping[str, onnx.TensorShapeProto], label: str) -> tuple[str, tuple] | None:
    """:attr:`ClassLabels.model_scores` of ``loss`` reading labels from the input ``label``: the scores (named as
    before the Reshape(x, Shape(x)) that keeps a shape for the backward, artifacts.passes.ShapesInForward) with
    their declared shape, else the shape that the declaration of labels the loss reads directly implies, None for
    the size of axis 1 that it lacks (generate_artifacts declares the scores only when that size is static)."""
    scores = loss.input[0]
    dims = _dims(shapes[scores]) if scores in shapes else None
    while _pinned(producer.get(scores), producer):
        scores = producer[scores].input[0]
        dims = dims if dims is not None or scores not in shapes else _dims(shapes[scores])
    node = producer.get(scores)
    if node is not None and node.op_type == "Transpose":
        perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), [])
        if len(perm) < 2 or perm[1] != 1:  # another axis brought to axis 1 (class_axis=-1)
            return None
    if dims is None and loss.input[1] == label and label in shapes and len(shapes[label].dim) >= 2:
        labels = _dims(shapes[label])
        dims = (labels[0], None, *labels[1:])
    return (scores, dims) if dims is not None and len(dims) >= 3 else None


def _pinned(node: onnx.NodeProto | None, producer: Mapping[str, onnx.NodeProto]) -> bool:
    """Whether ``node`` is a Reshape(x, Shape(x)): x itself."""
    if node is None or node.op_type != "Reshape" or len(node.input) < 2 or node.input[1] not in producer:
        return False
    shape = producer[node.input[1]]
    return shape.op_type == "Shape" and not shape.attribute and shape.input[0] == node.input[0]


# the onnxtrain.blocks loss writing each class loss op
_LOSS_BLOCKS = {"SoftmaxCrossEntropyLoss": "CrossEntropyLoss", "NegativeLogLikelihoodLoss": "NLLLoss"}


def _per_token_hint(shape: tuple[int, ...], labels: ClassLabels, symbols: Mapping[str, int]) -> str:
    """The way to regenerate, when labels of ``shape`` that do not fit the declared shape look per-token: shaped
    like the scores without their last axis, where the loss reads the classes on axis 1; else ''."""
    if labels.model_scores is None:
        return ""
    name, scores = labels.model_scores
    if len(shape) != len(scores) - 1:
        return ""
    for want, got in zip(scores[:-1], shape):
        if isinstance(want, int) and want != got or isinstance(want, str) and symbols.get(want, got) != got:
            return ""
    block = _LOSS_BLOCKS.get(labels.loss, "CrossEntropyLoss")
    ignore = f", ignore_index={labels.ignore_index}" if labels.ignore_index is not None else ""
    dims = ", ".join("?" if d is None else str(d) for d in scores)
    return (f"; these look like per-token labels: the loss reads the classes on axis 1 of {name!r} [{dims}] "
            f"(torch's (N, C, ...) layout), and {list(shape)} is its shape without the last axis. If the classes "
            f"are on the last axis (a language model's (batch, sequence, vocabulary) logits), generate the "
            f"artifacts again with loss=onnxtrain.blocks.{block}(class_axis=-1{ignore})")


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
    where, value = _first_where(bad, array)
    allowed = f"0 to {labels.classes - 1}" if labels.classes is not None else "from 0 to the number of classes - 1"
    ignore = (f" or equal ignore_index={labels.ignore_index}" if labels.ignore_index is not None else
              "; the loss has no ignore_index (torch's default of -100 is not implied: set it on the loss block)"
              if value < 0 else "")
    raise InputError(f"{what}: input {name!r} holds the class label {value} at index {where}; "
                     f"{labels.loss} labels must be class indices, {allowed}{ignore}")


@dataclass(frozen=True)
class TableIndices:
    """An input that a Gather reads as row indices of a parameter (an embedding's token ids): each value must be a
    row, in [0, rows). onnxruntime reads a negative index as a row from the end (-1 is the last) without an error,
    where torch's Embedding refuses it, so a padding id of -1 would silently train the last row."""

    table: str
    rows: int


def table_index_inputs(model: onnx.ModelProto, parameters: Sequence[str]) -> dict[str, TableIndices]:
    """The graph inputs that a Gather on axis 0 of one of ``parameters`` (graph inputs of static first dimension)
    or of an initializer (a weight kept as a constant of the graph) reads as indices, directly or through view and
    cast nodes."""
    graph = model.graph
    producer = {o: n for n in graph.node for o in n.output}
    inputs = {i.name for i in graph.input}
    tables = set(parameters) | {t.name for t in graph.initializer}
    dims = {v.name: v.type.tensor_type.shape.dim for v in graph.input if v.name in tables}
    rows = {name: d[0].dim_value for name, d in dims.items() if d and d[0].HasField("dim_value")}
    rows.update({t.name: t.dims[0] for t in graph.initializer if t.name in tables and t.dims})
    found: dict[str, TableIndices] = {}
    for node in graph.node:
        if node.op_type != "Gather" or node.domain not in ("", "ai.onnx") or node.input[0] not in rows:
            continue
        if next((a.i for a in node.attribute if a.name == "axis"), 0) != 0:
            continue
        index = _traced_input(node.input[1], producer, inputs)
        if index is not None and index not in tables:
            found.setdefault(index, TableIndices(node.input[0], rows[node.input[0]]))
    return found


def _check_indices(name: str, array: np.ndarray, indices: TableIndices, what: str) -> None:
    """Raise InputError if ``array`` holds a value that is not a row of the table it indexes."""
    if array.size == 0 or array.dtype.kind not in "iu":
        return
    if array.min() >= 0 and array.max() < indices.rows:
        return
    where, value = _first_where((array < 0) | (array >= indices.rows), array)
    why = (" (onnxruntime would read it as a row from the end, torch's Embedding refuses it: a padding id needs a "
           "row of its own)" if value < 0 else "")
    raise InputError(f"{what}: input {name!r} holds {value} at index {where}, and it indexes the "
                     f"{indices.rows} rows of {indices.table!r}: its values must be from 0 to {indices.rows - 1}{why}")


_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
              ast.Div: operator.truediv, ast.Mod: operator.mod}
_FUNCTIONS = {"floor": math.floor, "ceil": math.ceil, "min": min, "max": max, "Min": min, "Max": max}


@lru_cache(maxsize=256)
def _size_expression(text: str) -> ast.expr | None:
    """A declared size computed from other sizes (``s27-1`` for a shifted language-model target, ``2*batch``,
    ``floor((height+1)/2)``), parsed; None for a plain symbol or what is not such arithmetic."""
    if text.isidentifier():
        return None
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError:
        return None
    allowed = (ast.BinOp, ast.UnaryOp, ast.USub, ast.Name, ast.Constant, ast.Call, ast.Load, *_OPERATORS)
    if not all(isinstance(n, allowed) for n in ast.walk(tree)):
        return None
    if any(isinstance(n, ast.Call) and not (isinstance(n.func, ast.Name) and n.func.id in _FUNCTIONS)
           for n in ast.walk(tree)):
        return None
    return tree


def _evaluate(tree: ast.expr, sizes: Mapping[str, int]):
    """The value of a size expression, or None if it reads a size not in ``sizes``."""
    if isinstance(tree, ast.Constant):
        return tree.value if isinstance(tree.value, (int, float)) else None
    if isinstance(tree, ast.Name):
        return sizes.get(tree.id)
    if isinstance(tree, ast.UnaryOp):
        value = _evaluate(tree.operand, sizes)
        return None if value is None else -value
    if isinstance(tree, ast.BinOp):
        left, right = _evaluate(tree.left, sizes), _evaluate(tree.right, sizes)
        if left is None or right is None or (right == 0 and type(tree.op) in (ast.FloorDiv, ast.Div, ast.Mod)):
            return None
        return _OPERATORS[type(tree.op)](left, right)
    if isinstance(tree, ast.Call) and not tree.keywords:
        args = [_evaluate(a, sizes) for a in tree.args]
        return None if not args or None in args else _FUNCTIONS[tree.func.id](*args)
    return None


def _check_computed_sizes(metas: Sequence[TensorMeta], arrays: Sequence[np.ndarray], sizes: Mapping[str, int],
                          what: str) -> None:
    """An InputError for the first axis whose declared size is computed from the other inputs' sizes (a causal
    language model's labels are one token shorter than its input) and differs from the array's."""
    for meta, array in zip(metas, arrays):
        for axis, want in enumerate(meta.shape or ()):
            tree = _size_expression(want) if isinstance(want, str) else None
            value = _evaluate(tree, sizes) if tree is not None else None
            if value is None or value == array.shape[axis]:
                continue
            read = sorted({n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id in sizes})
            given = ", ".join(f"{name}={sizes[name]}" for name in read)
            raise InputError(f"{what}: input {meta.name!r} expects {want}={value:g} on axis {axis} ({given} from the "
                             f"other inputs), got shape {list(array.shape)}")


def describe(meta: TensorMeta) -> str:
    dims = "?" if meta.shape is None else "[" + ", ".join(str(d) if d is not None else "?" for d in meta.shape) + "]"
    return f"{meta.dtype}{dims}"


def check_inputs(metas: Sequence[TensorMeta], values: Sequence[np.ndarray], what: str,
                 labels: Mapping[str, ClassLabels] | None = None,
                 tables: Mapping[str, TableIndices] | None = None) -> list[np.ndarray]:
    """Return ``values`` as contiguous arrays, or raise InputError naming the first mismatching input, the first
    label (``labels``: the inputs that class losses read) that is not a class index, or the first index (``tables``:
    the inputs that index a parameter's rows) that is not a row."""
    if len(values) != len(metas):
        expected = ", ".join(f"{m.name}: {describe(m)}" for m in metas)
        raise InputError(f"{what} takes {len(metas)} inputs ({expected}), got {len(values)}")
    arrays = []
    symbols: dict[str, int] = {}
    labels = labels or {}
    for meta, value in zip(metas, values):
        array = value if type(value) is np.ndarray else np.asarray(value)
        if array.dtype != meta.dtype:
            if meta.dtype == object and array.dtype.kind == "U":  # string tensors: onnxruntime takes object arrays
                array = array.astype(object)
            else:
                raise InputError(f"{what}: input {meta.name!r} expects dtype {meta.dtype}, got {array.dtype} "
                                 f"(expected {describe(meta)}, got {array.dtype}{list(array.shape)})"
                                 + (sequence_hint(value, meta.dtype) if meta.dtype != object else ""))
        if array.ndim and array.shape[0] == 0 and meta.shape and not isinstance(meta.shape[0], int):
            raise InputError(f"{what}: input {meta.name!r} holds no examples (shape {list(array.shape)}); a step "
                             "needs a batch of at least one")
        if meta.shape is not None:
            if array.ndim != len(meta.shape):
                raise InputError(f"{what}: input {meta.name!r} expects rank {len(meta.shape)} "
                                 f"({describe(meta)}), got shape {list(array.shape)}")
            for axis, (want, got) in enumerate(zip(meta.shape, array.shape)):
                if isinstance(want, int) and want != got:
                    hint = _per_token_hint(array.shape, labels[meta.name], symbols) if meta.name in labels else ""
                    raise InputError(f"{what}: input {meta.name!r} expects shape {describe(meta)}, got "
                                     f"{list(array.shape)} (axis {axis} should be {want}){hint}")
                if isinstance(want, str):
                    if symbols.setdefault(want, got) != got:
                        hint = _per_token_hint(array.shape, labels[meta.name], symbols) if meta.name in labels else ""
                        raise InputError(f"{what}: input {meta.name!r} has {want}={got} on axis {axis}, but an "
                                         f"earlier input has {want}={symbols[want]}{hint}")
        if labels and meta.name in labels:
            _check_labels(meta.name, array, labels[meta.name], what)
        if tables and meta.name in tables:
            _check_indices(meta.name, array, tables[meta.name], what)
        arrays.append(array if array.flags.c_contiguous else np.asarray(array, order="C"))
    if any(isinstance(d, str) and not d.isidentifier() for m in metas for d in m.shape or ()):
        _check_computed_sizes(metas, arrays, symbols, what)
    return arrays


def owned_ortvalue(array: np.ndarray):
    """An OrtValue holding its own copy of ``array`` (``ortvalue_from_numpy`` borrows the numpy memory)."""
    import onnxruntime as ort

    array = np.asarray(array, order="C")  # not ascontiguousarray: it makes a 0-d loss 1-d
    value = ort.OrtValue.ortvalue_from_shape_and_type(array.shape, array.dtype, "cpu")
    value.update_inplace(array)
    return value
