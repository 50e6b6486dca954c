"""PoolBeforeRelu: ``MaxPool(Relu(x))`` becomes ``Relu(MaxPool(x))``.

The same values (Relu is monotone) and the same gradients (a window's first maximum is the same element, and a
window whose maximum is <= 0 gets no gradient either way), but the Relu and its gradient mask run on the
pooled, smaller tensor (a quarter of the elements for 2x2 pools).

Cases handled: a Relu whose only reader is a MaxPool with one output, and whose output is not among ``keep``
(values the caller reads by name: graph outputs, loss inputs, additional outputs). Every other Relu, and
every MaxPool that also returns its indices, is left alone.
"""

from __future__ import annotations

import copy
from collections.abc import Collection

import onnx
from onnx import helper

from onnxtrain.ir.pass_infra import Pass, PassResult
from onnxtrain.ir.passes import clone, node_inputs, used_names

__all__ = ["PoolBeforeRelu"]


class PoolBeforeRelu(Pass):
    """Swap each Relu -> MaxPool pair.

    Args:
        keep: values that must keep their meaning (read by name after the rewrite).
    """

    def __init__(self, keep: Collection[str] = ()):
        self.keep = set(keep)

    def call(self, model: onnx.ModelProto) -> PassResult:
        graph = model.graph
        keep = self.keep | {o.name for o in graph.output}
        readers: dict[str, list[onnx.NodeProto]] = {}
        for n in graph.node:
            for x in set(node_inputs(n)):
                readers.setdefault(x, []).append(n)
        taken = used_names(graph)
        swapped: dict[int, list[onnx.NodeProto]] = {}
        dropped: set[int] = set()
        for relu in graph.node:
            if relu.op_type != "Relu" or relu.output[0] in keep:
                continue
            pools = readers.get(relu.output[0], [])
            if len(pools) != 1 or pools[0].op_type != "MaxPool" or len([o for o in pools[0].output if o]) != 1:
                continue
            pool = pools[0]
            pooled = f"{pool.output[0]}/before_relu"
            while pooled in taken:
                pooled += "_"
            taken.add(pooled)
            early = copy.deepcopy(pool)
            early.input[0], early.output[0] = relu.input[0], pooled
            late = helper.make_node("Relu", [pooled], [pool.output[0]], name=f"{relu.name or 'Relu'}/after_pool")
            swapped[id(pool)] = [early, late]
            dropped.add(id(relu))
        if not swapped:
            return PassResult(model, False)
        nodes = []
        for n in graph.node:
            if id(n) not in dropped:
                nodes.extend(swapped.get(id(n), [n]))
        out = clone(model)
        del out.graph.node[:]
        out.graph.node.extend(nodes)
        return PassResult(out, True)
