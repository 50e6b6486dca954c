"""Small graph passes over lists of ONNX nodes."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TypeVar

import numpy as np
import onnx
from google.protobuf.message import Message
from onnx import helper, numpy_helper

__all__ = ["declare_as_inputs", "prune_nodes", "drop_unread_initializers", "constant_values", "used_names",
           "implicit_inputs", "node_inputs", "has_subgraphs", "ancestors", "producer_index", "reader_index",
           "fresh_name", "rename_values", "default_opset", "portable_ir_version", "clone", "clone_without",
           "NodeIndex", "node_index", "shared_node_indices", "share_derived_index"]

M = TypeVar("M", bound=Message)


# The standard ops with graph attributes; nodes of other domains are inspected attribute by attribute.
_SUBGRAPH_OPS = frozenset({"If", "Loop", "Scan", "SequenceMap"})


def has_subgraphs(node: onnx.NodeProto) -> bool:
    if node.domain in ("", "ai.onnx") and node.op_type not in _SUBGRAPH_OPS:
        return False
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)


def implicit_inputs(node: onnx.NodeProto) -> list[str]:
    """Outer-scope values the node's subgraphs (If/Loop/Scan bodies) read, in first-use order."""
    captured: list[str] = []
    if not has_subgraphs(node):
        return captured
    for attr in node.attribute:
        for g in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
            defined = {v.name for v in g.input} | {i.name for i in g.initializer}
            for n in g.node:
                for x in [*n.input, *implicit_inputs(n)]:
                    if x and x not in defined and x not in captured:
                        captured.append(x)
                defined.update(n.output)
    return captured


def node_inputs(node: onnx.NodeProto) -> list[str]:
    """The node's inputs followed by its implicit inputs: a rule returns one gradient for each."""
    if not has_subgraphs(node):  # nearly every node: called for each node by every graph walk
        return list(node.input)
    return [*node.input, *implicit_inputs(node)]


def prune_nodes(nodes: Sequence[onnx.NodeProto], outputs: Iterable[str]) -> list[onnx.NodeProto]:
    """Keep only the nodes some of ``outputs`` depend on (order preserved)."""
    needed = set(outputs)
    needed.discard("")  # an omitted optional output is not a value
    kept = []
    for node in reversed(nodes):
        if not needed.isdisjoint(node.output):
            kept.append(node)
            needed.update(node_inputs(node))
            needed.discard("")
    kept.reverse()
    return kept


def drop_unread_initializers(graph: onnx.GraphProto) -> None:
    """Remove, in place, the initializers of ``graph`` that no node (subgraphs included) reads and no graph output
    names: a pass that removed nodes leaves their constants behind, and onnxruntime warns about each."""
    read = {x for node in graph.node for x in node_inputs(node)} | {o.name for o in graph.output}
    if all(i.name in read for i in graph.initializer):
        return
    kept = [i for i in graph.initializer if i.name in read]
    del graph.initializer[:]
    graph.initializer.extend(kept)


