"""UpdateInBackward: each chunk of the parameters is updated as soon as the backward has its gradient.

The training graph fused with a chunked optimizer graph (FuseOptimizer) still writes every gradient before the
optimizer runs: the gradient vector, one copy of the parameters, is alive through the whole backward. Bound in
place, with the gradients left as intermediates, each chunk's update can run as soon as the backward has
produced that chunk's gradient and nothing else will read its parameters; onnxruntime then frees the gradient,
and no gradient vector exists (docs/memory.md: BERT-base's peak 2,140 -> 1,855 MiB).

    backward ... dW_L --> chunk update (params#i, exp_avg#i, ... written over their inputs) --> ... dW_1 --> ...

Three things make it safe and make it save memory:

- **No read after the write.** The parameters a chunk covers are the training graph's inputs (bound to the same
  memory as ``params#i``), read in the forward and in the backward (a linear layer's input gradient reads its
  weight, and the weight's gradient does not depend on it). The chunk's gradient waits for every reader of
  those parameters that it does not already depend on: ``Reshape(g, [0] + 0 * Size(reader's output))``, the
  same tensor (as artifacts/passes/backward_order.py). A reader is followed through views (onnxruntime's
  Reshape, Squeeze, ... share their input's memory) and Transposes (onnxruntime folds one into the MatMul that
  reads it; the wait goes on the MatMul). Every node of the chunk's update waits for the waited gradient
  (its state inputs are read through the same kind of view), so none runs early and keeps a temporary alive.
- **A step that must not happen does not.** Each chunk's update is the ``then`` branch of an ``If`` on
  ``finite_i``, which says that the loss and the chunk's gradient are finite (their sum minus itself is 0); the
  ``else`` branch keeps the values (an ``Identity`` onto the same memory), so a NaN loss changes nothing.
  (``Where(finite_i, new, old)`` on each output did the same with three more passes over the chunk: about 105 ms
  of a 750 ms bert_small step.) ``finite#i`` is an output: a chunk whose gradient alone is not finite keeps its
  values while the others are updated, and the runtime says which.
- **Order.** onnxruntime orders the nodes by a depth-first walk back from the graph's last leaf, so the
  chunks' gates come last, in chunk order, and the walk starts at the last chunk: the parameters of the
  model's last layers, whose gradients the backward computes first.

Postcondition (checked): for every chunk, every reader of the memory its outputs overwrite (the chunk's inputs
and the training parameters it covers, through views) is an ancestor of its gate or the gate itself. Cases
refused with a PassError: an optimizer that combines the chunks (global-norm gradient clipping needs every
gradient before any update), an output not written by a node.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnxtrain import conventions as names
from onnxtrain.errors import PassError
from onnxtrain.ir.pass_infra import Pass, PassResult
from onnxtrain.ir.passes import clone, node_inputs, producer_index, reader_index
from onnxtrain.runtime.passes.chunk_update import chunk_name, chunk_slots
from onnxtrain.runtime.passes.fuse_optimizer import FusedNames

__all__ = ["UpdateInBackward", "finite_name"]

# ops whose output onnxruntime may place in its input's memory (a reader of the output reads the input)
_VIEWS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout"})
# a copy, but onnxruntime folds it into the MatMul / Gemm reading it: wait on those, not on the Transpose
_FOLLOWED = _VIEWS | {"Transpose"}


def finite_name(fused: FusedNames, i: int) -> str:
    """The fused graph's output saying whether chunk ``i`` was updated (its gradient and the loss finite)."""
    return fused(chunk_name(names.GRADIENTS_FINITE, i))


