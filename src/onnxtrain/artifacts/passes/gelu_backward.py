"""GeluBackward: the erf GELU's backward multiplies its incoming gradient by the GELU's derivative, computed from
its input in one short chain, instead of differentiating the GELU's five nodes one by one.

torch exports the erf GELU as ``u = x / sqrt(2)``, ``e = erf(u)``, ``f = e + 1``, ``g = x * f`` and ``y = g * 0.5``.
The autodiff's gradient of ``x`` is ``dg * f + (dg * x) * erf'(u) / sqrt(2)``: about ten full-size passes (with
RecomputeInBackward's copies of ``u``, ``e`` and ``f``), four of whose temporaries are alive together with the
incoming gradient at the start of the last layer's backward, a BERT step's memory peak (docs/lora.md). Here the
backward computes ``D = dg/dx = 1 + erf(a) + a (2 / sqrt(pi)) e^(-a^2)``, ``a = x / sqrt(2)``, in 8 passes with
at most three temporaries, then ``dx = dg * D``.

onnxruntime orders the nodes itself, and would compute ``D`` (which reads forward values only) right after the
forward, beside every kept activation. So ``D`` reads ``x`` through a view that waits for the backward value the
incoming gradient is computed from (``b`` in ``dY = b W^T``, ``dg = dY * 0.5``), and that product reads ``b``
through a view that waits for ``D``: the incoming gradient is not alive while ``D`` is computed, and ``x`` is free
once it is. The copy reads ``x`` through ``Mul(x, 1 / sqrt 2)``, never the forward's intermediates, so
onnxruntime still fuses the forward's five nodes into one Gelu kernel.

Cases handled: a forward chain ``u = Div(x, sqrt 2)`` (or ``Mul(x, 1 / sqrt 2)``), ``e = Erf(u)``,
``f = Add(e, 1)`` and ``g = Mul(x, f)`` (either operand order, constants within 1e-6) in which ``x`` has no other
reader in the forward and ``u``, ``e``, ``f`` none outside the chain, none of them a graph output, and whose
backward computes ``dg`` and sums the gradient of ``x`` in one ``Add`` of ``Mul(dg, f)`` and a term computed
from ``dg`` and the chain's values only (as the autodiff builds it). Anything else, a GELU of another form
included, is left alone. Without a product ``dY = MatMul(b, ...)`` before ``dg``, ``D`` waits for ``dg`` instead.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnxtrain.artifacts.passes.recompute import forward_nodes
from onnxtrain.ir.pass_infra import Pass, PassResult
from onnxtrain.ir.passes import (
    clone,
    constant_values,
    drop_unread_initializers,
    fresh_name,
    node_inputs,
    producer_index,
    prune_nodes,
    reader_index,
    used_names,
)

__all__ = ["GeluBackward"]

SUFFIX = "/gelu_derivative"  # the nodes computing D


class GeluBackward(Pass):
    """Replace each erf GELU's backward by ``dg * D`` (cases in the module's docstring)."""

    def __init__(self, loss: str | None = None):
        self.loss = loss  # None: the graph's first output

    def call(self, model: onnx.ModelProto) -> PassResult:
        graph = model.graph
        if not any(n.op_type == "Erf" for n in graph.node):  # no erf GELU (most CNNs): skip the graph walks
            return PassResult(model, False)
        forward = forward_nodes(graph.node, self.loss or graph.output[0].name)
        constants = {k: v for k, v in constant_values(graph).items() if v.size == 1}
        readers = reader_index(map(node_inputs, graph.node))
        producer = producer_index(graph.node)
        outputs = {o.name for o in graph.output}

        rewrites = []  # (x, dtype, index of the backward's Add, dg)
        for k, node in enumerate(graph.node):
            if k in forward and node.op_type == "Erf":
                found = _match(graph.node, k, forward, constants, readers, producer, outputs)
                if found is not None:
                    rewrites.append(found)
        if not rewrites:
            return PassResult(model, False)

        out = clone(model)
        taken = used_names(out.graph)
        after: dict[int, list[onnx.NodeProto]] = {}
        for x, dtype, add_index, dg in rewrites:  # the views' order: see the module's docstring
            before, incoming = _before_incoming(out.graph.node, dg, forward, producer, constants)
            view, nodes = _after(x, before, taken)
            derivative = _derivative(out.graph, view, dtype, taken, nodes)
            if incoming is not None:
                node = out.graph.node[incoming]
                wait, more = _after(before, derivative, taken)
                nodes.extend(more)
                node.input[:] = [wait if i == before else i for i in node.input]
            after.setdefault(producer[before], []).extend(nodes)
            add = out.graph.node[add_index]
            mul = helper.make_node("Mul", [dg, derivative], [add.output[0]], name=fresh_name(add.name + SUFFIX, taken))
            add.CopyFrom(mul)
        nodes = []
        for k, node in enumerate(out.graph.node):
            nodes.append(node)
            nodes.extend(after.get(k, []))
        nodes = prune_nodes(nodes, [o.name for o in out.graph.output])  # the old backward of each chain
        del out.graph.node[:]
        out.graph.node.extend(nodes)
        drop_unread_initializers(out.graph)  # the old backward's constants
        return PassResult(out, True)


def _match(nodes, erf_index: int, forward: set[int], constants: dict[str, np.ndarray],
           readers: dict[str, list[int]], producer: dict[str, int], outputs: set[str]):
    """The rewrite of the chain around the Erf node ``nodes[erf_index]``, or None when it is not one of the
    handled cases."""
    erf = nodes[erf_index]
    u, e = erf.input[0], erf.output[0]
    if u not in producer or producer[u] not in forward:
        return None
    scale = nodes[producer[u]]
    x = _other(scale, constants, {"Div": math.sqrt(2), "Mul": 1 / math.sqrt(2)})
    f_node = _only_forward_reader(e, nodes, forward, readers)
    if x is None or f_node is None or _other(nodes[f_node], constants, {"Add": 1.0}) != e:
        return None
    f = nodes[f_node].output[0]
    g_node = _only_forward_reader(f, nodes, forward, readers)
    if g_node is None or nodes[g_node].op_type != "Mul" or sorted(nodes[g_node].input) != sorted([x, f]) or x == f:
        return None
    chain = {producer[u], erf_index, f_node, g_node}
    if {k for k in readers.get(x, []) if k in forward} != {producer[u], g_node}:
        return None  # x's gradient has other terms
    if any(v in outputs for v in (x, u, e, f)) or any(
            k in forward and k not in chain for v in (u, e) for k in readers.get(v, [])):
        return None
    # the backward: dx1 = Mul(dg, f), read by one Add whose other term comes from dg and the chain only
    f_readers = [k for k in readers.get(f, []) if k not in forward]
    if len(f_readers) != 1 or nodes[f_readers[0]].op_type != "Mul" or len(nodes[f_readers[0]].input) != 2:
        return None
    dx1 = nodes[f_readers[0]]
    dg = dx1.input[1] if dx1.input[0] == f else dx1.input[0]
    if dg in (x, u, e, f) or dg not in producer or producer[dg] in forward or len(readers.get(dx1.output[0], [])) != 1:
        return None  # dg must be computed by the backward: the views order the derivative after its producer
    add_index = readers[dx1.output[0]][0]
    add = nodes[add_index]
    if add.op_type != "Add" or len(add.input) != 2 or add_index in forward:
        return None
    other = add.input[1] if add.input[0] == dx1.output[0] else add.input[0]
    if not _computed_from(other, nodes, forward, producer, {dg, x, u, e, f}, constants):
        return None
    dtype = next(v.dtype for v in (constants.get(i) for i in scale.input) if v is not None)
    return x, dtype, add_index, dg


def _other(node: onnx.NodeProto, constants: dict[str, np.ndarray], ops: dict[str, float]) -> str | None:
    """The variable input of a binary ``node`` whose other input is the constant ``ops[op_type]`` (the divisor of
    a Div), or None."""
    if node.op_type not in ops or len(node.input) != 2 or len(node.output) != 1:
        return None
    want = ops[node.op_type]
    a, b = node.input
    for variable, constant in ((a, b), (b, a)) if node.op_type != "Div" else ((a, b),):
        value = constants.get(constant)
        if value is not None and variable not in constants and abs(float(value.reshape(-1)[0]) - want) < 1e-6:
            return variable
    return None


def _only_forward_reader(value: str, nodes, forward: set[int], readers: dict[str, list[int]]) -> int | None:
    forward_readers = [k for k in readers.get(value, []) if k in forward]
    return forward_readers[0] if len(forward_readers) == 1 else None


def _computed_from(value: str, nodes, forward: set[int], producer: dict[str, int], allowed: set[str],
                   constants: dict[str, np.ndarray]) -> bool:
    """Whether the backward computes ``value`` from ``allowed`` values and constants only."""
    stack, seen = [value], set()
    while stack:
        v = stack.pop()
        if v in allowed or v in constants or v in seen:
            continue
        seen.add(v)
        k = producer.get(v)
        if k is None or k in forward:
            return False
        stack.extend(i for i in node_inputs(nodes[k]) if i)
    return True


def _before_incoming(nodes, dg: str, forward: set[int], producer: dict[str, int],
                     constants: dict[str, np.ndarray]) -> tuple[str, int | None]:
    """The backward value ``b`` the GELU's incoming gradient is computed from (``dY = MatMul(b, W^T)``,
    ``dg = dY * 0.5``) and the index of the node reading it, or ``dg`` and None when there is none."""
    incoming = dg
    node = nodes[producer[dg]]
    if node.op_type == "Mul" and len(node.input) == 2 and sum(i in constants for i in node.input) == 1:
        incoming = next(i for i in node.input if i not in constants)
    if incoming not in producer:
        return dg, None
    for i in nodes[producer[incoming]].input:
        if i in producer and producer[i] not in forward:
            return i, producer[incoming]
    return dg, None


def _after(x: str, before: str, taken: set[str]) -> tuple[str, list[onnx.NodeProto]]:
    """``x`` through a Reshape to its own shape plus ``0 * Size(before)``: no copy, but it waits for ``before``."""
    base = x + "/wait"
    nodes: list[onnx.NodeProto] = []

    def op(op_type: str, *inputs: str) -> str:
        name = fresh_name(f"{base}/{op_type}", taken)
        nodes.append(helper.make_node(op_type, list(inputs), [name], name=name))
        return name

    zero = fresh_name(f"{base}/zero", taken)
    nodes.append(helper.make_node("Constant", [], [zero], name=zero, value=numpy_helper.from_array(
        np.array(0, np.int64))))
    return op("Reshape", x, op("Add", op("Shape", x), op("Mul", op("Size", before), zero))), nodes


def _derivative(graph: onnx.GraphProto, x: str, dtype: np.dtype, taken: set[str], nodes: list) -> str:
    """Append to ``nodes`` the computation of d(x (1 + erf(a)))/dx = 1 + erf(a) + x sqrt(2 / pi) e^(-a^2),
    ``a = x / sqrt(2)``; return its name."""
    base = x + SUFFIX

    def const(name: str, value: float) -> str:
        name = fresh_name(f"{base}/{name}", taken)
        graph.initializer.append(numpy_helper.from_array(np.array(value, dtype=dtype), name))
        return name

    def op(op_type: str, *inputs: str) -> str:
        name = fresh_name(f"{base}/{op_type}", taken)
        nodes.append(helper.make_node(op_type, list(inputs), [name], name=name))
        return name

    # x sqrt(2 / pi) e^(-a^2) = a (2 / sqrt(pi)) e^(-a^2) = a e^(ln(2 / sqrt(pi)) - a^2): the constant inside the
    # exponent spares a pass
    a = op("Mul", x, const("rsqrt2", 1 / math.sqrt(2)))
    gauss = op("Exp", op("Sub", const("log_2_over_sqrt_pi", math.log(2 / math.sqrt(math.pi))), op("Mul", a, a)))
    # two Adds, not one Sum of three: onnxruntime's Sum of more than two inputs allocates a full-size temporary
    return op("Add", op("Add", op("Erf", a), const("one", 1.0)), op("Mul", a, gauss))
