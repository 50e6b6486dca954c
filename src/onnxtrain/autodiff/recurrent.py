"""Gradients of RNN, GRU and LSTM: unroll the recurrence into primitive ops and differentiate those.

The spec gives these ops no function body, so :func:`expand_recurrent` writes one: the equations of the
spec, step by step, for every direction, with sequence_lens, clip, custom activations, peepholes,
input_forget, linear_before_reset and layout. The gradient graph recomputes the unrolled forward (which
also yields the cell states the fused op does not output) and back-propagates through time.

With a static sequence length the recurrence is unrolled; with one known only at run time, each direction
becomes a Scan over one step of the same equations, which the Scan rule differentiates (loops.py).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
from onnx import helper

from onnxtrain.autodiff.context import GradContext
from onnxtrain.autodiff.registry import register
from onnxtrain.autodiff.shape import shape_of
from onnxtrain.autodiff.subgraph import differentiate
from onnxtrain.ir.builder import GraphBuilder
from onnxtrain.ir.types import TensorInfo, np_dtype

__all__ = ["expand_recurrent"]

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
DEFAULT_ACTIVATIONS = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}
# activation -> (uses alpha, uses beta, default alpha, default beta)
_PARAMS = {"affine": (True, True, 1.0, 0.0), "leakyrelu": (True, False, 0.01, 0.0),
           "thresholdedrelu": (True, False, 1.0, 0.0), "scaledtanh": (True, True, 1.0, 1.0),
           "hardsigmoid": (True, True, 0.2, 0.5), "elu": (True, False, 1.0, 0.0)}


def _activation(b: GraphBuilder, name: str, alpha: float, beta: float, x: str, dtype) -> str:
    op, key = b.op, name.lower()
    k = lambda v: b.const(np.asarray(v, dtype=dtype))  # noqa: E731
    simple = {"relu": "Relu", "tanh": "Tanh", "sigmoid": "Sigmoid", "softsign": "Softsign", "softplus": "Softplus"}
    if key in simple:
        return b.node(simple[key], [x])
    if key == "affine":
        return op.Add(op.Mul(x, k(alpha)), k(beta))
    if key == "leakyrelu":
        return op.LeakyRelu(x, alpha=alpha)
    if key == "thresholdedrelu":
        return op.ThresholdedRelu(x, alpha=alpha)
    if key == "scaledtanh":
        return op.Mul(op.Tanh(op.Mul(x, k(beta))), k(alpha))
    if key == "hardsigmoid":
        return op.HardSigmoid(x, alpha=alpha, beta=beta)
    if key == "elu":
        return op.Elu(x, alpha=alpha)
    raise ValueError(f"unknown recurrent activation {name!r}")


def _activations(op_type: str, attrs: Mapping, directions: int) -> list[list]:
    """Per direction, the activation functions as (name, alpha, beta); alphas and betas are consumed in
    order by the functions that take them."""
    names = [n.decode() if isinstance(n, bytes) else n for n in attrs.get("activations") or []]
    per = len(DEFAULT_ACTIVATIONS[op_type])
    names = names or DEFAULT_ACTIVATIONS[op_type] * directions
    if len(names) == per:
        names = names * directions
    alphas, betas = list(attrs.get("activation_alpha") or []), list(attrs.get("activation_beta") or [])
    out = []
    for name in names:
        uses_a, uses_b, da, db = _PARAMS.get(name.lower(), (False, False, 0.0, 0.0))
        a = alphas.pop(0) if uses_a and alphas else da
        b = betas.pop(0) if uses_b and betas else db
        out.append((name, a, b))
    return [out[d * per:(d + 1) * per] for d in range(directions)]


def _chunks(b: GraphBuilder, v: str, n: int, size: int, axis: int) -> list[str]:
    """Split ``v`` into ``n`` pieces of ``size`` along ``axis`` (Split's signature depends on the opset)."""
    if b.opset >= 13:
        return b.op.Split(v, b.ints([size] * n), axis=axis, _outputs=n)
    return b.op.Split(v, axis=axis, split=[size] * n, _outputs=n)


def expand_recurrent(node: onnx.NodeProto, infos: Mapping[str, TensorInfo], b: GraphBuilder) -> list[str]:
    """Emit into ``b`` the unrolled forward of an RNN/GRU/LSTM ``node``; return the names of its outputs
    (Y, Y_h[, Y_c]) in the node's layout."""
    op_type, op = node.op_type, b.op
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    attrs = {k: v.decode() if isinstance(v, bytes) else v for k, v in attrs.items()}
    inputs = list(node.input) + [""] * (8 - len(node.input))
    x, w, r, bias, lens, h0, c0, peep = inputs[:8]
    layout = attrs.get("layout", 0)
    hidden = attrs["hidden_size"]
    gates = GATES[op_type]
    direction = attrs.get("direction", "forward")
    directions = ["forward", "reverse"] if direction == "bidirectional" else [direction]
    elem = infos[x].elem_type
    dtype = np_dtype(elem)
    k = lambda v: b.const(np.asarray(v, dtype=dtype))  # noqa: E731
    shape = infos[x].shape
    seq = shape[1] if layout else shape[0]
    if layout:
        x = op.Transpose(x, perm=[1, 0, 2])                              # (seq, batch, input)
        h0 = op.Transpose(h0, perm=[1, 0, 2]) if h0 else ""
        c0 = op.Transpose(c0, perm=[1, 0, 2]) if c0 else ""
    clip = attrs.get("clip")
    clipped = (lambda v: op.Clip(v, k(-clip), k(clip))) if clip is not None else (lambda v: v)  # noqa: E731
    activations = _activations(op_type, attrs, len(directions))
    zeros = b.full(op.Concat(shape_of(b, x, 1, 2), b.ints([hidden]), axis=0), 0, elem)
    lens64 = op.Cast(lens, to=onnx.TensorProto.INT64) if lens else None

    def pick(t: str, d: int) -> str:                                    # t[d] of a per-direction tensor
        return op.Gather(t, b.const(np.int64(d)), axis=0)

    ys, hs, cs = [], [], []
    for d, way in enumerate(directions):
        acts = [lambda v, a=a: _activation(b, a[0], a[1], a[2], v, dtype) for a in activations[d]]
        wd, rd = pick(w, d), pick(r, d)                                # (G*H, input), (G*H, H)
        xw = op.MatMul(x, op.Transpose(wd, perm=[1, 0]))               # (seq, batch, G*H)
        rb = None
        if bias:
            wb, rb = _chunks(b, pick(bias, d), 2, gates * hidden, 0)
            xw = op.Add(xw, wb)
        rt = op.Transpose(rd, perm=[1, 0])                             # (H, G*H)
        if way == "reverse" and lens:                                  # reverse each sequence in place
            xw = op.ReverseSequence(xw, lens64, batch_axis=1, time_axis=0)
        h = pick(h0, d) if h0 else zeros
        c = pick(c0, d) if (op_type == "LSTM" and c0) else zeros
        p = _chunks(b, pick(peep, d), 3, hidden, 0) if (op_type == "LSTM" and peep) else None
        if not isinstance(seq, int):
            y, h, c = _scan_direction(b, node, d, way, attrs, xw, h, c, rd, rt, rb, p, lens64, activations[d],
                                      hidden, dtype)
            if way == "reverse" and lens:
                y = op.ReverseSequence(y, lens64, batch_axis=1, time_axis=0)
            ys.append(b.unsqueeze(y, [1]))
            hs.append(b.unsqueeze(h, [0]))
            cs.append(b.unsqueeze(c, [0]))
            continue
        steps = range(seq) if (way == "forward" or lens) else range(seq - 1, -1, -1)
        outs = []
        for step, t in enumerate(steps):
            xt = op.Gather(xw, b.const(np.int64(t)), axis=0)           # (batch, G*H)
            if op_type == "RNN":
                pre = op.Add(xt, op.MatMul(h, rt))
                h_new, c_new = acts[0](clipped(op.Add(pre, rb) if rb else pre)), None
            elif op_type == "GRU":
                h_new, c_new = _gru_step(b, attrs, xt, h, rd, rb, hidden, acts, clipped, k), None
            else:
                h_new, c_new = _lstm_step(b, attrs, xt, h, c, rt, rb, p, acts, clipped, k, hidden)
            if lens64 is not None:                                     # steps past a sequence's end keep
                alive = b.unsqueeze(op.Less(b.const(np.int64(step)), lens64), [1])   # its state, output 0
                outs.append(op.Where(alive, h_new, k(0.0)))
                h = op.Where(alive, h_new, h)
                c = op.Where(alive, c_new, c) if c_new is not None else c
            else:
                outs.append(h_new)
                h, c = h_new, (c_new if c_new is not None else c)
        if way == "reverse" and not lens:
            outs.reverse()
        y = op.Concat(*[b.unsqueeze(o, [0]) for o in outs], axis=0)  # (seq, batch, H)
        if way == "reverse" and lens:
            y = op.ReverseSequence(y, lens64, batch_axis=1, time_axis=0)
        ys.append(b.unsqueeze(y, [1]))
        hs.append(b.unsqueeze(h, [0]))
        cs.append(b.unsqueeze(c, [0]))
    y = op.Concat(*ys, axis=1) if len(ys) > 1 else ys[0]                # (seq, dirs, batch, H)
    y_h = op.Concat(*hs, axis=0) if len(hs) > 1 else hs[0]              # (dirs, batch, H)
    y_c = op.Concat(*cs, axis=0) if len(cs) > 1 else cs[0]
    if layout:
        y = op.Transpose(y, perm=[2, 0, 1, 3])
        y_h, y_c = op.Transpose(y_h, perm=[1, 0, 2]), op.Transpose(y_c, perm=[1, 0, 2])
    return [y, y_h, y_c] if op_type == "LSTM" else [y, y_h]


def _scan_direction(b: GraphBuilder, node: onnx.NodeProto, d: int, way: str, attrs: Mapping, xw: str, h0: str,
                    c0: str, rd: str, rt: str, rb: str | None, p, lens64: str | None, activations: list,
                    hidden: int, dtype) -> tuple[str, str, str]:
    """One direction of the recurrence as a Scan over its steps (a sequence length known only at run time):
    returns Y (seq, batch, H) in time order, the last H and the last C. The step reads the weights from the
    enclosing graph."""
    op_type = node.op_type
    sb = GraphBuilder(b.opset, prefix=f"{node.name or op_type}/step{d}/")
    k = lambda v: sb.const(np.asarray(v, dtype=dtype))  # noqa: E731
    clip = attrs.get("clip")
    clipped = (lambda v: sb.op.Clip(v, k(-clip), k(clip))) if clip is not None else (lambda v: v)  # noqa: E731
    acts = [lambda v, a=a: _activation(sb, a[0], a[1], a[2], v, dtype) for a in activations]
    h, c, xt, step = (sb.unique(n) for n in ("h", "c", "x", "t"))
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    if op_type == "RNN":
        pre = sb.op.Add(xt, sb.op.MatMul(h, rt))
        h_new, c_new = acts[0](clipped(sb.op.Add(pre, rb) if rb else pre)), c
    elif op_type == "GRU":
        h_new, c_new = _gru_step(sb, attrs, xt, h, rd, rb, hidden, acts, clipped, k), c
    else:
        h_new, c_new = _lstm_step(sb, attrs, xt, h, c, rt, rb, p, acts, clipped, k, hidden)
    y_t = h_new
    if lens64 is not None:          # steps past a sequence's end keep its state and output 0
        alive = sb.unsqueeze(sb.op.Less(step, lens64), [1])
        y_t = sb.op.Where(alive, h_new, k(0.0))
        h_new, c_new = sb.op.Where(alive, h_new, h), sb.op.Where(alive, c_new, c)
    outs = [sb.op.Identity(v) for v in (h_new, c_new, y_t)]  # distinct output names, even for a state kept as is
    state = [helper.make_tensor_value_info(n, elem, [None, hidden]) for n in (h, c)]
    scanned = [helper.make_tensor_value_info(xt, elem, None)]
    if lens64 is not None:
        scanned.append(helper.make_tensor_value_info(step, onnx.TensorProto.INT64, []))
    body = helper.make_graph(sb.nodes, f"{op_type}_step", [*state, *scanned],
                             [helper.make_tensor_value_info(o, elem, None) for o in outs],
                             initializer=sb.initializers)
    xs = [xw]
    if lens64 is not None:
        seq = b.op.Reshape(shape_of(b, xw, 0, 1), b.ints([]))
        xs.append(b.op.Range(b.const(np.int64(0)), seq, b.const(np.int64(1))))
    backwards = way == "reverse" and lens64 is None
    h_last, c_last, y = b.op.Scan(h0, c0, *xs, body=body, num_scan_inputs=len(xs), _outputs=3,
                                  scan_input_directions=[int(backwards)] * len(xs),
                                  scan_output_directions=[int(backwards)])
    return y, h_last, c_last


def _gru_step(b, attrs, xt, h, rd, rb, hidden, acts, clipped, k):
    """z = f(x_z + h R_z + b_z), r = f(x_r + h R_r + b_r), n = g(x_h + (r h) R_h + b_h) (or r (h R_h + b_h)
    with linear_before_reset), h' = (1 - z) n + z h."""
    op = b.op
    r_z, r_r, r_h = _chunks(b, rd, 3, hidden, 0)                        # (H, H) each
    rb_z, rb_r, rb_h = _chunks(b, rb, 3, hidden, 0) if rb else (None, None, None)
    x_z, x_r, x_h = _chunks(b, xt, 3, hidden, 1)

    def lin(v, weight, bias_):
        out = op.MatMul(v, op.Transpose(weight, perm=[1, 0]))
        return op.Add(out, bias_) if bias_ else out

    z = acts[0](clipped(op.Add(x_z, lin(h, r_z, rb_z))))
    r = acts[0](clipped(op.Add(x_r, lin(h, r_r, rb_r))))
    if attrs.get("linear_before_reset", 0):
        n = acts[1](clipped(op.Add(x_h, op.Mul(r, lin(h, r_h, rb_h)))))
    else:
        n = acts[1](clipped(op.Add(x_h, lin(op.Mul(r, h), r_h, rb_h))))
    return op.Add(op.Mul(op.Sub(k(1.0), z), n), op.Mul(z, h))


def _lstm_step(b, attrs, xt, h, c, rt, rb, p, acts, clipped, k, hidden):
    """Gates i, o, f, c (that order): i = f(. + P_i c), f = f(. + P_f c) (1 - i with input_forget),
    c' = f c + i g(.), o = f(. + P_o c'), h' = o h(c')."""
    op = b.op
    pre = op.Add(xt, op.MatMul(h, rt))
    if rb:
        pre = op.Add(pre, rb)
    g_i, g_o, g_f, g_c = _chunks(b, pre, 4, hidden, 1)
    if p is not None:
        p_i, p_o, p_f = p
        g_i, g_f = op.Add(g_i, op.Mul(p_i, c)), op.Add(g_f, op.Mul(p_f, c))
    i = acts[0](clipped(g_i))
    f = op.Sub(k(1.0), i) if attrs.get("input_forget", 0) else acts[0](clipped(g_f))
    c_new = op.Add(op.Mul(f, c), op.Mul(i, acts[1](clipped(g_c))))
    if p is not None:
        g_o = op.Add(g_o, op.Mul(p_o, c_new))
    o = acts[0](clipped(g_o))
    return op.Mul(o, acts[2](c_new)), c_new


@register("RNN", "GRU", "LSTM")
def recurrent(ctx: GradContext):
    """Back-propagation through time over the unrolled recurrence."""
    nodes_before = len(ctx.b.nodes)
    outputs = expand_recurrent(ctx.node, ctx.infos, ctx.b)
    body = ctx.b.nodes[nodes_before:]
    wrt = [x for x in ctx.x if x and ctx.is_float(x)]
    grads = differentiate(ctx, body, dict(zip(outputs, ctx.dy)), wrt)
    seen: set[str] = set()
    result = []
    for x in ctx.x:
        result.append(grads.get(x) if x and x not in seen else None)
        seen.add(x)
    return result
