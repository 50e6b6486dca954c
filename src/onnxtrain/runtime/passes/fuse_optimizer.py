"""FuseOptimizer: one graph for a whole training step, the training graph followed by the optimizer graph.

A plain loop (``module(x, y); optimizer.step(); module.lazy_reset_grad()``) otherwise runs two sessions
per step, each with its own thread pool waking up and its own per-run overhead. The runtime builds this
graph from the two artifacts it already has (the artifacts stay separate, as the peer's API expects):

    per-parameter gradients --Reshape/Concat--> the flat gradient vector --optimizer--> new params, states

Every optimizer value is renamed under a prefix, so nothing collides with the training graph's names.
The flat gradient and the optimizer's results are outputs: the runtime binds them to the spare halves of
its double buffers and only swaps them in when ``optimizer.step()`` is called (see TrainingRun).

Cases handled: a training graph with a gradient output per trainable parameter (as written, or specialised by
SpecializeReset) and an optimizer graph taking ``params`` and ``gradients``, without subgraphs, in the same
default-domain opset. Anything else raises PassError naming what does not fit; the runtime then runs the two
graphs separately.
"""

from __future__ import annotations

import onnx
from onnx import helper

from onnxtrain import conventions as names
from onnxtrain.errors import PassError
from onnxtrain.ir.pass_infra import Pass, PassResult
from onnxtrain.ir.passes import default_opset, has_subgraphs, used_names

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
    """

    def __init__(self, optimizer: onnx.ModelProto, trainable: list[str]):
        self.optimizer, self.trainable = optimizer, trainable

    def call(self, model: onnx.ModelProto) -> PassResult:
        train, optimizer = model, self.optimizer
        tg, og = train.graph, optimizer.graph
        grad_outputs = [names.grad_output_name(p) for p in self.trainable]
        missing = [g for g in grad_outputs if g not in {o.name for o in tg.output}]
        if missing:
            raise PassError(f"the training graph has no gradient outputs {missing[:3]}")
        if not {names.PARAMS, names.GRADIENTS} <= {i.name for i in og.input}:
            raise PassError(f"the optimizer graph does not take {names.PARAMS!r} and {names.GRADIENTS!r}")
        if default_opset(train) != default_opset(optimizer):
            raise PassError(f"the training graph uses opset {default_opset(train)}, the optimizer graph "
                            f"{default_opset(optimizer)}")
        if any(o.domain not in ("", "ai.onnx") for o in optimizer.opset_import):
            raise PassError("the optimizer graph imports opsets outside the default domain")
        fused = FusedNames.for_model(train)
        prefix = fused.prefix
        nodes = list(tg.node)
        flat_pieces = []
        minus_one = prefix + "flat_shape"
        for g in grad_outputs:
            flat_pieces.append(f"{g}/flat")
            nodes.append(helper.make_node("Reshape", [g, minus_one], [flat_pieces[-1]], name=f"{g}/flatten"))
        nodes.append(helper.make_node("Concat", flat_pieces, [fused(names.GRADIENTS)], axis=0,
                                      name=prefix + "concat_gradients"))
        nodes.extend(_renamed_nodes(og, fused))

        initializers = [*tg.initializer, helper.make_tensor(minus_one, onnx.TensorProto.INT64, [1], [-1])]
        for init in og.initializer:
            renamed = onnx.TensorProto()
            renamed.CopyFrom(init)
            renamed.name = fused(init.name)
            initializers.append(renamed)
        inputs = [*tg.input, *(_renamed_value(i, fused) for i in og.input if i.name != names.GRADIENTS)]
        gradients_vi = next(i for i in og.input if i.name == names.GRADIENTS)
        outputs = [o for o in tg.output if o.name not in set(grad_outputs)]
        outputs += [_renamed_value(gradients_vi, fused), *(_renamed_value(o, fused) for o in og.output)]
        graph = helper.make_graph(nodes, f"{tg.name}+{og.name}", inputs, outputs, initializer=initializers)
        model = onnx.ModelProto()
        model.CopyFrom(train)
        model.graph.CopyFrom(graph)
        model.ClearField("metadata_props")
        model.metadata_props.add(key=_PREFIX_KEY, value=prefix)
        return PassResult(model, True)


def _renamed_nodes(graph: onnx.GraphProto, fused: FusedNames) -> list[onnx.NodeProto]:
    out = []
    for node in graph.node:
        if has_subgraphs(node):
            raise PassError("the optimizer graph has subgraphs")
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.name = fused(node.name or node.output[0])
        for field in (copy.input, copy.output):
            for i, x in enumerate(field):
                if x:
                    field[i] = fused(x)
        out.append(copy)
    return out


def _renamed_value(value: onnx.ValueInfoProto, fused: FusedNames) -> onnx.ValueInfoProto:
    copy = onnx.ValueInfoProto()
    copy.CopyFrom(value)
    copy.name = fused(value.name)
    return copy
