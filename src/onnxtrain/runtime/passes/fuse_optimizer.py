"""FuseOptimizer: one graph for a whole training step, the training graph followed by the optimizer graph.

A plain loop (``module(x, y); optimizer.step(); module.lazy_reset_grad()``) otherwise runs two sessions
per step, each with its own thread pool waking up and its own per-run overhead. The runtime builds this
graph from the two artifacts it already has (the artifacts stay separate, as the peer's API expects):

    per-parameter gradients --Reshape/Concat--> the flat gradient vector --optimizer--> new params, states

or, with an optimizer graph split into chunks (ChunkUpdate), each chunk's gradient from the pieces of the
gradients it covers (Reshape, Slice, Concat), so no flat gradient vector is ever materialised:

    per-parameter gradients --> gradients#0, gradients#1, ... --optimizer chunks--> params.out#0, ...

Every optimizer value is renamed under a prefix, so nothing collides with the training graph's names.
The flat gradient and the optimizer's results are outputs: the runtime binds them to the spare halves of
its double buffers and only swaps them in when ``optimizer.step()`` is called (see TrainingRun).

Cases handled: a training graph with a gradient output per trainable parameter (as written, or specialised by
SpecializeReset) and an optimizer graph taking ``params`` and ``gradients``, without subgraphs, in the same
default-domain opset. Anything else raises PassError naming what does not fit; the runtime then runs the two
graphs separately.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import helper

from onnxtrain import conventions as names
from onnxtrain.errors import PassError
from onnxtrain.ir.pass_infra import Pass, PassResult
from onnxtrain.ir.passes import clone, default_opset, has_subgraphs, used_names
from onnxtrain.runtime.passes.chunk_update import chunk_name, chunk_slots

__all__ = ["FuseOptimizer", "FusedNames"]


_PREFIX_KEY = "onnxtrain.fused_prefix"  # metadata_props of the fused model: the prefix of the optimizer's names


class FusedNames:
    """The fused graph's names for the optimizer's inputs and outputs: ``prefix + name``."""

    def __init__(self, prefix: str):
        self.prefix = prefix

    def __call__(self, optimizer_name: str) -> str:
        return self.prefix + optimizer_name

    @classmethod
    def for_model(cls, train: onnx.ModelProto) -> FusedNames:
        """A prefix that no name of the training graph starts with."""
        taken = used_names(train.graph)
        prefix = "optimizer/"
        while any(n.startswith(prefix) for n in taken):
            prefix = "_" + prefix
        return cls(prefix)

    @classmethod
    def of_fused(cls, fused: onnx.ModelProto) -> FusedNames:
        """The names FuseOptimizer gave the optimizer's values in ``fused`` (recorded in its metadata)."""
        return cls(next(p.value for p in fused.metadata_props if p.key == _PREFIX_KEY))


