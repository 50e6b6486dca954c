"""Constant folding and shape inference over a list of nodes.

Exporters compute axes, shapes and scales with small subgraphs (a Concat of Constants, a Shape sliced and
multiplied): folding them at build time lets rules read the values, and lets shape inference, given them,
find the static shapes rules need.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnxtrain.ir.passes import node_inputs
from onnxtrain.ir.symbolic import without_fresh
from onnxtrain.ir.types import TensorInfo, infer_tensor_info, value_info

__all__ = ["fold_constants", "free_values", "infer_infos", "value_info"]


def free_values(nodes: Sequence[onnx.NodeProto], defined: Iterable[str] = ()) -> list[str]:
    """Values ``nodes`` read but do not produce (inputs of the small graph), in first-use order."""
    produced, free = set(defined), []
    for n in nodes:
        for x in node_inputs(n):
            if x and x not in produced and x not in free:
                free.append(x)
        produced.update(n.output)
    return free



# Ops cheap and deterministic enough to evaluate while building the graph (shape arithmetic).
_FOLDABLE = {"Add", "Sub", "Mul", "Div", "Neg", "Mod", "Abs", "Ceil", "Floor", "Sqrt", "Cast", "CastLike",
             "Concat", "Split", "Gather", "Slice", "Squeeze", "Unsqueeze", "Reshape", "Expand", "Transpose",
             "Identity", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or", "Where",
             "Max", "Min", "Range", "ReduceProd", "ReduceSum", "ConstantOfShape", "Constant", "Shape", "Size"}


def fold_constants(nodes: Sequence[onnx.NodeProto], known: Mapping[str, TensorInfo], opset: int,
                   constants: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Values of ``nodes`` computable now: Shape/Size of statically shaped values, shape arithmetic on
    constants, and the static entries of a partly symbolic shape (``Gather(Shape(x), 2)`` is 56 when x is
    (batch, 32, 56, 56)). Function bodies compute split sizes that way, and shape inference needs them."""

    values = dict(constants)
    partial: dict[str, list[int | None]] = {}     # 1-D int64 shape vectors with some entries unknown
    folded: dict[str, np.ndarray] = {}
    for n in nodes:
        if n.op_type in ("Shape", "Size") and n.input[0] in known and known[n.input[0]].static_shape is not None:
            shape = np.asarray(known[n.input[0]].static_shape, dtype=np.int64)
            attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
            value = (shape[attrs.get("start", 0):attrs.get("end")] if n.op_type == "Shape"
                     else np.asarray(np.prod(shape), dtype=np.int64))
        elif n.op_type in _PARTIAL and (any(x in partial for x in n.input)
                                        or (n.op_type == "Shape" and n.input[0] in known)):
            value = _fold_partial(n, known, values, partial)
            if value is None:
                continue
        elif n.op_type in _FOLDABLE and all(x in values for x in n.input if x) and all(n.output):
            if sum(np.asarray(values[x]).size for x in n.input if x) > 4096 or n.output[0] in values:
                continue
            graph = helper.make_graph([n], "fold", [], [helper.make_tensor_value_info(o, 0, None) for o in n.output],
                                      initializer=[numpy_helper.from_array(np.asarray(values[x]), x)
                                                   for x in dict.fromkeys(n.input) if x])
            model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
            model.ir_version = 10
            from onnx.reference import ReferenceEvaluator  # imported on first use: ~10 ms

            try:
                results = [np.asarray(v) for v in ReferenceEvaluator(model).run(None, {})]
            except Exception:  # noqa: BLE001 - folding is only an aid to shape inference
                continue
            for o, v in zip(n.output, results):
                values[o] = folded[o] = v
            continue
        else:
            continue
        values[n.output[0]] = folded[n.output[0]] = value
    return folded


# Ops that carry a partly known shape vector along (Concat and Cast of one, Gather and Slice out of one).
_PARTIAL = {"Shape", "Gather", "Slice", "Concat", "Cast", "Identity"}