class UpdateInBackward(Pass):
    """Rewrite a training graph fused with a chunked optimizer graph to update each chunk in place as soon as
    its gradient exists (cases in the module's docstring).

    Args:
        fused: the optimizer's names in the fused graph.
        trainable, sizes: the trainable parameters in flat-vector order and their element counts.
        bounds: the chunks' (start, stop).
        vectors: the optimizer's flat vectors updated in place (``params`` and the state names).
        loss: the training graph's loss output.
    """

    def __init__(self, fused: FusedNames, trainable: Sequence[str], sizes: Sequence[int],
                 bounds: Sequence[tuple[int, int]], vectors: Sequence[str], loss: str):
        self.fused, self.trainable, self.sizes = fused, list(trainable), list(sizes)
        self.bounds, self.vectors, self.loss = list(bounds), list(vectors), loss

    def call(self, model: onnx.ModelProto) -> PassResult:
        g, fused = model.graph, self.fused
        nodes = list(g.node)
        gradients = [fused(chunk_name(names.GRADIENTS, i)) for i in range(len(self.bounds))]
        combined = [node for node in nodes if node.name.endswith("/combine") and node.name.startswith(fused.prefix)]
        if combined:
            raise PassError(f"the optimizer combines every chunk ({combined[0].op_type} node {combined[0].name!r}, "
                            "global-norm clipping for one): no parameter can be updated before the backward ends")
        producer = producer_index(nodes)
        for grad in gradients:
            if grad not in producer:
                raise PassError(f"the fused graph does not compute the chunk gradient {grad!r}")
        readers = reader_index(node_inputs(node) for node in nodes)
        owners = self._chunk_nodes(nodes, producer, gradients)
        parameter_readers = {p: _memory_readers(p, nodes, readers) for p in self.trainable}
        below = _AncestorSets(nodes, producer, set().union(*parameter_readers.values()))
        params = fused(chunk_name(names.PARAMS, 0))
        build = _Builder(fused, next(i.type.tensor_type.elem_type for i in g.input if i.name == params))
        loss = build.node("Cast", [self.loss], "in_backward/loss", to=build.elem_type)
        outputs = [o for o in g.output if o.name not in set(gradients)]
        for i, covered in enumerate(self._covered()):
            computed_from = producer[gradients[i]]
            late = sorted({r for p in covered for r in parameter_readers[p] if not below.has(computed_from, r)})
            gradient = build.waiting(gradients[i], [nodes[r].output[0] for r in late], f"in_backward/{gradients[i]}")
            # the chunk's state inputs, read through views that wait for the gradient
            views = {gradients[i]: gradient}
            for v in self.vectors:
                x = fused(chunk_name(v, i))
                views[x] = build.waiting(x, [gradient], f"in_backward/{x}")
            total = build.node("ReduceSum", [gradient], f"in_backward/sum{i}", keepdims=0)
            total = build.node("Add", [total, loss], f"in_backward/sum{i}/loss")
            difference = build.node("Sub", [total, total], f"in_backward/sum{i}/diff")  # 0 unless NaN or inf
            flag = build.node("Equal", [difference, build.zero], finite_name(fused, i), prefixed=False)
            outputs.append(helper.make_tensor_value_info(flag, onnx.TensorProto.BOOL, []))
            build.nodes.append(self._gate(i, [nodes[k] for k in owners[i]], producer, owners[i], views, flag,
                                          build.elem_type))
        # training nodes first, then per chunk: its waits and its gated update (the leaves, in chunk order)
        in_chunks = {k for ks in owners for k in ks}
        result = clone(model)
        del result.graph.node[:]
        result.graph.node.extend([nodes[k] for k in range(len(nodes)) if k not in in_chunks] + build.nodes)
        result.graph.initializer.extend(build.initializers)
        del result.graph.output[:]
        result.graph.output.extend(outputs)
        self._check(result)
        return PassResult(result, True)

    def _covered(self) -> list[list[str]]:
        """The trainable parameters each chunk overlaps."""
        return [[self.trainable[k] for k in slots] for slots in chunk_slots(self.sizes, self.bounds)]

    def _gate(self, i: int, update: list[onnx.NodeProto], producer: dict[str, int], owned: list[int],
              views: dict[str, str], flag: str, elem_type: int) -> onnx.NodeProto:
        """``If(flag)``: then chunk ``i``'s update nodes (reading its inputs through ``views``), else its inputs
        as they are; its outputs are the chunk's outputs (bound to its inputs' memory)."""
        gated = [self.fused(chunk_name(names.output_name(v), i)) for v in self.vectors]
        for out in gated:
            if producer.get(out) not in owned:
                raise PassError(f"the chunk output {out!r} is not written by the chunk's update")
        renamed = {out: f"{out}/new" for out in gated}
        body = []
        for node in update:
            node = clone(node)
            for j, x in enumerate(node.input):  # the new values are read before the gate writes them
                node.input[j] = views.get(x) or renamed.get(x) or x
            for j, x in enumerate(node.output):
                node.output[j] = renamed.get(x, x)
            body.append(node)
        kept = [helper.make_node("Identity", [views[self.fused(chunk_name(v, i))]], [f"{out}/kept"],
                                 name=f"{out}/kept") for v, out in zip(self.vectors, gated)]
        size = self.bounds[i][1] - self.bounds[i][0]
        new_values, kept_values = ([helper.make_tensor_value_info(f"{out}/{suffix}", elem_type, [size])
                                    for out in gated] for suffix in ("new", "kept"))
        base = self.fused(f"in_backward/chunk{i}")
        return helper.make_node("If", [flag], gated, name=base + "/gate",
                                then_branch=helper.make_graph(body, base + "/update", [], new_values),
                                else_branch=helper.make_graph(kept, base + "/keep", [], kept_values))

    def _chunk_nodes(self, nodes: list[onnx.NodeProto], producer: dict[str, int],
                     gradients: list[str]) -> list[list[int]]:
        """Indices of each chunk's update nodes: the optimizer's nodes that read a value of that chunk (its
        inputs, its gradient, or a value another of its nodes computed), in graph order."""
        chunk_of: dict[str, int] = {}
        for i in range(len(self.bounds)):
            chunk_of[gradients[i]] = i
            for v in self.vectors:
                chunk_of[self.fused(chunk_name(v, i))] = i
        owners: list[list[int]] = [[] for _ in self.bounds]
        first = min(producer[grad] for grad in gradients)
        for k in range(first, len(nodes)):
            node = nodes[k]
            if not node.name.startswith(self.fused.prefix) or any(o in chunk_of for o in node.output):
                continue  # the chunk gradients' own Slice / Concat (training side of the wait)
            chunks = {chunk_of[x] for x in node.input if x in chunk_of}
            if len(chunks) > 1:
                raise PassError(f"the optimizer's node {node.name!r} reads several chunks")
            if chunks:
                (i,) = chunks
                owners[i].append(k)
                chunk_of.update((o, i) for o in node.output if o)
        return owners

    def _check(self, model: onnx.ModelProto) -> None:
        """The postcondition: every reader of overwritten memory runs before the write."""
        nodes = list(model.graph.node)
        producer = producer_index(nodes)
        readers = reader_index(node_inputs(node) for node in nodes)
        chunks = range(len(self.bounds))
        aliased = [*self.trainable, *(self.fused(chunk_name(v, i)) for v in self.vectors for i in chunks)]
        memory_readers = {m: _memory_readers(m, nodes, readers, terminal=False) for m in aliased}
        below = _AncestorSets(nodes, producer, set().union(*memory_readers.values()))
        for i, covered in enumerate(self._covered()):
            for v in self.vectors:
                x, out = self.fused(chunk_name(v, i)), self.fused(chunk_name(names.output_name(v), i))
                memory = [x, *covered] if v == names.PARAMS else [x]
                writer = producer[out]
                for m in memory:
                    late = [r for r in memory_readers[m] if r != writer and not below.has(writer, r)]
                    if late:
                        node = nodes[late[0]]
                        raise PassError(f"{node.op_type} node {node.name or node.output[0]!r} reads {m!r} but "
                                        f"does not feed {out!r}: it could run after {m!r} is overwritten in place")


