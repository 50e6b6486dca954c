"""Rewrite the ``ai.onnx.ml`` ops of linear scikit-learn models as default-domain ops, so that they train.

skl2onnx converts a LogisticRegression, LinearRegression or SGD model to ``LinearClassifier`` /
``LinearRegressor``, whose weights are node attributes, and a StandardScaler to ``Scaler``; a classifier's
probabilities pass through ``Normalizer``. Written as Gemm, Softmax/Sigmoid, Sub/Mul and ReduceSum, with the
weights as initializers ``<node>.coefficients`` ([classes or targets, features], scikit-learn's ``coef_``
layout) and ``<node>.intercepts``, they are ordinary parameters. The Scaler's offset and scale stay constants.
The semantics are those of the ONNX-ML specification (and onnxruntime): a binary classifier given one row of
coefficients scores ``[-s, s]``. Options with no default-domain equivalent here (``post_transform``
SOFTMAX_ZERO or PROBIT, Normalizer MAX) leave the node as it is.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import helper

from onnxtrain.artifacts.lowering import NodeEmitter
from onnxtrain.ir.passes import default_opset, fresh_name, used_names

__all__ = ["lower_ml_ops"]

ML = "ai.onnx.ml"
_POST = {"NONE": None, "LOGISTIC": "Sigmoid", "SOFTMAX": "Softmax"}


class _Emit(NodeEmitter):
    """The nodes and initializers that replace one node."""

    def __init__(self, node: onnx.NodeProto, taken: set[str], opset: int, softmax_outputs: set[str]):
        super().__init__(node, taken, opset)
        self.softmax_outputs = softmax_outputs  # values that sum to one along axis 1
        self.weights: dict[str, np.ndarray] = {}

    def weight(self, value: np.ndarray, suffix: str) -> str:
        name = fresh_name(f"{self.prefix}.{suffix}", self.taken)
        self.taken.add(name)
        self.weights[name] = value
        return name


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _linear(e: _Emit, x: str, a: dict, rows: int) -> str:
    coefficients = np.asarray(a["coefficients"], np.float32)
    w = e.weight(coefficients.reshape(rows, coefficients.size // rows), "coefficients")
    inputs = [x, w]
    if a.get("intercepts"):
        inputs.append(e.weight(np.asarray(a["intercepts"], np.float32), "intercepts"))
    return e.op("Gemm", *inputs, transB=1)


def _linear_classifier(e: _Emit, node: onnx.NodeProto) -> bool:
    a = _attrs(node)
    post = _text(a.get("post_transform", "NONE"))
    labels = a.get("classlabels_ints") or [_text(s) for s in a.get("classlabels_strings", [])]
    if post not in _POST or not labels or "coefficients" not in a:
        return False
    # The row count is the intercepts' (without them a binary classifier's one row or two is ambiguous).
    rows = len(a.get("intercepts") or []) or (len(labels) if len(labels) > 2 else 0)
    if not rows:
        return False
    scores = _linear(e, node.input[0], a, rows)
    if rows == 1 and len(labels) == 2:  # one row of coefficients for two classes: scores [-s, s]
        scores = e.op("Concat", e.op("Neg", scores), scores, axis=1)
    out = node.output[1] if len(node.output) > 1 and node.output[1] else None
    if _POST[post] == "Softmax":
        scores = e.op("Softmax", scores, out=out, axis=1)
        e.softmax_outputs.add(scores)
    elif _POST[post] == "Sigmoid":
        scores = e.op("Sigmoid", scores, out=out)
    elif out:
        e.op("Identity", scores, out=out)
    if node.output[0]:
        table = np.array(labels, dtype=np.int64 if isinstance(labels[0], int) else object)
        index = e.op("ArgMax", scores, axis=1, keepdims=0)
        e.op("Gather", e.const(table, "classlabels"), index, out=node.output[0], axis=0)
    return True


def _linear_regressor(e: _Emit, node: onnx.NodeProto) -> bool:
    a = _attrs(node)
    if _text(a.get("post_transform", "NONE")) != "NONE" or "coefficients" not in a:
        return False
    e.op("Identity", _linear(e, node.input[0], a, int(a.get("targets", 1))), out=node.output[0])
    return True


def _scaler(e: _Emit, node: onnx.NodeProto) -> bool:
    a = _attrs(node)
    x = e.op("Cast", node.input[0], to=onnx.TensorProto.FLOAT)
    if a.get("offset"):
        x = e.op("Sub", x, e.const(np.asarray(a["offset"], np.float32), "offset"))
    scale = e.const(np.asarray(a.get("scale") or [1.0], np.float32), "scale")
    e.op("Mul", x, scale, out=node.output[0])
    return True


def _normalizer(e: _Emit, node: onnx.NodeProto) -> bool:
    norm = _text(_attrs(node).get("norm", "MAX"))
    if norm == "L1" and node.input[0] in e.softmax_outputs:  # skl2onnx's multinomial LogisticRegression
        e.op("Identity", node.input[0], out=node.output[0])   # (a loss then sees that these are probabilities)
        e.softmax_outputs.add(node.output[0])
        return True
    x = e.op("Cast", node.input[0], to=onnx.TensorProto.FLOAT)
    if norm == "L1":
        total = e.reduce("ReduceSum", e.op("Abs", x), [1])
    elif norm == "L2":
        total = e.op("Sqrt", e.reduce("ReduceSum", e.op("Mul", x, x), [1]))
    else:
        return False
    e.op("Div", x, total, out=node.output[0])
    return True


_LOWERINGS: dict[str, Callable[[_Emit, onnx.NodeProto], bool]] = {
    "LinearClassifier": _linear_classifier, "LinearRegressor": _linear_regressor, "Scaler": _scaler,
    "Normalizer": _normalizer,
}


def lower_ml_ops(model: onnx.ModelProto, weights: dict[str, np.ndarray]) -> list[str]:
    """Replace, in place, the ``ai.onnx.ml`` nodes above by default-domain nodes (new weights go into
    ``weights``); returns the op types replaced."""
    graph = model.graph
    if not any(n.domain == ML and n.op_type in _LOWERINGS for n in graph.node):
        return []
    taken = used_names(graph) | set(weights)
    opset = default_opset(model) or 13
    nodes, lowered, softmax_outputs = [], [], set()
    for node in graph.node:
        emit = _Emit(node, taken, opset, softmax_outputs)
        if node.domain == ML and node.op_type in _LOWERINGS and _LOWERINGS[node.op_type](emit, node):
            nodes += emit.nodes
            weights.update(emit.weights)
            lowered.append(node.op_type)
        else:
            nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    return lowered
