"""Gradients through control flow: If (both branches); Loop and Scan are in ``loops.py``.

An If node has only the condition as an input: its branches read outer values directly (implicit inputs,
see ``engine.implicit_inputs``). Its gradient is another If on the same condition whose branches recompute
their forward branch and differentiate it, with one output per implicit float input the loss depends on.
"""

from __future__ import annotations

import onnx
from onnx import helper

from onnxtrain.autodiff.context import GradContext
from onnxtrain.autodiff.engine import vjp
from onnxtrain.autodiff.registry import register
from onnxtrain.autodiff.subgraph import infer_infos
from onnxtrain.ir.builder import GraphBuilder
from onnxtrain.ir.passes import clone, constant_values, implicit_inputs
from onnxtrain.ir.types import value_info


def _defined(graph: onnx.GraphProto) -> set[str]:
    """Every value a graph defines, in nested subgraphs too."""
    names = {i.name for i in graph.initializer} | {n for node in graph.node for n in node.output}
    for node in graph.node:
        for attr in node.attribute:
            for g in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
                names |= _defined(g) | {v.name for v in g.input}
    return names


def renamed_graph(graph: onnx.GraphProto, prefix: str) -> tuple[list[onnx.NodeProto], list[str], list[str],
                                                                 list[onnx.TensorProto]]:
    """Copies of a subgraph's nodes, inputs, outputs and initializers with every value it defines renamed:
    the gradient recomputes the forward subgraph (an If branch, a loop body) next to the original, and
    names must stay unique."""
    rename = {n: prefix + n for n in _defined(graph) | {v.name for v in graph.input} if n}

    count = iter(range(1 << 30))

    def fix(node: onnx.NodeProto) -> onnx.NodeProto:
        out = clone(node)
        del out.input[:], out.output[:]
        out.input.extend(rename.get(x, x) for x in node.input)
        out.output.extend(rename.get(y, y) for y in node.output)
        out.name = f"{prefix}fwd{next(count)}_{node.op_type}"
        for attr in out.attribute:       # nested subgraphs read the renamed values too
            for g in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
                for v in [*g.input, *g.output, *g.initializer]:
                    v.name = rename.get(v.name, v.name)
                nested = [fix(n) for n in g.node]
                del g.node[:]
                g.node.extend(nested)
        return out

    inits = []
    for init in graph.initializer:
        t = clone(init)
        t.name = rename[init.name]
        inits.append(t)
    return ([fix(n) for n in graph.node], [rename[v.name] for v in graph.input],
            [rename.get(o.name, o.name) for o in graph.output], inits)


@register("If")
def if_(ctx: GradContext):
    """d(outer value) = If(cond, then: VJP of then_branch, else: VJP of else_branch)."""
    cond = ctx.x[0]
    captured = implicit_inputs(ctx.node)
    wrt = [c for c in captured if ctx.is_float(c)]
    seeds = [(i, g) for i, g in enumerate(ctx.dy) if g is not None]
    if not wrt or not seeds:
        return [None] * (1 + len(captured))
    name = ctx.node.name or "If"
    branches = {}
    for key in ("then_branch", "else_branch"):
        graph = next(a.g for a in ctx.node.attribute if a.name == key)
        prefix = ctx.b.unique(f"{name}_{key}_grad") + "/"
        nodes, _, outputs, inits = renamed_graph(graph, prefix)
        sub = GraphBuilder(ctx.b.opset, taken=[*(n.name for n in nodes), *(o for n in nodes for o in n.output)],
                           prefix=prefix)
        consts = {**ctx.constants, **{i.name: onnx.numpy_helper.to_array(i) for i in inits},
                  **constant_values(helper.make_graph([n for n in nodes if n.op_type == "Constant"], "c", [], []))}
        infos = {**ctx.infos, **infer_infos(nodes, ctx.infos, ctx.b.opset, consts)}
        grads = vjp(nodes, {outputs[i]: g for i, g in seeds}, wrt, sub, infos, consts)
        outs = []
        for w in wrt:        # a branch that does not use w contributes zeros of w's shape
            g = grads.get(w) or sub.zeros_like(w, ctx.elem_type(w))
            outs.append(sub.node("Identity", [g], [sub.unique(f"d_{w}")])[0])
        branches[key] = helper.make_graph(
            [*nodes, *sub.nodes], f"{name}_{key}_grad", [],
            [value_info(o, ctx.infos.get(w)) for o, w in zip(outs, wrt)], initializer=[*inits, *sub.initializers])
    results = ctx.op.If(cond, then_branch=branches["then_branch"], else_branch=branches["else_branch"],
                        _outputs=len(wrt))
    results = results if isinstance(results, list) else [results]
    by_name = dict(zip(wrt, results))
    return [None, *(by_name.get(c) for c in captured)]
