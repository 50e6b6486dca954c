"""GeluDerivativeInForward: the erf GELU's backward reads its derivative, computed in the forward, instead of its
input and of the intermediates it would recompute from it.

torch exports the erf GELU as ``u = x / sqrt(2)``, ``e = erf(u)``, ``f = e + 1``, ``g = x * f`` and ``y = g * 0.5``.
The autodiff differentiates the five nodes one by one: the gradient of ``x`` is ``dg * f + (dg * x) * erf'(u) /
sqrt(2)``, about ten full-size passes in the backward, four of whose temporaries are alive at once at the start of
the last layer's backward, a BERT step's memory peak (docs/lora.md). The derivative depends on ``x`` only:
``dg/dx = f + x sqrt(2 / pi) e^(-x^2 / 2)``. So the forward computes it, ``D``, from ``x`` (7 passes, while the
forward's own values are fewer than at the backward's start), the backward keeps ``D`` instead of ``x`` (the same
size) and the gradient is one ``Mul(dg, D)``.

Cases handled: a forward chain ``u = Div(x, sqrt 2)`` (or ``Mul(x, 1 / sqrt 2)``), ``e = Erf(u)``,
``f = Add(e, 1)`` and ``g = Mul(x, f)`` (either operand order, constants within 1e-6) in which ``x`` has no other
reader in the forward, ``u``, ``e`` and ``f`` none outside the chain and its backward, and whose backward sums
the gradient of ``x`` in one ``Add`` of ``Mul(dg, f)`` and a term computed from ``dg`` and the chain's values
only (as the autodiff builds it). Anything else, a GELU of another form included, is left alone.

The copy of the derivative reads ``x`` through ``Mul(x, 1 / sqrt 2)`` and never the forward's intermediates, so
onnxruntime still fuses the forward's five nodes into one Gelu kernel (its fusion needs the intermediates to have
no other reader) and its common-subexpression elimination finds nothing to merge.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnxtrain.ir.pass_infra import Pass, PassResult
from onnxtrain.ir.passes import clone, constant_values, fresh_name, node_inputs, prune_nodes, used_names

__all__ = ["GeluDerivativeInForward"]

SUFFIX = "/gelu_derivative"


class GeluDerivativeInForward(Pass):
    """Replace each erf GELU's backward by ``dg * D`` with ``D`` computed in the forward (cases in the module's
    docstring)."""

    def __init__(self, loss: str | None = None):
        self.loss = loss  # None: the graph's first output

    def call(self, model: onnx.ModelProto) -> PassResult:
        from onnxtrain.artifacts.passes.recompute import forward_nodes

        graph = model.graph
        forward = forward_nodes(graph.node, self.loss or graph.output[0].name)
        constants = {k: v for k, v in constant_values(graph).items() if v.size == 1}
        readers: dict[str, list[int]] = {}
        for k, n in enumerate(graph.node):
            for x in set(node_inputs(n)):
                readers.setdefault(x, []).append(k)
        producer = {o: k for k, n in enumerate(graph.node) for o in n.output if o}
        outputs = {o.name for o in graph.output}

        rewrites = []  # (index of u's node, of g's node, x, dtype, index of the backward's Add, dg)
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
        for scale_index, g_index, x, dtype, add_index, dg in rewrites:
            derivative, nodes = _derivative(out.graph, x, dtype, taken)
            # the forward's GELU reads x through a view that waits for D: onnxruntime, which orders the nodes
            # itself, would otherwise compute D only when the backward reads it, keeping x alive to the
            # backward's start (the step's memory peak), or after the GELU, beside its output
            view = _after(x, derivative, nodes, taken)
            for k in (scale_index, g_index):
                node = out.graph.node[k]
                node.input[:] = [view if i == x else i for i in node.input]
            after.setdefault(producer.get(x, -1), []).extend(nodes)  # right after x: a graph input's before all
            add = out.graph.node[add_index]
            mul = helper.make_node("Mul", [dg, derivative], [add.output[0]], name=fresh_name(add.name + SUFFIX, taken))
            add.CopyFrom(mul)
        nodes = list(after.get(-1, []))
        for k, node in enumerate(out.graph.node):
            nodes.append(node)
            nodes.extend(after.get(k, []))
        nodes = prune_nodes(nodes, [o.name for o in out.graph.output])  # the old backward of each chain
        del out.graph.node[:]
        out.graph.node.extend(nodes)
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
    if dg in (x, u, e, f) or len(readers.get(dx1.output[0], [])) != 1:
        return None
    add_index = readers[dx1.output[0]][0]
    add = nodes[add_index]
    if add.op_type != "Add" or len(add.input) != 2 or add_index in forward:
        return None
    other = add.input[1] if add.input[0] == dx1.output[0] else add.input[0]
    if not _computed_from(other, nodes, forward, producer, {dg, x, u, e, f}, constants):
        return None
    dtype = next(v.dtype for v in (constants.get(i) for i in scale.input) if v is not None)
    return producer[u], g_node, x, dtype, add_index, dg


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


def _after(y: str, derivative: str, nodes: list, taken: set[str]) -> str:
    """``y`` through a Reshape to its own shape plus ``0 * Size(derivative)``: no copy, but its readers wait for
    the derivative."""
    base = derivative + "/wait"

    def op(op_type: str, *inputs: str) -> str:
        name = fresh_name(f"{base}/{op_type}", taken)
        nodes.append(helper.make_node(op_type, list(inputs), [name], name=name))
        return name

    zero = fresh_name(f"{base}/zero", taken)
    nodes.append(helper.make_node("Constant", [], [zero], name=zero, value=numpy_helper.from_array(
        np.array(0, np.int64))))
    return op("Reshape", y, op("Add", op("Shape", y), op("Mul", op("Size", derivative), zero)))


def _derivative(graph: onnx.GraphProto, x: str, dtype: np.dtype, taken: set[str]) -> tuple[str, list]:
    """Nodes computing ``1 + erf(a) + x sqrt(2 / pi) e^(-a^2)``, ``a = x / sqrt(2)``: d(x (1 + erf(a)))/dx."""
    base = x + SUFFIX

    def const(name: str, value: float) -> str:
        name = fresh_name(f"{base}/{name}", taken)
        graph.initializer.append(numpy_helper.from_array(np.array(value, dtype=dtype), name))
        return name

    nodes: list[onnx.NodeProto] = []

    def op(op_type: str, *inputs: str) -> str:
        name = fresh_name(f"{base}/{op_type}", taken)
        nodes.append(helper.make_node(op_type, list(inputs), [name], name=name))
        return name

    # d(x (1 + erf(a)))/dx = 1 + erf(a) + x sqrt(2 / pi) e^(-a^2) = 1 + erf(a) + a (2 / sqrt(pi)) e^(-a^2), with
    # the constant inside the exponent (one pass less); from a alone, so that x is free once the forward's GELU
    # has read it
    a = op("Mul", x, const("rsqrt2", 1 / math.sqrt(2)))
    gauss = op("Exp", op("Sub", const("log_2_over_sqrt_pi", math.log(2 / math.sqrt(math.pi))), op("Mul", a, a)))
    return op("Sum", op("Erf", a), op("Mul", a, gauss), const("one", 1.0)), nodes
