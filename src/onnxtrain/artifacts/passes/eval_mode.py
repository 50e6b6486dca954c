"""EvalMode: the forward graph in inference mode, for the eval model.

Cases handled:

1. BatchNormalization in training mode: ``training_mode`` set to 0 (normalise with the running statistics) and
   its training-only outputs (the updated running statistics) removed.
2. Dropout: its ``training_mode`` input emptied (inference mode: the identity; the slot stays, as in the
   peer's eval model) and its mask output removed.
3. Stochastic depth (drop path) as a training-mode TorchScript export writes it: no ONNX op, but a product of the
   branch ``x`` with a random mask that keeps a sample with probability ``k``. In eval mode torch returns ``x``
   itself, so the product becomes ``Identity(x)`` (without this the eval and exported inference models dropped
   residual branches at random). Masks recognised: ``Floor(U + k)`` (Hugging Face's ``drop_path``) and
   ``Cast(Less(U, k))`` (``bernoulli_(k)``: timm's ``DropPath``, torchvision's ``StochasticDepth``; the dynamo
   exporter writes ``CastLike`` for both casts), with ``U`` a ``RandomUniform(Like)`` over [0, 1) and ``k`` a
   constant; the product is ``Mul(x, mask)``, ``Mul(x, Div(mask, k))`` or ``Mul(Div(x, k), mask)`` (either
   operand order), and its ``x`` is taken before the division by ``k``. Other random ops are left as they are.
4. Then nodes and initializers that no graph output depends on any more are removed.
"""

from __future__ import annotations

import math

import onnx
from onnx import helper

from onnxtrain.ir.pass_infra import Pass, PassResult
from onnxtrain.ir.passes import clone, constant_values, drop_unread_initializers, prune_nodes

__all__ = ["EvalMode"]

_UNIFORM = frozenset({"RandomUniform", "RandomUniformLike"})


class EvalMode(Pass):
    """Switch training-mode BatchNormalization, Dropout and stochastic depth to inference mode."""

    def call(self, model: onnx.ModelProto) -> PassResult:
        out = clone(model)
        graph = out.graph
        modified = False
        for node in graph.node:
            if node.op_type == "BatchNormalization":
                for a in node.attribute:
                    if a.name == "training_mode" and a.i:
                        a.i = 0
                        modified = True
                modified |= len(node.output) > 1
                del node.output[1:]
            elif node.op_type == "Dropout":
                modified |= (len(node.input) > 2 and bool(node.input[2])) or len(node.output) > 1
                if len(node.input) > 2:
                    node.input[2] = ""
                del node.output[1:]
        for k, x in _drop_paths(graph).items():
            node = graph.node[k]
            node.CopyFrom(helper.make_node("Identity", [x], [node.output[0]], name=node.name))
            modified = True
        if not modified:
            return PassResult(model, False)
        kept = prune_nodes(list(graph.node), [o.name for o in graph.output])
        del graph.node[:]
        graph.node.extend(kept)
        drop_unread_initializers(graph)
        return PassResult(out, True)


def _drop_paths(graph: onnx.GraphProto) -> dict[int, str]:
    """The stochastic-depth products of ``graph`` (case 3): node index -> the value eval mode passes on."""
    nodes = list(graph.node)
    if not any(n.op_type in _UNIFORM for n in nodes):  # no random mask: skip the walks (most models)
        return {}
    producer = {o: nodes[k] for k in range(len(nodes)) for o in nodes[k].output if o}
    constants = {name: value for name, value in constant_values(graph).items() if value.size == 1}

    def made_by(value: str, op_type: str) -> onnx.NodeProto | None:
        node = producer.get(value)
        return node if node is not None and node.op_type == op_type else None

    def scalar(value: str) -> float | None:
        like = made_by(value, "CastLike")  # the dynamo exporter casts the probability like the random values
        if like is not None:
            value = like.input[0]
        return float(constants[value].reshape(-1)[0]) if value in constants else None

    def uniform(value: str) -> bool:
        node = producer.get(value)
        if node is None or node.op_type not in _UNIFORM:
            return False
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        return attrs.get("low", 0.0) == 0.0 and attrs.get("high", 1.0) == 1.0

    def keep_of(mask: str) -> float | None:
        """k when ``mask`` is 1 with probability k (0 < k <= 1) and 0 otherwise."""
        floor, cast = made_by(mask, "Floor"), made_by(mask, "Cast") or made_by(mask, "CastLike")
        keep = None
        if floor is not None and (add := made_by(floor.input[0], "Add")) is not None:
            for u, k in ((add.input[0], add.input[1]), (add.input[1], add.input[0])):
                if uniform(u) and scalar(k) is not None:
                    keep = scalar(k)
        if cast is not None and (less := made_by(cast.input[0], "Less")) is not None:
            if uniform(less.input[0]) and scalar(less.input[1]) is not None:
                keep = scalar(less.input[1])
        return keep if keep is not None and 0.0 < keep <= 1.0 else None

    def divided_by(value: str, keep: float) -> str | None:
        """v when ``value`` is ``Div(v, keep)``."""
        div = made_by(value, "Div")
        if div is not None and scalar(div.input[1]) is not None and math.isclose(scalar(div.input[1]), keep):
            return div.input[0]
        return None

    found = {}
    for k, node in enumerate(nodes):
        if node.op_type != "Mul" or len(node.input) != 2:
            continue
        for x, mask in ((node.input[0], node.input[1]), (node.input[1], node.input[0])):
            keep = keep_of(mask)
            if keep is not None:  # x * mask, or (x / k) * mask
                found[k] = divided_by(x, keep) or x
                break
            div = made_by(mask, "Div")
            keep = keep_of(div.input[0]) if div is not None else None
            if keep is not None and divided_by(mask, keep) is not None:  # x * (mask / k)
                found[k] = x
                break
    return found
