"""InPlaceUpdate: an optimizer graph whose outputs may be bound to the same memory as its inputs.

Double-buffered, an update reads ``params`` and writes ``params.out`` elsewhere: two copies of every parameter
and every optimizer state (docs/memory.md). Bound in place, ``params.out#i`` is ``params#i``'s memory. That is
safe when nothing reads an input after its output has been written, which the graph's dependencies decide:
every node that reads ``x`` must be an ancestor of the node that writes ``x.out`` (then any topological order
runs the reads first). An elementwise producer may read the very input it overwrites: element ``k`` of the
output depends on element ``k`` of the input only.

A skipped step must leave the values as they were, and in place there is no spare buffer to throw away. So
each aliased output is gated on the graph's finiteness flag, ``x.out = Where(finite, new, x)``, and the nodes
that compute the flag are moved first: the gradients are reduced, then each chunk's chain runs and writes its
slices (a chunk's temporaries, not a vector's, are alive at any time).

    gradients#0..n --ReduceSum, combine--> finite
    params#i, gradients#i, ... --chunk i's chain--> new#i --Where(finite, new#i, params#i)--> params.out#i

Cases handled: each aliased output produced by a node of the graph (not an input passed through), and every
reader of the aliased input an ancestor of that output. Anything else raises PassError naming the value; the
runtime then keeps its double buffers.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx
from onnx import helper

from onnxtrain.errors import PassError
from onnxtrain.ir.pass_infra import Pass, PassResult
from onnxtrain.ir.passes import clone, used_names

__all__ = ["InPlaceUpdate"]


class InPlaceUpdate(Pass):
    """Make ``(input, output)`` pairs of an update graph safe to bind to the same memory.

    Args:
        pairs: (input name, output name) of each value updated in place.
        finite: the graph's boolean output that says the update is valid; each aliased output keeps its input's
            value when it is False. None: no gate (the caller checks the gradients before the run).
    """

    def __init__(self, pairs: Sequence[tuple[str, str]], finite: str | None):
        self.pairs = list(pairs)
        self.finite = finite

    def call(self, model: onnx.ModelProto) -> PassResult:
        g = model.graph
        producer = {o: k for k, node in enumerate(g.node) for o in node.output if o}
        graph_inputs = {i.name for i in g.input}
        graph_outputs = {o.name for o in g.output}
        for x, out in self.pairs:
            if x not in graph_inputs or out not in graph_outputs:
                raise PassError(f"the update graph has no input {x!r} and output {out!r} to update in place")
            if out not in producer:
                raise PassError(f"the update graph's output {out!r} is not computed by a node")
        if self.finite is not None and self.finite not in producer:
            raise PassError(f"the update graph has no node computing its finiteness flag {self.finite!r}")

        taken = used_names(g)
        nodes = [clone(n) for n in g.node]
        gates: dict[int, list[onnx.NodeProto]] = {}  # producer index -> the Where nodes that follow it
        if self.finite is not None:
            for x, out in self.pairs:
                k = producer[out]
                new = _fresh(f"{out}/new", taken)
                nodes[k].output[list(nodes[k].output).index(out)] = new
                gates.setdefault(k, []).append(helper.make_node("Where", [self.finite, new, x], [out],
                                                                name=_fresh(f"{out}/gate", taken)))
        flag_nodes = _ancestors(nodes, {self.finite}) if self.finite is not None else set()
        ordered = [nodes[k] for k in range(len(nodes)) if k in flag_nodes]
        for k in range(len(nodes)):
            if k not in flag_nodes:
                ordered += [nodes[k], *gates.get(k, [])]
        _check_aliases(ordered, self.pairs)

        result = clone(model)
        del result.graph.node[:]
        result.graph.node.extend(ordered)
        return PassResult(result, True)


def _fresh(name: str, taken: set[str]) -> str:
    candidate, k = name, 0
    while candidate in taken:
        k += 1
        candidate = f"{name}_{k}"
    taken.add(candidate)
    return candidate


def _ancestors(nodes: Sequence[onnx.NodeProto], values: set[str]) -> set[int]:
    """Indices of the nodes ``values`` are computed from (the producers included)."""
    producer = {o: k for k, node in enumerate(nodes) for o in node.output if o}
    found, stack = set(), [producer[v] for v in values if v in producer]
    while stack:
        k = stack.pop()
        if k not in found:
            found.add(k)
            stack.extend(producer[x] for x in nodes[k].input if x in producer)
    return found


def _check_aliases(nodes: Sequence[onnx.NodeProto], pairs: Sequence[tuple[str, str]]) -> None:
    """PassError unless every reader of each aliased input runs before (or is) the writer of its output."""
    for x, out in pairs:
        before = _ancestors(nodes, {out})
        late = [n for k, n in enumerate(nodes) if x in n.input and k not in before]
        if late:
            node = late[0]
            raise PassError(f"{node.op_type} node {node.name or node.output[0]!r} reads {x!r} but does not feed "
                            f"{out!r}: it could run after {x!r} is overwritten in place")
