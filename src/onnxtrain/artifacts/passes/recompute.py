"""RecomputeInBackward: the backward recomputes forward values that are cheap to recompute from values it
keeps anyway, instead of keeping them too.

Every forward value that a gradient node reads stays alive from the forward to the backward. Two cases of a
BERT cost the most: the erf GELU ``x * 0.5 * (1 + erf(x / sqrt(2)))``, whose backward reads ``x``,
``x / sqrt(2)`` and ``1 + erf(...)``, three activations of the intermediate size where ``x`` suffices; and
the attention probabilities ``softmax(q k^T)`` (batch x heads x sequence x sequence), whose backward also
keeps ``q`` and ``k``, from which one small MatMul and a Softmax recompute them. (generate_artifacts runs
GeluBackward first, which replaces the backward of a GELU as torch exports it, so the GELU case is left for the
GELUs that pass does not handle.)

Cases handled:

1. A forward value ``v`` read by a node outside the forward (the nodes the loss depends on), produced by
   a unary op of ``UNARY`` (elementwise, or Softmax / LogSoftmax), or by ``Add``/``Sub``/``Mul``/``Div``/
   ``Pow`` whose other input is a one-element constant, and whose variable input is a value the backward
   reads anyway, a graph input, or such a value itself: the backward reads a copy of its chain, built once
   and inserted before the first node that needs it. The forward then drops ``v`` after its forward readers.
2. The same with a MatMul as the chain's first op, when both its inputs are batched (rank 3 or more)
   activations that are not recomputed themselves (attention scores ``q k^T``), each one kept by the
   backward anyway or, per matrix, smaller than the product (keeping ``q`` of a layer whose key needs no
   gradient instead of its probabilities: 1/4 of their size at sequence 128 and head size 32); a MatMul by
   a matrix (a projection by a weight, even through a Transpose) never is.
3. ``Add``/``Sub``/``Mul``/``Div`` of two variable inputs, each recomputed itself or kept by the backward anyway
   (of known rank): the erf GELU's output ``x * (1 + erf(x / sqrt 2)) * 0.5``, which the next projection's weight
   gradient reads, from the ``x`` its derivative keeps (12 MB per layer of a BERT-base at batch 8, sequence 128).
   The kept inputs of a chain's copies are read through one view per value, so that onnxruntime fuses the copied
   GELU into one Gelu kernel as it fuses the forward's.
4. A ``LayerNormalization``'s output (its first: the mean and inverse deviation it also makes are not
   copied) whose scale and bias are parameters, graph inputs or values the backward keeps anyway, and whose data
   input is such a value or recomputed: the next projections' weight gradients read a transformer's normalized
   hidden states, from the normalization's input its own backward keeps (3 MB per normalization of a BERT-base at
   batch 8, sequence 128, two per layer); one normalization pass over them costs about what a copy does.
5. A ``Dropout`` that passes its input through (a ratio of 0, or not training) continues a chain like a unary op:
   the embeddings' normalization of a transformers BERT is read through one.
6. A batched MatMul of a value recomputed anyway (read by the backward itself) and values the backward keeps or
   recomputes anyway, continued by ``Reshape``/``Transpose`` nodes (which continue a chain, never start one): the
   attention context ``p v`` merged back from its heads, which the output projection's weight gradient reads, from
   the probabilities of case 2 (3 MB per layer of a BERT-base at batch 8, sequence 128, for one batched MatMul
   of about 1/70 of the layer's forward). The value heads such a product reads are copied too, from the projection
   they are reshaped and transposed from: onnxruntime's transpose optimizer moves the backward's other reads of
   them to that projection, and a read of the heads themselves would keep both alive.
7. Left alone: a chain that starts at a forward value the backward does not read (keeping it instead would
   save nothing) or at a value of unknown rank, values a subgraph of the backward reads, and every other op.

onnxruntime's common-subexpression elimination would merge a copy with its original (same op, same inputs,
after its own fusions) and undo the rewrite. So the first op of a copied chain reads its kept input through
a Reshape to the same shape (``[0, ..., 0, -1]``), which onnxruntime leaves in place and runs without a copy.
onnxruntime also orders the nodes itself, and would compute a copy whose inputs all come from the forward right
after the forward, where it stays alive through the peak of the step (the backward's start): the Reshape's shape
is therefore ``[0, ..., 0, -1] + 0 * Size(b)``, with ``b`` the backward value computed last before the copy's
first reader in the graph's order, so that the copy waits for the backward to get there.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping

import numpy as np
import onnx
from onnx import numpy_helper

from onnxtrain.ir.pass_infra import Pass, PassResult
from onnxtrain.ir.passes import ancestors, clone, constant_values, fresh_name, node_index, used_names
from onnxtrain.ir.types import TensorInfo, infer_tensor_info

__all__ = ["RecomputeInBackward", "forward_nodes"]

UNARY = frozenset({"Abs", "Neg", "Exp", "Log", "Sqrt", "Reciprocal", "Erf", "Tanh", "Sigmoid", "Relu",
                   "Softplus", "Sin", "Cos", "Softmax", "LogSoftmax"})
BINARY_WITH_CONSTANT = frozenset({"Add", "Sub", "Mul", "Div", "Pow"})
ELEMENTWISE_BINARY = frozenset({"Add", "Sub", "Mul", "Div"})
NORMALIZATIONS = frozenset({"LayerNormalization"})  # output 0 from input 0 and parameters (inputs 1 and 2)
LAYOUT = frozenset({"Reshape", "Transpose"})  # continue a chain through input 0, never start one
SUFFIX = "/recomputed"
_START = -1  # a chain's first op: reads only values that stay alive anyway
_JOIN = -2  # a binary op of two variable inputs, each recomputed or kept anyway
_PRODUCT = -3  # a MatMul of a recomputed value and a value recomputed or kept anyway
# Ops whose output may be a sequence or an optional (the rest make tensors, in a graph the checker accepts)
_MAY_NOT_MAKE_TENSORS = frozenset({"SequenceConstruct", "SequenceEmpty", "SequenceInsert", "SequenceErase",
                                   "SplitToSequence", "SequenceMap", "Optional", "OptionalGetElement", "If", "Loop",
                                   "Scan"})


class RecomputeInBackward(Pass):
    """Recompute, in the backward, the cheap forward values the gradient nodes read (cases in the module's
    docstring)."""

    def __init__(self, loss: str | None = None, infos: Mapping[str, TensorInfo] | None = None):
        self.loss = loss  # None: the graph's first output
        # types and shapes already known for the forward's values (generate_artifacts'): the pass then infers the
        # whole graph's only for a value they lack
        self.infos = infos

    def call(self, model: onnx.ModelProto) -> PassResult:
        graph = model.graph
        index = node_index(model)
        forward = index.ancestors(self.loss or graph.output[0].name)
        producer = {o: k for o, k in index.producer.items() if k in forward}
        constants = _one_element_constants(graph)
        # shape inference only if a candidate needs a rank (a CNN has none: its generation does not pay for it)
        inferred = functools.cache(lambda: infer_tensor_info(model))

        def infos(*values: str) -> Mapping[str, TensorInfo]:
            """Infos that cover ``values``."""
            given = self.infos
            return given if given is not None and all(v in given for v in values) else inferred()

        def computed_tensor(node: onnx.NodeProto) -> bool:
            """Whether the node's first output is a tensor (what ``Size`` can read)."""
            if self.infos is None:
                return node.output[0] in inferred()
            return bool(node.output[0]) and node.op_type not in _MAY_NOT_MAKE_TENSORS
        # the values of small constants, decoded on demand: only a Dropout asks (a CNN's generation decodes none)
        constants_decoded = functools.cache(lambda: constant_values(graph))

        def constant_value(name: str) -> np.ndarray | None:
            return constants_decoded().get(name)
        kept = {x for k, xs in enumerate(index.reads) if k not in forward for x in xs if x in producer}
        # a value a subgraph reads stays alive for it: nothing to gain, and the rewrite reads direct inputs only
        captured = {x for k, xs in index.implicit.items() if k not in forward for x in xs}

        chains: dict[str, int | None] = {}  # value -> its producer's input that continues a chain, or _START

        def stays(x: str) -> bool:
            return x not in producer or x in kept

        def recomputable(v: str) -> bool:
            if v not in chains:
                chains[v] = None  # a cycle cannot occur in a valid graph; this also ends the recursion
                chains[v] = _link(graph.node[producer[v]], v) if v in producer and v not in captured else None
            return chains[v] is not None

        def relaid(x: str) -> bool:
            """Whether the forward value ``x`` is made by Reshape and Transpose nodes from a forward value of known
            rank (attention's value heads), and if so, copy those too: onnxruntime moves the backward's other reads
            of ``x`` to that value, which a read of ``x`` itself would keep alive beside it."""
            node = graph.node[producer[x]]
            if node.op_type not in LAYOUT or x in captured or len(node.output) != 1:
                return False
            y = node.input[0]
            if y in producer and (recomputable(y) or relaid(y)):
                chains[x] = 0
            elif y in producer and y not in captured and _rank(infos(y), y) >= 0:
                chains[x] = _START
            else:
                return False
            return True

        def elementwise(v: str) -> bool:
            """Whether the recomputable ``v``'s chain has no MatMul (a join recomputes no product)."""
            node, k = graph.node[producer[v]], chains[v]
            if k == _JOIN:
                return all(elementwise(x) for x in node.input if chains.get(x) is not None)
            return node.op_type != "MatMul" and (k == _START or elementwise(node.input[k]))

        def _link(node: onnx.NodeProto, v: str) -> int | None:
            if node.domain not in ("", "ai.onnx"):
                return None
            if node.op_type in NORMALIZATIONS:
                if v != node.output[0] or not node.input or not all(stays(x) for x in node.input[1:] if x):
                    return None
            elif node.op_type == "Dropout":
                if v != node.output[0] or not node.input or not _passes_through(node, constant_value):
                    return None
            elif len(node.output) != 1:
                return None
            if node.op_type == "MatMul":  # batched, of two activations: not a projection by a weight
                if not all(x in producer and _rank(infos(x), x) >= 3 for x in node.input):
                    return None
                if any(recomputable(x) for x in node.input):  # each input's copy or original is there anyway
                    if not all(x in kept for x in node.input):
                        return None
                    for x in node.input:  # value heads: copied from the projection (see relaid)
                        if not recomputable(x):
                            relaid(x)
                    return _PRODUCT
                return _START if all(x in kept or _smaller(infos(x, v), x, v) for x in node.input) else None
            if node.op_type in LAYOUT:
                x = node.input[0]
                return 0 if x in producer and recomputable(x) else None
            if (node.op_type in ELEMENTWISE_BINARY and len(node.input) == 2
                    and not any(x in constants for x in node.input)):
                ok = all((x in producer and recomputable(x) and elementwise(x))
                         or (stays(x) and _rank(infos(x), x) >= 0) for x in node.input)
                return _JOIN if ok else None
            k = _variable_input(node, constants)
            if k is None:
                return None
            x = node.input[k]
            if x in producer and recomputable(x):  # continues the copy of x's chain
                return k
            if stays(x) and _rank(infos(x), x) >= 0:
                return _START
            return None

        if not [v for v in kept if recomputable(v)]:
            return PassResult(model, False)

        out = clone(model)
        taken = used_names(out.graph)
        copies: dict[str, str] = {}
        nodes: list[onnx.NodeProto] = []

        def unique(name: str) -> str:
            return fresh_name(name, taken)

        zero: list[str] = []  # the int64 0 the view shapes add, created once

        views: dict[tuple[str, int], str] = {}  # (kept value, backward position) -> its view

        def same_shape(x: str, name: str) -> str:
            """x through a Reshape to its own shape, the shape computed after the backward value ``reached``
            (see the module's docstring); one view per value for the copies made at one point of the backward."""
            key = (x, len(reached))
            if key not in views:
                views[key] = _view(x, name)
            return views[key]

        def _view(x: str, name: str) -> str:
            shape = unique(x + SUFFIX + "/shape")
            out.graph.initializer.append(numpy_helper.from_array(
                np.array([0] * (_rank(infos(x), x) - 1) + [-1] if _rank(infos(x), x) else [], np.int64), shape))
            if reached:
                if not zero:
                    zero.append(unique(SUFFIX.strip("/") + "/zero"))
                    out.graph.initializer.append(numpy_helper.from_array(np.array(0, np.int64), zero[0]))
                size = onnx.helper.make_node("Size", [reached[-1]], [unique(name + "/after")],
                                             name=unique(name + "/after"))
                nothing = onnx.helper.make_node("Mul", [size.output[0], zero[0]], [unique(name + "/after_zero")],
                                                name=unique(name + "/after_zero"))
                after = onnx.helper.make_node("Add", [shape, nothing.output[0]], [unique(shape + "/after")],
                                              name=unique(name + "/shape_after"))
                nodes.extend([size, nothing, after])
                shape = after.output[0]
            view = onnx.helper.make_node("Reshape", [x, shape], [unique(x + SUFFIX)], name=unique(name + "/view"))
            nodes.append(view)
            return view.output[0]

        def copy_of(v: str) -> str:
            if v in copies:
                return copies[v]
            original = graph.node[producer[v]]
            node = clone(original)
            node.name = unique((original.name or original.output[0]) + SUFFIX)
            k = chains[v]
            if k == _JOIN:
                node.input[:] = [copy_of(x) if chains.get(x) is not None else same_shape(x, node.name)
                                 for x in node.input]
            elif k == _PRODUCT:  # the copied input makes it wait and keeps it apart from the original
                node.input[:] = [copy_of(x) if chains.get(x) is not None else x for x in node.input]
            elif k != _START:
                node.input[k] = copy_of(node.input[k])
            else:
                j = 0 if node.op_type == "MatMul" or node.op_type in LAYOUT else _variable_input(original, constants)
                node.input[j] = same_shape(node.input[j], node.name)
            del node.output[:]
            node.output.append(unique(v + SUFFIX))
            nodes.append(node)
            copies[v] = node.output[0]
            return copies[v]

        reached: list[str] = []  # the last tensor the backward computed, in graph order
        for k, node in enumerate(out.graph.node):
            if k not in forward:
                for j, x in enumerate(node.input):
                    if x in producer and chains.get(x) is not None:
                        node.input[j] = copy_of(x)
                if node.output and computed_tensor(node):
                    reached.append(node.output[0])
            nodes.append(node)
        del out.graph.node[:]
        out.graph.node.extend(nodes)
        return PassResult(out, True)


