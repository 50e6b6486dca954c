"""Gradients through recurrences of dynamic length: Scan and Loop.

A loop applies one step ``(s_{t+1}, y_t) = body(s_t, x_t)`` T times, where T is known only at run time. Its
gradient runs the vector-Jacobian product of the step backwards, as another Scan:

    forward:  the loop also stacks s_t, the state each iteration starts from (one more scan output);
    backward: Scan over t = T-1 .. 0 of  (ds_t, dx_t, dc_t) = vjp(body at s_t, x_t)(ds_{t+1}, dy_t),
              carrying ds (seeded with the gradient of the final state) and the running sum of dc, the
              gradient of the outer values the body reads (weights captured from the enclosing graph).

The backward body recomputes the step from the saved s_t and x_t, then differentiates it. Nothing needs a
static trip count or sequence length; the carried states must keep their shape across iterations (the
stacked s_t need it, as Scan's own outputs do).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnxtrain.autodiff.context import GradContext
from onnxtrain.autodiff.control_flow import renamed_graph
from onnxtrain.autodiff.engine import vjp
from onnxtrain.autodiff.registry import register
from onnxtrain.autodiff.shape import shape_of
from onnxtrain.autodiff.subgraph import infer_infos
from onnxtrain.errors import UnsupportedOpError
from onnxtrain.ir.builder import GraphBuilder
from onnxtrain.ir.passes import clone, constant_values, has_subgraphs, implicit_inputs, node_inputs, prune_nodes
from onnxtrain.ir.types import TensorInfo, value_info

__all__ = ["scan", "loop"]


@dataclass
class Step:
    """How the backward Scan feeds and reads the forward body.

    Attributes:
        feeds: per body input, the stacked outer value it is read from at iteration t and that value's scan
            axis and direction in the forward loop (the backward scans it the other way).
        carried: (body input, body output, gradient of the loop's final value) per float state.
        scanned: (body output, the loop output it stacks, that output's gradient, axis, direction) per scan
            output that has a gradient.
        stacked: body inputs whose per-iteration gradients the backward stacks (Scan's scanned inputs), with
            the axis and direction of their forward scan.
        infos: per body input, its type and shape (without the scan axis).
        scalars: body inputs that are scalars (Loop's iteration number and condition), reshaped to rank 0
            in the backward body (onnx.reference's Loop stacks them as 1-element vectors).
        may_be_empty: the loop may run zero times (Loop); the backward Scan then must not run.
    """

    feeds: list[tuple[str, int, int]]
    carried: list[tuple[int, int, str]]
    scanned: list[tuple[int, str, str, int, int]]
    stacked: list[tuple[int, int, int]]
    infos: list[TensorInfo | None]
    scalars: tuple[int, ...] = ()
    may_be_empty: bool = False


def _body(node: onnx.NodeProto) -> onnx.GraphProto:
    return next(a.g for a in node.attribute if a.name == "body")



def _save_inputs(ctx: GradContext, body_inputs: Sequence[int], infos: Sequence[TensorInfo | None]) -> list[str]:
    """Make the forward loop stack the values of ``body_inputs`` each iteration starts from (more scan
    outputs, axis 0, in iteration order) and return the stacked outputs' names."""
    body = _body(ctx.node)
    return _save_values(ctx, [body.input[i].name for i in body_inputs], infos)


def _save_values(ctx: GradContext, values: Sequence[str], infos: Sequence[TensorInfo | None]) -> list[str]:
    """Make the forward loop stack ``values`` of its body each iteration (more scan outputs, axis 0, in
    iteration order) and return the stacked outputs' names."""
    body = _body(ctx.node)
    direct = {o for n in body.node for o in n.output} - {o.name for o in body.output}
    saved = []
    for value, info in zip(values, infos):
        if value in direct:   # a node's output becomes a scan output as it is: no copy per iteration
            direct.discard(value)
            body.output.append(value_info(value, info))
        else:                 # the body's inputs and outputs need a distinct name
            name = ctx.b.unique(f"{value}_saved")
            body.node.append(helper.make_node("Identity", [value], [name], name=name))
            body.output.append(value_info(name, info))
        saved.append(ctx.forward_output(len(ctx.node.output), f"{value}_stacked"))
    for key in ("scan_output_axes", "scan_output_directions"):   # 0 for the new outputs: axis 0, forward
        attr = next((a for a in ctx.node.attribute if a.name == key), None)
        if attr is not None:
            attr.ints.extend([0] * len(values))
    return saved


def _reverse_scan(ctx: GradContext, body: onnx.GraphProto, step: Step) -> tuple[list[str], list[str], dict[str, str]]:
    """Emit the backward Scan of a loop whose step is ``body``.

    Returns the gradients of the carried values' initial values, the stacked gradients of ``step.stacked``,
    and the gradients of the float outer values the body reads.
    """
    name = ctx.node.name or ctx.node.op_type
    prefix = ctx.b.unique(f"{name}_grad") + "/"
    nodes, ins, outs, inits = renamed_graph(body, prefix)
    sub = GraphBuilder(ctx.b.opset, taken=[*ins, *(n.name for n in nodes), *(o for n in nodes for o in n.output)],
                       prefix=prefix)
    outs = [sub.node("Identity", [o], [sub.unique(f"step_out{j}")])[0] for j, o in enumerate(outs)]  # distinct seeds
    fed = list(ins)
    for i in step.scalars:
        fed[i] = sub.unique(f"{ins[i]}_stacked_element")
        nodes.insert(0, helper.make_node("Reshape", [fed[i], sub.ints([])], [ins[i]], name=sub.unique("to_scalar")))
    captured = [c for c in implicit_inputs(ctx.node) if ctx.is_float(c)]

    # The backward body's inputs: the carried gradients (ds, then the running dc), then per iteration the
    # forward step's inputs and the gradients of its scan outputs.
    d_carried = [sub.unique(f"d_{ins[i]}_next") for i, _, _ in step.carried]
    d_captured = [sub.unique(f"d_{c}_sum") for c in captured]
    d_scanned = [sub.unique(f"d_{outs[j]}_t") for j, *_ in step.scanned]
    infos = {**ctx.infos, **{x: info for x, info in zip(ins, step.infos) if info is not None}}
    consts = {**ctx.constants, **{i.name: numpy_helper.to_array(i) for i in inits},
              **constant_values(helper.make_graph([n for n in nodes if n.op_type == "Constant"], "c", [], []))}
    infos.update(infer_infos([*nodes, *sub.nodes], infos, ctx.b.opset, consts))
    seeds = {**{outs[j]: d for (_, j, _), d in zip(step.carried, d_carried)},
             **{outs[j]: d for (j, *_), d in zip(step.scanned, d_scanned)}}
    wrt = [*(ins[i] for i, _, _ in step.carried), *(ins[i] for i, _, _ in step.stacked), *captured]
    grads = vjp([*nodes, *sub.nodes], seeds, wrt, sub, infos, consts)

    def grad_or_zeros(x: str) -> str:
        return grads.get(x) or sub.zeros_like(x, infos[x].elem_type)

    # The activations the step's vector-Jacobian product reads are stacked by the forward loop, not recomputed
    # by the backward one: each is one small node per step less there, and what only computed them goes too.
    kept = _kept_activations(nodes, sub.nodes, infos)
    kept_stacks = _save_values(ctx, [v[len(prefix):] for v in kept], [infos.get(v) for v in kept])
    dropped = set(kept)
    nodes = [n for n in nodes if not dropped.intersection(n.output)]

    # A captured weight's gradient that is a product u_t^T q_t each step (a MatMul's weight gradient) is not summed
    # in the loop, a GEMM with the batch as inner dimension per step, but stacked: after the loop one GEMM over
    # every step's rows computes the sum.
    hoisted = {} if step.may_be_empty else _per_step_sums(
        nodes + sub.nodes, grads, captured, {c: ctx.infos[c].rank if c in ctx.infos else None for c in captured},
        {**consts, **{i.name: numpy_helper.to_array(i) for i in sub.initializers}})
    summed = [c for c in captured if c not in hoisted]
    d_summed = [d for d, c in zip(d_captured, captured) if c not in hoisted]
    results = [grad_or_zeros(ins[i]) for i, _, _ in step.carried]
    results += [sub.op.Add(dc, grads[c]) if grads.get(c) else dc for dc, c in zip(d_summed, summed)]
    results += [grad_or_zeros(ins[i]) for i, _, _ in step.stacked]
    factors = [v for c in hoisted for v in hoisted[c][1:]]
    factor_infos = [TensorInfo(ctx.elem_type(c), (None, None)) for c in hoisted for _ in hoisted[c][1:]]  # matrices
    outputs = [sub.node("Identity", [g], [sub.unique(f"d_out{k}")])[0] for k, g in enumerate(results + factors)]
    carried_info = [infos.get(ins[i]) for i, _, _ in step.carried]
    body_nodes = prune_nodes([*nodes, *sub.nodes], outputs)  # a hoisted product's per-step MatMul is gone
    read = {x for n in body_nodes for x in node_inputs(n)}
    body_inits = [i for i in [*inits, *sub.initializers] if i.name in read]  # what the pruned nodes read
    graph = helper.make_graph(
        body_nodes, f"{name}_grad_body",
        [*(value_info(d, info) for d, info in zip(d_carried, carried_info)),
         *(value_info(d, ctx.infos.get(c)) for d, c in zip(d_summed, summed)),
         *(value_info(x, info) for x, info in zip(fed, step.infos)),
         *(value_info(d, infos.get(outs[j])) for d, (j, *_) in zip(d_scanned, step.scanned)),
         *(value_info(v, infos.get(v)) for v in kept)],
        [*(value_info(o, infos.get(x)) for o, x in zip(outputs, [*(ins[i] for i, _, _ in step.carried), *summed,
                                                                   *(ins[i] for i, _, _ in step.stacked)])),
         *(value_info(o, info) for o, info in zip(outputs[len(results):], factor_infos))],
        initializer=body_inits)

    # The backward Scan runs forward over stacks put in backward order (onnx.reference's Scan knows no other).
    scanned_in = [*((v, v, a, d) for v, a, d in step.feeds), *((g, y, a, d) for _, y, g, a, d in step.scanned),
                  *((v, v, 0, 0) for v in kept_stacks)]
    initial = [*(g for _, _, g in step.carried), *(ctx.b.zeros_like(c, ctx.elem_type(c)) for c in summed)]
    stacks = [_backward_order(ctx, v, like, a, d) for v, like, a, d in scanned_in]
    if not step.may_be_empty:
        result = ctx.op.Scan(*initial, *stacks, body=graph, num_scan_inputs=len(scanned_in), _outputs=len(outputs))
        result = result if isinstance(result, list) else [result]
    else:   # onnxruntime's Scan rejects empty stacks: zero iterations pass the initial states through
        result = _scan_unless_empty(ctx, initial, stacks, graph, [*carried_info, *(ctx.infos.get(c) for c in summed)])
    k, m, s = len(step.carried), len(summed), len(step.stacked)
    stacked = [_forward_order(ctx, g, ins_outer, a, d) for g, (_, a, d), ins_outer
               in zip(result[k + m:k + m + s], step.stacked, [step.feeds[i][0] for i, _, _ in step.stacked])]
    d_outer = dict(zip(summed, result[k:k + m]))
    stacked_factors = iter(result[k + m + s:])
    for c, (kind, *_) in hoisted.items():   # the sum over the steps, of every step's rows at once
        if kind == "outer":   # sum_t u_t^T q_t: one GEMM
            u, q = next(stacked_factors), next(stacked_factors)
            d_outer[c] = ctx.op.Gemm(_rows(ctx, u), _rows(ctx, q), transA=1)
        else:
            d_outer[c] = ctx.b.reduce("ReduceSum", _rows(ctx, next(stacked_factors)), [0], keepdims=False)
    return result[:k], stacked, d_outer


# Ops whose output a backward step reads rather than recomputes: the activations (and products) of a step
_KEPT_OPS = frozenset({"Sigmoid", "Tanh", "Relu", "Exp", "Erf", "Softplus", "Softsign", "HardSigmoid", "LeakyRelu",
                       "Elu", "Log", "Sqrt", "Reciprocal", "Softmax", "MatMul", "Gemm"})


def _kept_activations(forward: list[onnx.NodeProto], backward: list[onnx.NodeProto],
                      infos: dict[str, TensorInfo]) -> list[str]:
    """The outputs of the step's forward nodes of :data:`_KEPT_OPS` (one output each) that its backward nodes
    read, whose type is known, in forward order."""
    read = {x for n in backward for x in n.input}
    return [n.output[0] for n in forward if n.op_type in _KEPT_OPS and n.domain in ("", "ai.onnx")
            and len(n.output) == 1 and n.output[0] in read and n.output[0] in infos and not has_subgraphs(n)]


def _per_step_sums(nodes: list[onnx.NodeProto], grads: dict[str, str | None], captured: list[str],
                   ranks: dict[str, int | None], constants: dict[str, np.ndarray]) -> dict[str, tuple[str, ...]]:
    """Captured values whose per-step gradient is a matrix product ``MatMul(Transpose(u), q)`` (("outer", u, q):
    a MatMul's weight gradient) or a sum of rows ``ReduceSum(q, axes=[0], keepdims=0)`` (("rows", q): a bias's),
    u and q values of the backward body (stacked, each step's, by the backward Scan); ``ranks`` are the captured
    values'."""
    producer = {o: n for n in nodes for o in n.output}
    found: dict[str, tuple[str, ...]] = {}
    for c in captured:
        node = producer.get(grads.get(c) or "")
        if node is None:
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type == "MatMul" and ranks.get(c) == 2:   # a 2-D result of a 2-D Transpose: q is 2-D too
            transpose = producer.get(node.input[0])
            if (transpose is not None and transpose.op_type == "Transpose"
                    and [list(a.ints) for a in transpose.attribute if a.name == "perm"] == [[1, 0]]):
                found[c] = ("outer", transpose.input[0], node.input[1])
        elif node.op_type == "ReduceSum" and ranks.get(c) == 1 and not attrs.get("keepdims", 1):
            axes = attrs.get("axes") if len(node.input) < 2 else constants.get(node.input[1])
            if axes is not None and list(np.asarray(axes).reshape(-1)) == [0]:
                found[c] = ("rows", node.input[0])
    return found


def _rows(ctx: GradContext, v: str) -> str:
    """Steps of matrix rows stacked (T, rows, columns), as one matrix (T * rows, columns)."""
    return ctx.op.Reshape(v, ctx.op.Concat(ctx.b.ints([-1]), shape_of(ctx.b, v, -1), axis=0))


def _scan_unless_empty(ctx: GradContext, initial: list[str], stacks: list[str], body: onnx.GraphProto,
                       infos: list[TensorInfo | None]) -> list[str]:
    """Scan(initial, stacks) if the stacks have an iteration, else the initial states (no stacked outputs)."""
    count = ctx.op.Reshape(ctx.op.Slice(ctx.op.Shape(stacks[0]), ctx.b.ints([0]), ctx.b.ints([1])), ctx.b.ints([]))
    ran = ctx.op.Greater(count, ctx.b.const(np.asarray(0, np.int64)))
    scanned = [ctx.b.unique("d_scanned") for _ in initial]
    passed = [ctx.b.unique("d_passed") for _ in initial]
    scan = helper.make_node("Scan", [*initial, *stacks], scanned, name=ctx.b.unique("Scan"), body=body,
                            num_scan_inputs=len(stacks))
    keep = [helper.make_node("Identity", [i], [p], name=ctx.b.unique("Identity")) for i, p in zip(initial, passed)]
    then = helper.make_graph([scan], "ran", [], [value_info(o, info) for o, info in zip(scanned, infos)])
    other = helper.make_graph(keep, "empty", [], [value_info(o, info) for o, info in zip(passed, infos)])
    result = ctx.op.If(ran, then_branch=then, else_branch=other, _outputs=len(initial))
    return result if isinstance(result, list) else [result]


def _reversed(ctx: GradContext, v: str) -> str:
    """``v`` with its first axis reversed, whatever its length."""
    return ctx.op.Slice(v, ctx.b.ints([-1]), ctx.b.ints([np.iinfo(np.int64).min]), ctx.b.ints([0]), ctx.b.ints([-1]))


def _axis_perm(ctx: GradContext, like: str, axis: int) -> list[int]:
    """The permutation moving ``axis`` of a value of ``like``'s rank to the front."""
    rank = ctx.rank(like)
    axis %= rank
    return [axis, *(i for i in range(rank) if i != axis)]


def _backward_order(ctx: GradContext, v: str, like: str, axis: int, direction: int) -> str:
    """A value (shaped like ``like``) the forward loop scans along ``axis`` in ``direction``, stacked along
    axis 0 in the order the backward visits the iterations (the last forward iteration first)."""
    if axis != 0:
        v = ctx.op.Transpose(v, perm=_axis_perm(ctx, like, axis))
    return _reversed(ctx, v) if direction == 0 else v


def _forward_order(ctx: GradContext, g: str, like: str, axis: int, direction: int) -> str:
    """The inverse of :func:`_backward_order`, for a gradient shaped like the value it was given (``g``
    stacks the iterations along axis 0 in backward order)."""
    g = _reversed(ctx, g) if direction == 0 else g
    if axis == 0:
        return g
    perm = _axis_perm(ctx, like, axis)
    return ctx.op.Transpose(g, perm=[perm.index(i) for i in range(len(perm))])


def _without_axis(info: TensorInfo | None, axis: int) -> TensorInfo | None:
    if info is None or info.shape is None:
        return info
    axis %= len(info.shape)
    return TensorInfo(info.elem_type, info.shape[:axis] + info.shape[axis + 1:])


def _check_opset(ctx: GradContext) -> None:
    if ctx.b.opset < 10:
        raise UnsupportedOpError(
            f"{ctx.node.op_type} node {ctx.node.name!r}: the gradient of a loop needs opset 10 or later (it "
            f"reverses the iterations with Slice steps), the model has opset {ctx.b.opset}. - help: convert the "
            "model, e.g. onnx.version_converter.convert_version(model, 17)")


@register("Scan")
def scan(ctx: GradContext):
    """Scan (opset 9+): N states and M scanned inputs per step; the backward is a reverse Scan of the step's
    vector-Jacobian product over the saved states (see the module docstring)."""
    _check_opset(ctx)
    body = clone(_body(ctx.node))  # as it is before _save_inputs adds outputs
    m = ctx.attr("num_scan_inputs")
    n = len(ctx.x) - m
    k = len(body.output) - n
    in_axes = list(ctx.attr("scan_input_axes", [0] * m))
    in_dirs = list(ctx.attr("scan_input_directions", [0] * m))
    out_axes = list(ctx.attr("scan_output_axes", [0] * k))
    out_dirs = list(ctx.attr("scan_output_directions", [0] * k))
    states, xs = ctx.x[:n], ctx.x[n:]
    state_infos = [ctx.infos.get(s) for s in states]
    x_infos = [_without_axis(ctx.infos.get(x), a) for x, a in zip(xs, in_axes)]
    saved = _save_inputs(ctx, range(n), state_infos)
    float_states = [i for i in range(n) if ctx.is_float(states[i])]
    float_xs = [j for j in range(m) if ctx.is_float(xs[j])]
    step = Step(
        feeds=[*((s, 0, 0) for s in saved), *zip(xs, in_axes, in_dirs)],
        carried=[(i, i, ctx.dy_or_zeros(i)) for i in float_states],
        scanned=[(n + j, ctx.y[n + j], ctx.dy[n + j], out_axes[j], out_dirs[j]) for j in range(k)
                 if ctx.dy[n + j] is not None],
        stacked=[(n + j, in_axes[j], in_dirs[j]) for j in float_xs],
        infos=[*state_infos, *x_infos])
    d_states, d_xs, d_captured = _reverse_scan(ctx, body, step)
    grads: list[str | None] = [None] * (n + m)
    for i, g in zip(float_states, d_states):
        grads[i] = g
    for j, g in zip(float_xs, d_xs):
        grads[n + j] = g
    return [*grads, *(d_captured.get(c) for c in implicit_inputs(ctx.node))]


@register("Loop")
def loop(ctx: GradContext):
    """Loop: N loop-carried values and K scan outputs per iteration, for a trip count and a condition known
    at run time. The forward also stacks each iteration's number, condition and carried values; the backward
    is a reverse Scan over those stacks (see the module docstring)."""
    _check_opset(ctx)
    body = clone(_body(ctx.node))  # as it is before _save_inputs adds outputs
    n = len(ctx.x) - 2
    k = len(body.output) - 1 - n
    carried = ctx.x[2:]
    infos = [TensorInfo(onnx.TensorProto.INT64, ()), TensorInfo(onnx.TensorProto.BOOL, ()),
             *(ctx.infos.get(v) for v in carried)]
    saved = _save_inputs(ctx, range(n + 2), infos)
    float_carried = [i for i in range(n) if ctx.is_float(carried[i])]
    step = Step(
        feeds=[(s, 0, 0) for s in saved],
        carried=[(2 + i, 1 + i, ctx.dy_or_zeros(i)) for i in float_carried],
        scanned=[(1 + n + j, ctx.y[n + j], ctx.dy[n + j], 0, 0) for j in range(k) if ctx.dy[n + j] is not None],
        stacked=[],
        infos=infos,
        scalars=(0, 1),
        may_be_empty=True)
    d_carried, _, d_captured = _reverse_scan(ctx, body, step)
    grads: list[str | None] = [None] * (n + 2)
    for i, g in zip(float_carried, d_carried):
        grads[2 + i] = g
    return [*grads, *(d_captured.get(c) for c in implicit_inputs(ctx.node))]

