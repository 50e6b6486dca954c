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
from onnxtrain.ir.types import TensorInfo, infer_tensor_info

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


def value_info(name: str, info: TensorInfo | None) -> onnx.ValueInfoProto:
    if info is None:
        return helper.make_tensor_value_info(name, onnx.TensorProto.UNDEFINED, None)
    return helper.make_tensor_value_info(name, info.elem_type, info.shape)


# Ops cheap and deterministic enough to evaluate while building the graph (shape arithmetic).
_FOLDABLE = {"Add", "Sub", "Mul", "Div", "Neg", "Mod", "Abs", "Ceil", "Floor", "Sqrt", "Cast", "CastLike",
             "Concat", "Split", "Gather", "Slice", "Squeeze", "Unsqueeze", "Reshape", "Expand", "Transpose",
             "Identity", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or", "Where",
             "Max", "Min", "Range", "ReduceProd", "ReduceSum", "ConstantOfShape", "Constant", "Shape", "Size"}


def fold_constants(nodes: Sequence[onnx.NodeProto], known: Mapping[str, TensorInfo], opset: int,
                   constants: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Values of ``nodes`` computable now: Shape/Size of statically shaped values and shape arithmetic on
    constants. Function bodies compute split sizes and the like that way, and shape inference needs them."""

    values = dict(constants)
    folded: dict[str, np.ndarray] = {}
    for n in nodes:
        if n.op_type in ("Shape", "Size") and n.input[0] in known and known[n.input[0]].static_shape is not None:
            shape = np.asarray(known[n.input[0]].static_shape, dtype=np.int64)
            attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
            value = (shape[attrs.get("start", 0):attrs.get("end")] if n.op_type == "Shape"
                     else np.asarray(np.prod(shape), dtype=np.int64))
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
    graph = helper.make_graph(list(nodes), "subgraph", inputs, [], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return infer_tensor_info(model)