def forward_nodes(nodes, value: str) -> set[int]:
    """The indices of the nodes ``value`` (the loss) depends on: the forward."""
    return ancestors(nodes, [value])


def _rank(infos: dict[str, TensorInfo], value: str) -> int:
    """The value's rank, -1 if unknown."""
    info = infos.get(value)
    return -1 if info is None or info.rank is None else info.rank


def _smaller(infos: dict[str, TensorInfo], x: str, product: str) -> bool:
    """Whether each matrix of MatMul input ``x`` has fewer elements than each matrix of its ``product`` (the
    last two dimensions, known integers; the batch dimensions of ``x`` broadcast to the product's)."""
    a, b = infos.get(x), infos.get(product)
    if a is None or b is None or a.shape is None or b.shape is None or len(a.shape) < 2 or len(b.shape) < 2:
        return False
    dims = [*a.shape[-2:], *b.shape[-2:]]
    return all(isinstance(d, int) for d in dims) and dims[0] * dims[1] < dims[2] * dims[3]


def _one_element_constants(graph: onnx.GraphProto) -> set[str]:
    """The names of the graph's one-element constants (initializers and Constant nodes), from their dimensions
    alone: the values themselves are not needed."""
    names = {i.name for i in graph.initializer if not i.external_data and math.prod(i.dims) == 1}
    for node in graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if ((attr.name == "value" and math.prod(attr.t.dims) == 1) or attr.name in ("value_int", "value_float")
                        or (attr.name == "value_ints" and len(attr.ints) == 1)
                        or (attr.name == "value_floats" and len(attr.floats) == 1)):
                    names.add(node.output[0])
    return names


def _passes_through(node: onnx.NodeProto, constant_value) -> bool:
    """Whether a Dropout node's output is its input: not training (no training_mode, or a constant false) or a
    constant ratio of 0 (transformers exports its dropouts so with a probability of 0)."""
    if len(node.input) < 3 or not node.input[2]:
        return True
    training = constant_value(node.input[2])
    if training is not None and training.size == 1 and not training.reshape(-1)[0]:
        return True
    ratio = constant_value(node.input[1]) if len(node.input) > 1 and node.input[1] else None
    return ratio is not None and ratio.size == 1 and ratio.reshape(-1)[0] == 0


def _variable_input(node: onnx.NodeProto, constants: set[str]) -> int | None:
    """The index of the one non-constant input of a unary or binary-with-constant node (a normalization's data
    input), or None."""
    if (node.op_type in UNARY and len(node.input) == 1) or node.op_type in NORMALIZATIONS or node.op_type == "Dropout":
        return 0
    if node.op_type in BINARY_WITH_CONSTANT and len(node.input) == 2:
        variable = [k for k, x in enumerate(node.input) if x not in constants]
        return variable[0] if len(variable) == 1 else None
    return None
