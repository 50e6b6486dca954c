"""InlineLocalFunctions: every call of a function the model defines is replaced by the function's body.

``torch.onnx.export(..., export_modules_as_functions=...)`` writes each chosen module as a model-local function
(``model.functions``, a domain of its own such as ``__main__``) and the graph as calls of it; other exporters
and onnxscript do the same. The autodiff has gradients for default-domain ops, so the calls are expanded first,
as onnxruntime itself does when it loads such a model.

Cases handled: calls of the model's functions in the main graph and in subgraphs, nested calls, attributes
referenced by the body, bodies written for another opset than the model's (converted to the model's; all by
``onnx.inliner.inline_local_functions``); a call the inliner leaves in place is a PassError; then the function
definitions are dropped, and with them every opset import of a domain that only the functions defined and no node
uses any more. A model that defines no function is returned unchanged. Calls of ops the model does not define
(another domain's custom ops) are left to the callers, which report them.
"""

from __future__ import annotations

import onnx
import onnx.inliner

from onnxtrain.errors import PassError
from onnxtrain.ir.pass_infra import Pass, PassResult

__all__ = ["InlineLocalFunctions"]


class InlineLocalFunctions(Pass):
    """Expand the calls of the model's own functions (cases in the module's docstring)."""

    def call(self, model: onnx.ModelProto) -> PassResult:
        if not model.functions:
            return PassResult(model, False)
        # convert_version: a body written for another opset of a domain the model imports is converted to the
        # model's (without it onnx leaves such calls in place, silently)
        out = onnx.inliner.inline_local_functions(model, convert_version=True)
        functions = {(f.domain, f.name) for f in model.functions}
        left = [n for graph in _graphs(out.graph) for n in graph.node if (n.domain, n.op_type) in functions]
        if left:
            raise PassError(f"onnx's inliner left {len(left)} call(s) of the model's functions in place, e.g. node "
                            f"{left[0].name!r} calling {left[0].domain}::{left[0].op_type}")
        defined = {domain for domain, _ in functions}
        del out.functions[:]
        used = set()
        for graph in _graphs(out.graph):
            used.update(n.domain for n in graph.node)
        kept = [op for op in out.opset_import if op.domain not in defined or op.domain in used]
        del out.opset_import[:]
        out.opset_import.extend(kept)
        return PassResult(out, True)


def _graphs(graph: onnx.GraphProto):
    """``graph`` and every subgraph in it."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _graphs(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from _graphs(sub)