def _memory_readers(value: str, nodes: list[onnx.NodeProto], readers: dict[str, list[int]],
                    terminal: bool = True) -> set[int]:
    """The nodes that read ``value``'s memory: its readers, and through views and Transposes theirs. With
    ``terminal``, only the readers that are neither views nor Transposes (the ones to wait for); without, the
    Transposes too (they copy it)."""
    found: set[int] = set()
    stack, seen = [value], {value}
    while stack:
        v = stack.pop()
        for r in readers.get(v, []):
            node = nodes[r]
            if node.op_type in _FOLLOWED and node.input[0] == v:
                if node.output[0] not in seen:
                    seen.add(node.output[0])
                    stack.append(node.output[0])
                if terminal or node.op_type in _VIEWS:
                    continue
            found.add(r)
    return found


class _AncestorSets:
    """Which of the ``tracked`` nodes each node of a topologically sorted graph is computed from: a bit set per
    node over the tracked nodes only (a few per parameter), so its size does not grow with the graph's square."""

    def __init__(self, nodes: list[onnx.NodeProto], producer: dict[str, int], tracked: set[int]):
        self._bit = {k: j for j, k in enumerate(sorted(tracked))}
        self._sets: list[int] = []
        for k, node in enumerate(nodes):
            bits = 1 << self._bit[k] if k in self._bit else 0
            for x in node_inputs(node):
                j = producer.get(x)
                if j is not None and j < k:
                    bits |= self._sets[j]
            self._sets.append(bits)

    def has(self, node: int, ancestor: int) -> bool:
        """Whether tracked node ``ancestor`` is ``node`` or one of the nodes it is computed from."""
        return bool(self._sets[node] >> self._bit[ancestor] & 1)


