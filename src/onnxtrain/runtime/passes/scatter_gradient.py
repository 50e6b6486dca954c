"""ScatterIntoGradient: an embedding's gradient scattered straight into the gradient buffer, without zeros.

The gradient of ``Gather(W, ids)`` is ``ScatterElements(zeros_like(W), rows, dY, reduction="add")`` (rows: each
lookup's index repeated along its row; autodiff/shape.py ``scatter_nd_add``): a tensor of W's size (45 MiB for
BERT's 30,522 x 384 word embeddings) that only a few rows of the batch touch. onnxruntime folds the zeros into a
constant that the session keeps for good, and the scatter copies it into its output on every step. The runtime
binds the gradient buffer and the gradient output to the same memory, so the scatter can add into the buffer
itself (onnxruntime's scatters do not copy when their input and output are one buffer):

    accumulating:   out = buffer + Scatter(zeros, rows, dY, add)  ->  out = Scatter(buffer, rows, dY, add)
    after a reset:  out = Scatter(zeros, rows, dY, add)           ->  out = Scatter(buffer, rows, dY, add),
                                                                      the runtime zeroes the buffer first

After a reset the specialised graph reads no other gradient buffer, so the buffers it still reads are exactly
the ones to zero (:func:`zeroed_before_run`). Cases handled, per trainable parameter: its gradient output
produced by such a ScatterElements or ScatterND (or the accumulating Add of one) whose data is a
``ConstantOfShape`` of zeros and that nothing else reads; other gradients are left as they are. The buffer's
only reader is then the scatter that writes its output (postcondition, checked).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnxtrain import conventions as names
from onnxtrain.errors import PassError
from onnxtrain.ir.pass_infra import Pass, PassResult
from onnxtrain.ir.passes import clone, drop_unread_initializers, node_inputs, prune_nodes

__all__ = ["ScatterIntoGradient", "zeroed_before_run"]

SCATTERS = frozenset({"ScatterElements", "ScatterND"})


class ScatterIntoGradient(Pass):
    """Scatter gathered parameters' gradients into their buffers (cases in the module's docstring).

    Args:
        trainable: the trainable parameters.
        reset: whether the graph was specialised for a reset (SpecializeReset) or for accumulation.
    """

    def __init__(self, trainable: Sequence[str], reset: bool):
        self.trainable, self.reset = list(trainable), reset

    def call(self, model: onnx.ModelProto) -> PassResult:
        graph = model.graph
        producer = {o: n for n in graph.node for o in n.output if o}
        readers: dict[str, int] = {}
        for n in graph.node:
            for x in set(node_inputs(n)):
                readers[x] = readers.get(x, 0) + 1
        for o in graph.output:
            readers[o.name] = readers.get(o.name, 0) + 1
        replace: dict[int, onnx.NodeProto] = {}
        buffers: list[str] = []
        for param in self.trainable:
            out, buffer = names.grad_output_name(param), names.grad_buffer_name(param)
            node = producer.get(out)
            if node is None:
                continue
            scatter = node
            if not self.reset:
                if node.op_type != "Add" or buffer not in node.input:
                    continue
                other = node.input[1] if node.input[0] == buffer else node.input[0]
                scatter = producer.get(other)
                if scatter is None or readers.get(other) != 1:
                    continue
            if not _scatter_add_into_zeros(scatter, producer):
                continue
            replace[id(node)] = helper.make_node(scatter.op_type, [buffer, *scatter.input[1:]], [out],
                                                 name=f"{out}/scatter")
            replace[id(node)].attribute.extend(scatter.attribute)
            buffers.append(buffer)
        if not replace:
            return PassResult(model, False)
        nodes = prune_nodes([replace.get(id(n), n) for n in graph.node], [o.name for o in graph.output])
        for buffer in buffers:
            reading = [n for n in nodes if buffer in node_inputs(n)]
            if len(reading) != 1 or reading[0].op_type not in SCATTERS:
                raise PassError(f"the gradient buffer {buffer!r} is read by {len(reading)} nodes after the rewrite; "
                                "it must be read only by the scatter that writes over it")
        result = clone(model)
        del result.graph.node[:]
        result.graph.node.extend(nodes)
        present = {i.name for i in graph.input}
        for param in self.trainable:  # after a reset the buffers were pruned: bring back the ones scattered into
            buffer = names.grad_buffer_name(param)
            if buffer in buffers and buffer not in present:
                elem, shape = _tensor_type(model, names.grad_output_name(param))
                result.graph.input.append(helper.make_tensor_value_info(buffer, elem, shape))
        drop_unread_initializers(result.graph)
        return PassResult(result, True)


def zeroed_before_run(model: onnx.ModelProto, trainable: Sequence[str]) -> list[str]:
    """The parameters whose gradient buffer a reset-specialised training graph scatters into (ScatterIntoGradient):
    the runtime zeroes them before each run of that graph."""
    inputs = {i.name for i in model.graph.input}
    return [p for p in trainable if names.grad_buffer_name(p) in inputs]


def _scatter_add_into_zeros(node: onnx.NodeProto, producer: dict[str, onnx.NodeProto]) -> bool:
    if node.op_type not in SCATTERS or not any(a.name == "reduction" and a.s == b"add" for a in node.attribute):
        return False
    zeros = producer.get(node.input[0])
    if zeros is None or zeros.op_type != "ConstantOfShape":
        return False
    value = next((numpy_helper.to_array(a.t) for a in zeros.attribute if a.name == "value"), np.zeros(1))
    return not np.any(value)


def _tensor_type(model: onnx.ModelProto, name: str) -> tuple[int, list]:
    for vi in model.graph.output:
        if vi.name == name:
            t = vi.type.tensor_type
            return t.elem_type, [d.dim_value if d.HasField("dim_value") else d.dim_param for d in t.shape.dim]
    raise PassError(f"the training graph has no output {name!r}")