class FuseOptimizer(Pass):
    """Append the optimizer graph to a training graph.

    The optimizer's values are renamed under a prefix no training value starts with; the fused model records
    it (``FusedNames.of_fused(result.model)`` gives the names to bind).

    Args:
        optimizer: the optimizer model.
        trainable: the trainable parameters, in flat-vector order.
        chunks: the (start, stop) bounds the optimizer graph was split into (None: it takes whole vectors).
        sizes: the trainable parameters' element counts (needed with ``chunks``).
        keep_gradients: parameters whose gradient output stays an output of the fused graph (an embedding's
            gradient scattered into its buffer, bound to the buffer's memory).
    """

    def __init__(self, optimizer: onnx.ModelProto, trainable: list[str],
                 chunks: Sequence[tuple[int, int]] | None = None, sizes: Sequence[int] | None = None,
                 keep_gradients: Sequence[str] = ()):
        self.optimizer, self.trainable = optimizer, trainable
        self.chunks, self.sizes = chunks, sizes
        self.kept = {names.grad_output_name(p) for p in keep_gradients}
        if chunks is not None and (sizes is None or len(sizes) != len(trainable)):
            raise ValueError("FuseOptimizer with chunks needs the size of every trainable parameter")

    def call(self, model: onnx.ModelProto) -> PassResult:
        train, optimizer = model, self.optimizer
        tg, og = train.graph, optimizer.graph
        grad_outputs = [names.grad_output_name(p) for p in self.trainable]
        if not grad_outputs:
            raise PassError("nothing trains: the training graph has no gradient for the optimizer graph to read")
        missing = [g for g in grad_outputs if g not in {o.name for o in tg.output}]
        if missing:
            raise PassError(f"the training graph has no gradient outputs {missing[:3]}")
        gradient_inputs = ([names.GRADIENTS] if self.chunks is None else
                           [chunk_name(names.GRADIENTS, i) for i in range(len(self.chunks))])
        if not set(gradient_inputs) <= {i.name for i in og.input}:
            raise PassError(f"the optimizer graph does not take {gradient_inputs[0]!r}"
                            + (f" ... {gradient_inputs[-1]!r}" if len(gradient_inputs) > 1 else ""))
        if default_opset(train) != default_opset(optimizer):
            raise PassError(f"the training graph uses opset {default_opset(train)}, the optimizer graph "
                            f"{default_opset(optimizer)}")
        if any(o.domain not in ("", "ai.onnx") for o in optimizer.opset_import):
            raise PassError("the optimizer graph imports opsets outside the default domain")
        fused = FusedNames.for_model(train)
        prefix = fused.prefix
        nodes = list(tg.node)
        minus_one = prefix + "flat_shape"
        initializers = [*tg.initializer, helper.make_tensor(minus_one, onnx.TensorProto.INT64, [1], [-1])]
        if self.chunks is None:
            flat_pieces = []
            for g in grad_outputs:
                flat_pieces.append(f"{g}/flat")
                nodes.append(helper.make_node("Reshape", [g, minus_one], [flat_pieces[-1]], name=f"{g}/flatten"))
            nodes.append(helper.make_node("Concat", flat_pieces, [fused(names.GRADIENTS)], axis=0,
                                          name=prefix + "concat_gradients"))
        else:
            nodes.extend(_chunk_gradients(grad_outputs, minus_one, self.sizes, self.chunks, fused, initializers))
        nodes.extend(_renamed_nodes(og, fused))

        for init in og.initializer:
            renamed = clone(init)
            renamed.name = fused(init.name)
            initializers.append(renamed)
        inputs = [*tg.input, *(_renamed_value(i, fused) for i in og.input if i.name not in gradient_inputs)]
        gradient_vis = [i for i in og.input if i.name in gradient_inputs]
        outputs = [o for o in tg.output if o.name not in set(grad_outputs) - self.kept]
        outputs += [*(_renamed_value(i, fused) for i in gradient_vis), *(_renamed_value(o, fused) for o in og.output)]
        graph = helper.make_graph(nodes, f"{tg.name}+{og.name}", inputs, outputs, initializer=initializers)
        model = clone(train)
        model.graph.CopyFrom(graph)
        model.ClearField("metadata_props")
        model.metadata_props.add(key=_PREFIX_KEY, value=prefix)
        return PassResult(model, True)


def _chunk_gradients(grads: list[str], minus_one: str, sizes: Sequence[int], chunks: Sequence[tuple[int, int]],
                     fused: FusedNames, initializers: list[onnx.TensorProto]) -> list[onnx.NodeProto]:
    """Nodes writing each chunk's gradient (``fused(gradients#i)``) from the per-parameter gradients: a chunk of
    one piece is written by the piece's own Reshape or Slice (one copy), several pieces by a Concat."""
    offsets = np.cumsum([0, *sizes]).tolist()
    nodes, flat = [], {}

    def const(value: int) -> str:
        name = fused(f"chunk_bound/{len(initializers)}")
        initializers.append(helper.make_tensor(name, onnx.TensorProto.INT64, [1], [value]))
        return name

    def flattened(k: int, out: str | None = None) -> str:
        if out is None and k in flat:
            return flat[k]
        name = out or f"{grads[k]}/flat"
        nodes.append(helper.make_node("Reshape", [grads[k], minus_one], [name], name=name))
        if out is None:
            flat[k] = name
        return name

    for i, ((a, b), ks) in enumerate(zip(chunks, chunk_slots(sizes, chunks))):
        out = fused(chunk_name(names.GRADIENTS, i))
        pieces = []
        for k in ks:
            lo, hi = max(a, offsets[k]) - offsets[k], min(b, offsets[k + 1]) - offsets[k]
            target = out if len(ks) == 1 else None
            if (lo, hi) == (0, sizes[k]):
                pieces.append(flattened(k, target))
            else:
                name = target or f"{grads[k]}/flat/{lo}"
                nodes.append(helper.make_node("Slice", [flattened(k), const(lo), const(hi)], [name], name=name))
                pieces.append(name)
        if len(ks) > 1:
            nodes.append(helper.make_node("Concat", pieces, [out], axis=0, name=out))
    return nodes


def _renamed_nodes(graph: onnx.GraphProto, fused: FusedNames) -> list[onnx.NodeProto]:
    out = []
    for node in graph.node:
        if has_subgraphs(node):
            raise PassError("the optimizer graph has subgraphs")
        copy = clone(node)
        copy.name = fused(node.name or node.output[0])
        for field in (copy.input, copy.output):
            for i, x in enumerate(field):
                if x:
                    field[i] = fused(x)
        out.append(copy)
    return out


def _renamed_value(value: onnx.ValueInfoProto, fused: FusedNames) -> onnx.ValueInfoProto:
    copy = clone(value)
    copy.name = fused(value.name)
    return copy
