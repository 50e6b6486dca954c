"""RestoreDetach: a torch ``detach()`` that the dynamo exporter's graph optimizer removed is put back.

torch passes no gradient through ``tensor.detach()`` (stop-gradients: ``x + (q - x).detach()`` straight-through
estimators, target branches). The dynamo exporter writes it as an Identity recorded as ``aten.detach``, which the
Identity's gradient rule honours; but with its graph optimizer on (``torch.onnx.export``'s default) the Identity is
removed, and the gradient flowed through: silently torch's gradient plus the detached branch's.

The records stay on the other nodes, though: a node recorded as reading the FX value ``%detach`` (or
``%detach_1``, ...) reads, in the ONNX graph, the value the detach was applied to. Cases handled: a node whose record
names exactly one ``detach`` argument, and exactly one of whose inputs is made by a node recorded as another FX value
that its record does not name (the one the detach hid): that input is read through a new Identity recorded as the
detach. Left alone: nodes with an explicit detach Identity before them, several detached arguments, or an
ambiguous input (a detached parameter or graph input has no producer to tell it by).
"""

from __future__ import annotations

import re

import onnx
from onnx import helper

from onnxtrain.ir.pass_infra import Pass, PassResult
from onnxtrain.ir.passes import clone, fresh_name, producer_index, used_names
from onnxtrain.ir.torch_records import DETACH_TARGET, FX_NODE, fx_call, fx_output, is_detach

__all__ = ["RestoreDetach"]

_DETACH_NAME = re.compile(r"detach(_\d+)?")


class RestoreDetach(Pass):
    """Read through a recorded detach Identity each input whose detach the exporter's optimizer removed."""

    def call(self, model: onnx.ModelProto) -> PassResult:
        graph = model.graph
        producer = producer_index(graph.node)
        found: list[tuple[int, int, str, str]] = []  # (node, input, the detach's FX name, the value it hid)
        for k, node in enumerate(graph.node):
            call = fx_call(node)
            detached = [a for a in call.args if a and _DETACH_NAME.fullmatch(a)] if call is not None else []
            if len(detached) != 1:
                continue
            own = fx_output(node)
            hidden, explicit = [], False
            for j, x in enumerate(node.input):
                made_by = graph.node[producer[x]] if x in producer else None
                if made_by is None:
                    continue
                if is_detach(made_by):
                    explicit = True
                    continue
                name = fx_output(made_by)
                if name is not None and name != own and name not in call.args:
                    hidden.append((j, name))
            if len(hidden) == 1 and not explicit:
                found.append((k, hidden[0][0], detached[0], hidden[0][1]))
        if not found:
            return PassResult(model, False)
        out = clone(model)
        taken = used_names(out.graph)
        inserted: dict[int, onnx.NodeProto] = {}  # node -> the Identity it reads through (one each)
        for k, j, detach_name, source in found:
            node = out.graph.node[k]
            value = fresh_name(f"{node.input[j]}/detached", taken)
            identity = helper.make_node("Identity", [node.input[j]], [value], name=fresh_name(f"restored_{detach_name}",
                                                                                                taken))
            identity.metadata_props.add(key=FX_NODE, value=f"%{detach_name} : [num_users=1] = call_function[target="
                                                           f"{DETACH_TARGET}](args = (%{source},), kwargs = {{}})")
            node.input[j] = value
            inserted[k] = identity
        nodes = []
        for k, node in enumerate(out.graph.node):
            nodes.extend([inserted[k], node] if k in inserted else [node])
        del out.graph.node[:]
        out.graph.node.extend(nodes)
        return PassResult(out, True)