def constant_values(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    """Values of the graph's small constants: initializers and Constant nodes holding a tensor."""
    values = {init.name: numpy_helper.to_array(init) for init in graph.initializer
              if not init.external_data and np.prod(init.dims) <= 4096}
    for node in graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    values[node.output[0]] = numpy_helper.to_array(attr.t)
                elif attr.name in ("value_int", "value_float"):
                    values[node.output[0]] = np.asarray(onnx.helper.get_attribute_value(attr))
                elif attr.name in ("value_ints", "value_floats"):
                    values[node.output[0]] = np.asarray(onnx.helper.get_attribute_value(attr))
    return values


def used_names(graph: onnx.GraphProto) -> set[str]:
    """Every value name the graph mentions."""
    names = {v.name for v in [*graph.input, *graph.output, *graph.value_info]}
    names.update(i.name for i in graph.initializer)
    for node in graph.node:
        names.update(node.input)
        names.update(node.output)
        names.add(node.name)
    names.discard("")
    return names


def producer_index(nodes: Iterable[onnx.NodeProto]) -> dict[str, int]:
    """Value name -> the index of the node that computes it."""
    return {o: k for k, n in enumerate(nodes) for o in n.output if o}


def reader_index(reads: Iterable[Iterable[str]]) -> dict[str, list[int]]:
    """Value name -> the indices of the nodes that read it, each node once, in order; ``reads`` gives each node's
    inputs (``map(node_inputs, nodes)``, or lists already at hand)."""
    readers: dict[str, list[int]] = {}
    for k, xs in enumerate(reads):
        for x in dict.fromkeys(xs):
            readers.setdefault(x, []).append(k)
    return readers


def ancestors(nodes: Sequence[onnx.NodeProto], values: Iterable[str],
              producer: Mapping[str, int] | None = None) -> set[int]:
    """Indices of the nodes ``values`` are computed from, their producers included (through every input a node
    reads, its subgraphs' too). ``producer`` (value -> index of its node) can be given when it is at hand."""
    nodes = nodes if isinstance(nodes, list) else list(nodes)  # indexing a protobuf container costs more
    if producer is None:
        producer = producer_index(nodes)
    seen: set[int] = set()
    stack = list(values)
    while stack:
        k = producer.get(stack.pop())  # None for a graph input, an initializer or "" (an omitted input)
        if k is not None and k not in seen:
            seen.add(k)
            stack.extend(node_inputs(nodes[k]))
    return seen


def fresh_name(name: str, taken: set[str]) -> str:
    """``name``, or ``name_1``, ``name_2``, ... : the first not in ``taken``, which it is then added to."""
    k, candidate = 0, name
    while candidate in taken:
        k += 1
        candidate = f"{name}_{k}"
    taken.add(candidate)
    return candidate


def rename_values(nodes: Iterable[onnx.NodeProto], rename: Mapping[str, str]) -> None:
    """Rename values in the inputs and outputs of ``nodes``, in place."""
    for node in nodes:
        for field in (node.input, node.output):
            if not rename.keys().isdisjoint(field):
                for k, x in enumerate(field):
                    if x in rename:
                        field[k] = rename[x]


def declare_as_inputs(model: onnx.ModelProto, values: Mapping[str, np.ndarray]) -> list[str]:
    """Declare each of ``values`` the graph does not declare yet as a graph input of its type and shape (no
    data is copied), in place; returns the names added. The checker and shape inference then run on a graph
    whose initializers live outside it (the generator's source model)."""
    declared = {i.name for i in model.graph.input}
    added = [n for n in values if n not in declared]
    model.graph.input.extend(onnx.helper.make_tensor_value_info(
        n, onnx.helper.np_dtype_to_tensor_dtype(values[n].dtype), values[n].shape) for n in added)
    return added


def default_opset(model: onnx.ModelProto) -> int | None:
    """The version of the default (ai.onnx) opset the model imports, or None."""
    return next((op.version for op in model.opset_import if op.domain in ("", "ai.onnx")), None)


def portable_ir_version(opset_imports: Iterable[onnx.OperatorSetIdProto]) -> int:
    """The IR version an artifact declares: the lowest its opset imports allow, and at least 8. The writing onnx
    package's default (``helper.make_model``'s: IR 14 with onnx 1.23) would make an onnxruntime that runs
    the source model refuse its artifacts (onnxruntime 1.17 reads IR 9 at most)."""
    default = [helper.make_opsetid("", op.version) for op in opset_imports if op.domain in ("", "ai.onnx")]
    try:
        return max(8, helper.find_min_ir_version_for(default))
    except ValueError:  # an opset newer than the onnx package knows: its newest IR version, the best it can tell
        return onnx.IR_VERSION


def clone(message: M) -> M:
    """A deep copy of a protobuf message (model, graph, node, tensor...)."""
    out = type(message)()
    out.CopyFrom(message)
    return out


def clone_without(model: onnx.ModelProto, graph_field: str) -> onnx.ModelProto:
    """A copy of ``model`` whose graph lacks the repeated field ``graph_field`` (``"node"``, ``"initializer"``):
    for a caller that refills it, a copy of everything else alone."""
    out = onnx.ModelProto()
    for field, value in model.ListFields():
        if field.name != "graph":
            _set_field(out, field, value)
    for field, value in model.graph.ListFields():
        if field.name != graph_field:
            _set_field(out.graph, field, value)
    return out


def _is_repeated(field) -> bool:
    """Whether a protobuf field is repeated: ``is_repeated`` (protobuf 7 removed ``label``), else ``label``."""
    repeated = getattr(field, "is_repeated", None)
    return repeated if repeated is not None else field.label == field.LABEL_REPEATED


def _set_field(message: Message, field, value) -> None:
    if _is_repeated(field):
        getattr(message, field.name).extend(value)
    elif field.message_type is not None:
        getattr(message, field.name).CopyFrom(value)
    else:
        setattr(message, field.name, value)


class NodeIndex:
    """A model's nodes with what every graph walk of a pass needs: each node's inputs (``node_inputs``), the
    producer of each value and, memoized, the ancestors of a value. Reading a protobuf node's fields costs
    microseconds each, so passes that only read a model share one index (:func:`node_index`)."""

    def __init__(self, model: onnx.ModelProto):
        self.nodes: list[onnx.NodeProto] = list(model.graph.node)
        self.reads: list[list[str]] = []
        self.implicit: dict[int, list[str]] = {}  # node index -> the outer values its subgraphs read
        for k, n in enumerate(self.nodes):
            if has_subgraphs(n):
                self.implicit[k] = implicit_inputs(n)
                self.reads.append([*n.input, *self.implicit[k]])
            else:
                self.reads.append(list(n.input))
        self.producer: dict[str, int] = producer_index(self.nodes)
        self._ancestors: dict[str, frozenset[int]] = {}

    def ancestors(self, value: str) -> frozenset[int]:
        """The indices of the nodes ``value`` is computed from, its producer included (as :func:`ancestors`)."""
        if value not in self._ancestors:
            reads, producer = self.reads, self.producer
            seen: set[int] = set()
            stack = [value]
            while stack:
                k = producer.get(stack.pop())
                if k is not None and k not in seen:
                    seen.add(k)
                    stack.extend(reads[k])
            self._ancestors[value] = frozenset(seen)
        return self._ancestors[value]


class _Scopes(threading.local):
    """The open :func:`shared_node_indices` blocks of a thread, innermost last (two threads generating artifacts
    at once do not share them)."""

    def __init__(self) -> None:
        self.stack: list[dict[int, tuple[onnx.ModelProto, NodeIndex]]] = []


_scopes = _Scopes()


def node_index(model: onnx.ModelProto) -> NodeIndex:
    """The :class:`NodeIndex` of ``model``: inside :func:`shared_node_indices`, computed once per model object."""
    if not _scopes.stack:
        return NodeIndex(model)
    entry = _scopes.stack[-1].get(id(model))
    if entry is None or entry[0] is not model:
        entry = _scopes.stack[-1][id(model)] = (model, NodeIndex(model))
    return entry[1]


def share_derived_index(model: onnx.ModelProto, base: NodeIndex, inserted_after: Mapping[int, int],
                        changed: Iterable[int]) -> None:
    """Inside :func:`shared_node_indices`, give ``model`` the index derived from ``base`` (the index of the model
    ``model`` was made from) instead of one built from scratch: ``model`` is that model with ``inserted_after[k]``
    new nodes right after its node k and its nodes ``changed`` (old positions) edited; every other node is the
    same. Only the new and edited nodes are read."""
    if not _scopes.stack:
        return
    nodes = list(model.graph.node)
    position, shift = [], 0
    for k in range(len(base.nodes)):
        position.append(k + shift)
        shift += inserted_after.get(k, 0)
    if len(nodes) != len(base.nodes) + shift:
        raise ValueError(f"{len(nodes)} nodes, expected {len(base.nodes)} + {shift} inserted")
    index = NodeIndex.__new__(NodeIndex)
    index.nodes, index._ancestors = nodes, {}
    reads: list[list[str] | None] = [None] * len(nodes)
    for k, xs in enumerate(base.reads):
        reads[position[k]] = xs
    index.implicit = {position[k]: xs for k, xs in base.implicit.items()}
    index.producer = {v: position[k] for v, k in base.producer.items()}
    fresh = [position[k] for k in changed]
    for k in changed:
        for o in base.nodes[k].output:
            if o and index.producer.get(o) == position[k]:
                del index.producer[o]
    fresh += [i for i, xs in enumerate(reads) if xs is None]
    for i in fresh:
        node = nodes[i]
        index.implicit.pop(i, None)
        if has_subgraphs(node):
            index.implicit[i] = implicit_inputs(node)
            reads[i] = [*node.input, *index.implicit[i]]
        else:
            reads[i] = list(node.input)
        for o in node.output:
            if o:
                index.producer[o] = i
    index.reads = reads  # type: ignore[assignment]
    _scopes.stack[-1][id(model)] = (model, index)


@contextlib.contextmanager
def shared_node_indices() -> Iterator[None]:
    """Within this block, :func:`node_index` computes each model's index once (the models must not change in
    place meanwhile: passes return new models, as :class:`~onnxtrain.ir.pass_infra.PassManager` runs them)."""
    _scopes.stack.append({})
    try:
        yield
    finally:
        _scopes.stack.pop()