def _fold_partial(n: onnx.NodeProto, known: Mapping[str, TensorInfo], values: Mapping[str, np.ndarray],
                  partial: dict[str, list[int | None]]) -> np.ndarray | None:
    """The value of ``n`` if it picks only known entries of a partly known shape vector; otherwise None, after
    recording in ``partial`` what is known of its output."""
    attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
    entries: list[int | None] | None = None
    if n.op_type == "Shape":
        shape = known[n.input[0]].shape
        if shape is None:
            return None
        entries = [d if isinstance(d, int) else None for d in shape][attrs.get("start", 0):attrs.get("end")]
    elif n.op_type in ("Cast", "Identity"):
        if attrs.get("to", onnx.TensorProto.INT64) not in (onnx.TensorProto.INT64, onnx.TensorProto.INT32):
            return None
        entries = partial[n.input[0]]
    elif n.op_type == "Gather" and attrs.get("axis", 0) == 0 and n.input[1] in values:
        index = np.asarray(values[n.input[1]])
        source = partial[n.input[0]]
        picked = [source[int(i)] for i in index.reshape(-1)]
        if all(d is not None for d in picked):
            return np.asarray(picked, dtype=np.int64).reshape(index.shape)
        entries = picked if index.ndim == 1 else None
    elif n.op_type == "Slice" and all(x in values for x in n.input[1:] if x):
        starts, ends = (np.asarray(values[x]).reshape(-1) for x in n.input[1:3])
        steps = np.asarray(values[n.input[4]]).reshape(-1) if len(n.input) > 4 and n.input[4] else [1]
        axes = np.asarray(values[n.input[3]]).reshape(-1) if len(n.input) > 3 and n.input[3] else [0]
        if len(starts) != 1 or int(axes[0]) not in (0, -1):
            return None
        end = int(ends[0]) if int(ends[0]) < 2**62 else None
        entries = partial[n.input[0]][int(starts[0]):end:int(steps[0])]
    elif n.op_type == "Concat" and all(x in partial or x in values for x in n.input):
        entries = []
        for x in n.input:
            entries += partial[x] if x in partial else [int(v) for v in np.asarray(values[x]).reshape(-1)]
    if entries is None:
        return None
    if all(d is not None for d in entries):
        return np.asarray(entries, dtype=np.int64)
    partial[n.output[0]] = entries
    return None


def infer_infos(nodes: Sequence[onnx.NodeProto], known: Mapping[str, TensorInfo], opset: int,
                constants: Mapping[str, np.ndarray] | None = None) -> dict[str, TensorInfo]:
    """Types and shapes of the values of ``nodes``, given those of the values they read (``known``).

    Shape inference and constant folding (:func:`fold_constants`) alternate until neither learns more:
    folded values enter shape inference as initializers, and inferred static shapes fold Shape nodes.
    """
    constants = dict(constants or {})
    folded: dict[str, np.ndarray] = {}
    infos: dict[str, TensorInfo] = {}
    for _ in range(4):
        infos = _infer_once(nodes, known, opset, {**constants, **folded})
        more = fold_constants(nodes, {**known, **infos}, opset, {**constants, **folded})
        if not more.keys() - folded.keys():
            break
        folded.update(more)
    mentioned = {x for n in nodes for x in [*n.input, *n.output]}
    for name, value in {**constants, **folded}.items():   # constants whose readers were all folded too
        if name in folded or (name in mentioned and name not in infos):
            value = np.asarray(value)
            infos[name] = TensorInfo(helper.np_dtype_to_tensor_dtype(value.dtype), tuple(value.shape))
    return infos


def _infer_once(nodes: Sequence[onnx.NodeProto], known: Mapping[str, TensorInfo], opset: int,
                constants: Mapping[str, np.ndarray]) -> dict[str, TensorInfo]:
    nodes = [n for n in nodes if not all(o in constants for o in n.output if o)]   # folded: now initializers
    inputs, inits = [], []
    for name in free_values(nodes):
        if name in constants:
            inits.append(numpy_helper.from_array(np.asarray(constants[name]), name))
        elif name in known:
            inputs.append(value_info(name, known[name]))
    # what is known of the nodes' outputs (sizes solved from the inputs' symbols) is declared, so inference starts
    # from it; a folded constant's static size still overrides a declared symbol, and inference's own symbols
    # (unk__N) are left out, since a declared symbol would override the one inference finds
    declared = [value_info(o, without_fresh(known[o])) for n in nodes for o in n.output
                if o in known and o not in constants and known[o].shape is not None]
    graph = helper.make_graph(list(nodes), "subgraph", inputs, [], initializer=inits, value_info=declared)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return infer_tensor_info(model)