class _Builder:
    """The nodes and constants the pass adds, named under the fused graph's optimizer prefix."""

    def __init__(self, fused: FusedNames, elem_type: int):
        self.fused, self.elem_type = fused, elem_type
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.zero = self.constant("in_backward/zero", np.zeros((), helper.tensor_dtype_to_np_dtype(elem_type)))
        self._zero_int = self.constant("in_backward/zero_int", np.zeros((), np.int64))
        self._zero_dims = self.constant("in_backward/zero_dims", np.zeros(1, np.int64))
        self._shapes: dict[tuple[str, ...], str] = {}  # the waiting shape for each set of values waited for

    def constant(self, name: str, value: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(value, self.fused(name)))
        return self.fused(name)

    def node(self, op_type: str, inputs: list[str], name: str, prefixed: bool = True, **attributes) -> str:
        """Append a node of one output, named ``name`` (under the prefix if ``prefixed``); returns the output."""
        name = self.fused(name) if prefixed else name
        self.nodes.append(helper.make_node(op_type, inputs, [name], name=name, **attributes))
        return name

    def waiting(self, vector: str, values: list[str], name: str) -> str:
        """``vector`` (1-D) as a view that onnxruntime computes only once ``values`` exist:
        ``Reshape(vector, [0] + 0 * (Size(a) + Size(b) + ...))``; ``vector`` itself when there is nothing to wait
        for."""
        if not values:
            return vector
        key = tuple(values)
        if key not in self._shapes:
            total = ""
            for k, value in enumerate(values):
                size = self.node("Size", [value], f"{name}/size{k}")
                total = self.node("Add", [total, size], f"{name}/sum{k}") if total else size
            zero = self.node("Mul", [total, self._zero_int], f"{name}/zero")
            self._shapes[key] = self.node("Add", [self._zero_dims, zero], f"{name}/shape")
        return self.node("Reshape", [vector, self._shapes[key]], f"{name}/waited")
