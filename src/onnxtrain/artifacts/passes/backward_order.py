"""BackwardOrder: the backward's nodes run when the backward needs them, in the order the rules emitted them.

onnxruntime orders the nodes itself (a depth-first walk back from the graph's last node), whatever their order
in the graph. Two consequences cost memory in a training step:

- A gradient node that reads only forward values and parameters (a ReLU's mask ``y > 0``, a Conv's flipped
  weights for dX) is ready during the forward, and onnxruntime may compute it there: its output then stays
  alive through the step's peak (the start of the backward, where every kept activation is alive) until the
  backward reaches its reader. On ResNet-18 at batch 8 the masks (51 MB) and flipped weights (45 MB) were.
- The walk starts at the gradient computed last (the first layer's), so it first runs everything that
  gradient needs, the whole chain of activation gradients, and only then the other layers' weight gradients:
  every layer's ``dY`` and input stay alive to the end of the backward instead of being freed layer by layer.

This pass adds data dependencies that onnxruntime cannot reorder: a node waits for a value ``a`` by reading one
of its inputs ``x`` through ``Reshape(x, [0] * rank(x) + 0 * Size(a))`` (the same tensor: a 0 copies the input's
dimension, and onnxruntime's Reshape makes no copy; the shape is shared by every view of that rank waiting for
``a``), or ``Reshape(x, Shape(x) + 0 * Size(a))`` when x's rank is not known, or, if the node is a Reshape itself
(onnxruntime merges a Reshape of a Reshape, dropping the view), by adding ``0 * Size(a)`` to its shape.

Terms: the *chain* is every node downstream of the last forward node (in graph order) that a gradient node
reads (the loss node, or the value a loss's gradient is computed from). A chain node is *main* if two or more
graph outputs depend on it (it carries the gradient on to further layers), a *side* node otherwise (a weight
gradient's branch, the gradient accumulation). Gradient nodes neither in the forward nor in the chain are
*early*.

Cases handled:

1. An early node that reads no other early node's output (a root), whose op does not make its output smaller
   than its input (``SAME_OR_LARGER``: elementwise ops, casts, layout ops, Conv), and that reads a value computed
   at run time: it waits for the chain value of largest index (in graph order) that its first chain reader
   reads. Its early descendants follow it by data dependency.
2. Side values computed before a main node in graph order (the frontier of the side branches emitted so far):
   the main node waits for them, so each layer's weight gradient is computed before the backward moves on.
3. The nodes that write the parameters' gradients (the values the gradient outputs select after a reset,
   ``TrainingMeta.accumulation``) go last, in the reverse of the order the rules made them. After a reset the
   runtime writes each gradient output from its producer (``SpecializeReset``), so these nodes are the graph's
   last nodes, and onnxruntime's walk starts at the one it meets last: the gradient the backward computes first.
   Case 2 never waits for such a value itself (reading it would make the runtime copy it to its output); a
   Reshape writing it is looked through to the product it shows.
4. Left alone: early roots that shrink their input (a reduction, a ``Shape``: delaying them would keep the larger
   input alive longer), a Transpose that only MatMul / Gemm nodes read (onnxruntime folds it into them, but not
   once it reads a view), roots with subgraphs, roots no chain node reads, and graphs whose backward reads no
   forward value.

The nodes are then put back in a topological order that keeps the original order wherever it can.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Set

import numpy as np
import onnx
from onnx import numpy_helper

from onnxtrain.conventions import TrainingMeta
from onnxtrain.errors import ArtifactError
from onnxtrain.ir.pass_infra import Pass, PassResult
from onnxtrain.ir.passes import (
    NodeIndex,
    clone_without,
    fresh_name,
    has_subgraphs,
    node_index,
    reader_index,
)
from onnxtrain.ir.types import TensorInfo

__all__ = ["BackwardOrder"]

SAME_OR_LARGER = frozenset({
    "Abs", "Neg", "Sign", "Not", "Relu", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Reciprocal", "Erf", "Cast",
    "CastLike", "Add", "Sub", "Mul", "Div", "Pow", "Greater", "Less", "Equal", "GreaterOrEqual", "LessOrEqual",
    "And", "Or", "Xor", "Where", "Clip", "Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose",
    "Expand", "Tile", "Pad", "Concat", "OneHot", "Conv", "ConvTranspose"})
VIEWS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"})
SUFFIX = "/waits"


class BackwardOrder(Pass):
    """Make onnxruntime run the backward's nodes when the backward needs them (cases in the module's
    docstring)."""

    def __init__(self, loss: str | None = None, infos: Mapping[str, TensorInfo] | None = None):
        self.loss = loss  # None: the graph's first output
        # types and shapes of the forward's values (generate_artifacts'): a view of a value of known rank needs
        # no Shape node
        self.infos = infos

    def call(self, model: onnx.ModelProto) -> PassResult:
        graph = model.graph
        index = node_index(model)
        nodes, producer, reads = index.nodes, index.producer, index.reads
        forward = index.ancestors(self.loss or graph.output[0].name)
        read_by_backward = [producer[x] for k in range(len(nodes)) if k not in forward
                            for x in reads[k] if producer.get(x) in forward]
        if not read_by_backward:
            return PassResult(model, False)
        start = max(read_by_backward)
        chain = _downstream(nodes, reads, start, forward)
        early = {k for k in range(len(nodes)) if k not in forward and k not in chain}
        constants = _constant_names(graph)
        waits: dict[int, list[str]] = {}   # node -> the values it waits for
        readers = reader_index(reads)

        for k in sorted(early):  # case 1
            node = nodes[k]
            if (node.domain not in ("", "ai.onnx") or node.op_type not in SAME_OR_LARGER or has_subgraphs(node)
                    or any(producer.get(x) in early for x in node.input)
                    or not any(x and x not in constants for x in node.input)
                    or _folded_into_matmul(nodes, k, readers)):
                continue
            reader = _first_chain_reader(nodes, readers, k, early, chain)
            if reader is not None:
                late = [x for x in reads[reader] if producer.get(x) in chain or producer.get(x) == start]
                if late:
                    waits.setdefault(k, []).append(max(late, key=lambda x: producer[x]))

        main = _main_nodes(nodes, reads, chain, {o.name for o in graph.output})
        side = chain - main
        fresh = _fresh_gradients(model)
        frontier: dict[str, None] = {}  # case 2: side values not read yet by a later side node
        for k in sorted(chain):
            if k in main:
                if frontier:
                    waits.setdefault(k, []).extend(frontier)
                    frontier = {}
                continue
            for x in nodes[k].input:
                frontier.pop(x, None)
            computed = (_computed(nodes, producer, side, o) for o in nodes[k].output if o)
            frontier.update(dict.fromkeys(x for x in computed if x not in fresh))
        waits = {k: v for k, v in waits.items() if any(x and x not in constants for x in nodes[k].input)}
        # case 3: the nodes that write the gradients last, in the reverse of the order the rules made them
        writers = sorted({producer[g] for g in fresh if producer.get(g) in side})
        last = {k: 2 * len(nodes) - k for k in writers}
        if not waits and not writers:
            return PassResult(model, False)
        return PassResult(_with_waits(model, waits, constants, last, index, self.infos or {}), True)


def _with_waits(model: onnx.ModelProto, waits: dict[int, list[str]], constants: set[str], keys: dict[int, int],
                index: NodeIndex, infos: Mapping[str, TensorInfo]) -> onnx.ModelProto:
    """A copy of ``model`` in which node k cannot run before the values ``waits[k]`` exist, in a topological order
    that keeps the original one (or ``keys[k]`` instead of node k's position) wherever it can; ``index`` is
    ``model``'s, ``infos`` give the rank of some values."""
    nodes, producer = index.nodes, index.producer
    out = clone_without(model, "node")  # the nodes are copied once, into their new order
    graph = out.graph
    # every name in the graph (as used_names): a node input is a node's output, a graph input or an initializer
    taken = {*producer, *(n.name for n in nodes), *(v.name for v in graph.input), *(v.name for v in graph.output),
             *(v.name for v in graph.value_info), *(i.name for i in graph.initializer)}
    taken.discard("")
    zero = fresh_name("backward_order/zero", taken)
    graph.initializer.append(numpy_helper.from_array(np.array(0, np.int64), zero))
    # the new nodes as (op_type, inputs, output): they are made in the graph itself, in their final order (a
    # standalone NodeProto costs as much again to copy into the graph and to free)
    added: list[tuple[int, str, list[str], str]] = []
    nothing: dict[str, str] = {}  # value -> 0 * Size(value), built once per value
    zeros: dict[int, str] = {}  # rank -> the int64 initializer [0] * rank
    same_dims: dict[tuple[str, int], str] = {}  # (value, rank) -> [0] * rank, computed after value

    def emit(k: int, op_type: str, inputs: list[str], output: str) -> None:
        added.append((k, op_type, inputs, output))

    def zero_after(k: int, value: str) -> str:
        if value not in nothing:
            size, product = fresh_name(value + "/size", taken), fresh_name(value + "/size_times_zero", taken)
            emit(k, "Size", [value], size)
            emit(k, "Mul", [size, zero], product)
            nothing[value] = product
        return nothing[value]

    def same_dims_after(k: int, value: str, rank: int) -> str:
        """A shape that keeps every dimension of a tensor of ``rank`` (Reshape copies a 0 from its input)."""
        if rank not in zeros:
            zeros[rank] = fresh_name(f"backward_order/zeros_{rank}", taken)
            graph.initializer.append(numpy_helper.from_array(np.zeros(rank, np.int64), zeros[rank]))
        if (value, rank) not in same_dims:
            shape = fresh_name(f"{value}/same_dims_after", taken)
            emit(k, "Add", [zeros[rank], zero_after(k, value)], shape)
            same_dims[(value, rank)] = shape
        return same_dims[(value, rank)]

    def rank(x: str) -> int | None:
        info = infos.get(x)
        return info.rank if info is not None else None

    reads = list(index.reads)
    rewired: dict[int, tuple[int, str]] = {}  # node -> (the input it reads through a view, that view)
    for k, values in waits.items():
        node = nodes[k]
        name = node.name or node.output[0]
        if node.op_type == "Reshape":
            j, total = 1, node.input[1]
            for value in values:
                after = fresh_name(f"{name}{SUFFIX}_after", taken)
                emit(k, "Add", [total, zero_after(k, value)], after)
                total = after
        else:
            # a view of an input: Reshape(x, [0] * rank) if x's rank is known, else Reshape(x, Shape(x)); the
            # shape is computed after the values waited for
            variable = [j for j, x in enumerate(node.input) if x and x not in constants]
            j = next((j for j in variable if rank(node.input[j]) is not None), variable[0])
            x = node.input[j]
            r = rank(x)
            if r is not None:
                total = same_dims_after(k, values[0], r)
                rest = values[1:]
            else:
                total = fresh_name(f"{name}{SUFFIX}_shape", taken)
                emit(k, "Shape", [x], total)
                rest = values
            for value in rest:
                after = fresh_name(f"{name}{SUFFIX}_after", taken)
                emit(k, "Add", [total, zero_after(k, value)], after)
                total = after
            view = fresh_name(f"{name}{SUFFIX}", taken)
            emit(k, "Reshape", [x, total], view)
            total = view
        rewired[k] = (j, total)
        reads[k] = [total if i == j else y for i, y in enumerate(reads[k])]
    n = len(nodes)
    # a node made for node k sorts right before it (none is a writer that ``keys`` moves)
    order = _stable_topological([keys.get(k, k) for k in range(n)] + [k - 0.5 for k, *_ in added],
                                reads + [inputs for _, _, inputs, _ in added],
                                {**producer, **{a[3]: n + j for j, a in enumerate(added)}})
    out_nodes = graph.node
    for i in order:
        if i >= n:
            _, op_type, inputs, output = added[i - n]
            out_nodes.add(op_type=op_type, input=inputs, output=[output], name=output)
        elif i in rewired:
            copy = out_nodes.add()
            copy.CopyFrom(nodes[i])
            j, view = rewired[i]
            copy.input[j] = view
        else:
            out_nodes.append(nodes[i])
    return out


def _constant_names(graph: onnx.GraphProto) -> set[str]:
    """The initializers and the outputs of Constant nodes holding a number or a tensor (as ``constant_values``)."""
    names = {i.name for i in graph.initializer}
    names.update(n.output[0] for n in graph.node if n.op_type == "Constant"
                 and any(a.name in _CONSTANT_ATTRIBUTES for a in n.attribute))
    return names


_CONSTANT_ATTRIBUTES = frozenset({"value", "value_int", "value_float", "value_ints", "value_floats"})


def _folded_into_matmul(nodes: list[onnx.NodeProto], k: int, readers: dict[str, list[int]]) -> bool:
    """Whether node k is a Transpose that only MatMul or Gemm nodes read: onnxruntime folds it into them (no
    tensor is made), unless the Transpose reads a view."""
    node = nodes[k]
    return node.op_type == "Transpose" and all(nodes[r].op_type in ("MatMul", "Gemm")
                                               for r in readers.get(node.output[0], []))


def _fresh_gradients(model: onnx.ModelProto) -> set[str]:
    """The gradients the training graph's outputs select after a reset (empty without the training metadata)."""
    try:
        meta = TrainingMeta.from_model(model)
    except ArtifactError:
        return set()
    return {fresh for fresh, _ in meta.accumulation.values()}


def _computed(nodes: list[onnx.NodeProto], producer: dict[str, int], side: set[int], value: str) -> str:
    """The value a view (a Reshape...) of ``value`` shows, if a side node made it: waiting for that one does not
    read the gradient itself, which the runtime then writes straight into its output (SpecializeReset)."""
    node = nodes[producer[value]]
    while node.op_type in VIEWS and node.input and producer.get(node.input[0]) in side:
        value, node = node.input[0], nodes[producer[node.input[0]]]
    return value


def _downstream(nodes: list[onnx.NodeProto], reads: list[list[str]], start: int, forward: Set[int]) -> set[int]:
    """The non-forward nodes that read an output of node ``start``, directly or through other such nodes."""
    values = {o for o in nodes[start].output if o}
    found: set[int] = set()
    for k in range(start + 1, len(nodes)):
        if k not in forward and values.intersection(reads[k]):
            found.add(k)
            values.update(o for o in nodes[k].output if o)
    return found


def _main_nodes(nodes: list[onnx.NodeProto], reads: list[list[str]], chain: set[int], outputs: set[str]) -> set[int]:
    """The chain nodes that two or more graph outputs depend on. Only chain nodes read chain values (a forward
    node that did would make its producer part of the forward), so the walk visits the chain alone."""
    reaches: dict[str, int] = {}  # value -> bit set of the graph outputs that depend on it
    bits = {o: 1 << i for i, o in enumerate(sorted(outputs))}
    main = set()
    for k in sorted(chain, reverse=True):
        mask = 0
        for o in nodes[k].output:
            mask |= reaches.get(o, 0) | bits.get(o, 0)
        if mask & (mask - 1):
            main.add(k)
        for x in reads[k]:
            reaches[x] = reaches.get(x, 0) | mask
    return main


def _first_chain_reader(nodes: list[onnx.NodeProto], readers: dict[str, list[int]], root: int, early: set[int],
                        chain: set[int]) -> int | None:
    """The chain node, first in graph order, that reads an output of ``root`` or of its early descendants."""
    first, seen, stack = None, {root}, [root]
    while stack:
        for o in nodes[stack.pop()].output:
            for r in readers.get(o, []) if o else []:
                if r in chain:
                    first = r if first is None else min(first, r)
                elif r in early and r not in seen:
                    seen.add(r)
                    stack.append(r)
    return first


def _stable_topological(keys: list[float], reads: list[list[str]], producer: dict[str, int]) -> list[int]:
    """The items (``reads[i]``: the inputs of item i, ``producer``: value -> the item computing it) in the
    topological order that takes the item of smallest key (then position) whenever several are ready."""
    n = len(keys)
    by_key = sorted(range(n), key=keys.__getitem__)  # stable: equal keys keep their positions' order
    rank = [0] * n
    for r, i in enumerate(by_key):
        rank[i] = r
    missing = [0] * n  # inputs (each counted once) whose producer is not placed yet
    readers: list[list[int]] = [[] for _ in range(n)]
    get = producer.get
    for i, xs in enumerate(reads):
        for x in (xs if len(xs) < 2 else dict.fromkeys(xs)):
            p = get(x)
            if p is not None:
                readers[p].append(i)
                missing[i] += 1
    ready = [rank[i] for i in range(n) if not missing[i]]  # the heap holds ranks: int comparisons only
    heapq.heapify(ready)
    ordered = []
    pop, push = heapq.heappop, heapq.heappush
    while ready:
        i = by_key[pop(ready)]
        ordered.append(i)
        for r in readers[i]:
            missing[r] -= 1
            if not missing[r]:
                push(ready, rank[r])
    if len(ordered) != n:
        raise ValueError(f"{n - len(ordered)} nodes are in a cycle after adding the backward's waits")
    return ordered
