"""RNN, GRU and LSTM: the unrolled expansion against onnxruntime's fused kernels, the gradient against finite
differences, and against torch.nn.LSTM / GRU.

onnx.reference's recurrent kernels ignore sequence_lens, clip, input_forget and custom activations, and
onnxruntime's run only in float32 with layout 0. So the gradient is checked in two steps: (1) the unrolled
forward the rule differentiates equals onnxruntime's fused op (float32, every configuration it runs), and
(2) the gradient equals finite differences of the fused op (onnx.reference, float64) where the reference
implements the configuration, and of the unrolled forward otherwise.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from onnxtrain.autodiff.check import check_gradients, gradient_model, run_model, single_node_model
from onnxtrain.autodiff.recurrent import expand_recurrent
from onnxtrain.ir.builder import GraphBuilder
from onnxtrain.ir.types import infer_tensor_info

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}

# (op, options); "reference" marks configurations onnx.reference implements (FD against the fused op).
CONFIGS = [
    ("RNN", {}, True), ("GRU", {}, True), ("LSTM", {}, True),
    ("RNN", {"direction": "reverse"}, True),
    ("GRU", {"direction": "bidirectional"}, True),
    ("LSTM", {"direction": "bidirectional", "peepholes": True}, True),
    ("GRU", {"linear_before_reset": 1}, True),
    ("LSTM", {"layout": 1}, True),
    ("GRU", {"layout": 1, "direction": "bidirectional"}, True),
    ("LSTM", {"initial_state": False, "bias": False}, True),
    ("LSTM", {"lens": [3, 1], "direction": "bidirectional"}, False),
    ("GRU", {"lens": [2, 3]}, False),
    ("RNN", {"lens": [1, 3], "direction": "reverse"}, False),
    ("LSTM", {"clip": 0.5}, False),
    ("LSTM", {"input_forget": 1}, False),
    ("RNN", {"activations": ["Relu"]}, False),
    ("GRU", {"activations": ["HardSigmoid", "Softsign"], "activation_alpha": [0.3], "activation_beta": [0.4]}, False),
]


def _ids():
    return [f"{op}-{'-'.join(f'{k}={v}' for k, v in opts.items()) or 'default'}" for op, opts, _ in CONFIGS]


def build(op: str, opts: dict, seq: int = 3, batch: int = 2, size: int = 3, hidden: int = 4, seed: int = 0):
    """A one-node model of ``op`` (float64) and its feeds; every float input is a graph input."""
    rng = np.random.default_rng(seed)
    opts = dict(opts)
    lens = opts.pop("lens", None)
    bias, initial, peep = opts.pop("bias", True), opts.pop("initial_state", True), opts.pop("peepholes", False)
    layout = opts.get("layout", 0)
    gates, dirs = GATES[op], 2 if opts.get("direction") == "bidirectional" else 1
    feeds = {"x": rng.standard_normal((batch, seq, size) if layout else (seq, batch, size)),
             "w": rng.standard_normal((dirs, gates * hidden, size)) * 0.5,
             "r": rng.standard_normal((dirs, gates * hidden, hidden)) * 0.5}
    order, consts = ["x", "w", "r"], {}
    state = (batch, dirs, hidden) if layout else (dirs, batch, hidden)
    optional = [("b", bias, (dirs, 2 * gates * hidden)), ("lens", lens is not None, None),
                ("h0", initial, state)]
    if op == "LSTM":
        optional += [("c0", initial, state), ("p", peep, (dirs, 3 * hidden))]
    for i, (name, present, shape) in enumerate(optional):
        if name == "lens" and present:
            consts["lens"] = np.asarray(lens, dtype=np.int32)
            order.append("lens")
        elif present:
            feeds[name] = rng.standard_normal(shape) * 0.5
            order.append(name)
        else:
            consts[f"_omit{i}"] = np.zeros(0)
            order.append(f"_omit{i}")
    while order[-1].startswith("_omit"):
        consts.pop(order.pop())
    model = single_node_model(op, feeds, n_outputs=3 if op == "LSTM" else 2, opset=22, constant_inputs=consts,
                              input_order=order, hidden_size=hidden, **opts)
    return model, feeds


def unrolled(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with its node replaced by the expansion the gradient rule differentiates."""
    b = GraphBuilder(22, prefix="unrolled/")
    outs = expand_recurrent(model.graph.node[0], infer_tensor_info(model), b)
    graph = helper.make_graph(b.nodes, "unrolled", list(model.graph.input),
                              [helper.make_tensor_value_info(o, model.graph.input[0].type.tensor_type.elem_type, None)
                               for o in outs], initializer=[*model.graph.initializer, *b.initializers])
    out = helper.make_model(graph, opset_imports=list(model.opset_import))
    out.ir_version = model.ir_version
    return out


def _float32(model: onnx.ModelProto) -> onnx.ModelProto:
    m = onnx.ModelProto.FromString(model.SerializeToString())
    for vi in [*m.graph.input, *m.graph.output]:
        if vi.type.tensor_type.elem_type == onnx.TensorProto.DOUBLE:
            vi.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    for t in m.graph.initializer:
        if t.data_type == onnx.TensorProto.DOUBLE:
            t.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(t).astype(np.float32), t.name))
    return m


@pytest.mark.parametrize("op,opts,reference", CONFIGS, ids=_ids())
def test_unrolled_forward_matches_onnxruntime(op, opts, reference):
    if opts.get("layout"):
        pytest.skip("onnxruntime's recurrent kernels support layout=0 only")
    model, feeds = build(op, opts)
    model32 = _float32(model)
    feeds32 = {k: v.astype(np.float32) for k, v in feeds.items()}
    fused = run_model(model32, feeds32, backend="ort")
    ours = run_model(unrolled(model32), feeds32, backend="ort")
    for a, b in zip(fused, ours):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op,opts,reference", CONFIGS, ids=_ids())
def test_gradient_matches_finite_differences(op, opts, reference):
    model, feeds = build(op, opts)
    if reference:
        report = check_gradients(model, feeds, list(feeds))
        assert report.ok, report
        return
    # onnx.reference ignores this configuration: the gradient graph of the fused op runs on onnxruntime
    # (float32) and is checked against FD of the unrolled forward in float64 (equal to onnxruntime's fused
    # op by the test above).
    report = check_gradients(unrolled(model), feeds, list(feeds))
    weights = {f"y{k}": w.astype(np.float32) for k, w in enumerate(report.weights.values())}
    ours = run_model(gradient_model(_float32(model), list(feeds), weights),
                     {k: v.astype(np.float32) for k, v in feeds.items()}, backend="ort")[1:]
    for (name, numeric), analytic in zip(report.numeric.items(), ours):
        np.testing.assert_allclose(analytic, numeric, rtol=1e-3, atol=1e-4, err_msg=f"d{name}")


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_matches_torch(op):
    """torch.nn.LSTM/GRU with the same weights (gate orders differ: torch LSTM i f g o, ONNX i o f c; torch
    GRU r z n, ONNX z r h, with linear_before_reset=1)."""
    torch = pytest.importorskip("torch")
    seq, batch, size, hidden = 4, 2, 3, 5
    module = (torch.nn.LSTM if op == "LSTM" else torch.nn.GRU)(size, hidden, bidirectional=True).double()
    order = [0, 3, 1, 2] if op == "LSTM" else [1, 0, 2]             # ONNX gate k = torch gate order[k]

    def onnx_layout(t):                                             # (G*H, ...) torch -> ONNX gate order
        return torch.cat([t.reshape(len(order), hidden, *t.shape[1:])[k] for k in order])

    params = dict(module.named_parameters())
    w = torch.stack([onnx_layout(params[f"weight_ih_l0{s}"]) for s in ("", "_reverse")])
    r = torch.stack([onnx_layout(params[f"weight_hh_l0{s}"]) for s in ("", "_reverse")])
    b = torch.stack([torch.cat([onnx_layout(params[f"bias_ih_l0{s}"]), onnx_layout(params[f"bias_hh_l0{s}"])])
                     for s in ("", "_reverse")])
    x = torch.randn(seq, batch, size, dtype=torch.float64, requires_grad=True)
    y, _ = module(x)                                               # (seq, batch, 2 * hidden)
    weight = torch.randn(seq, 2, batch, hidden, dtype=torch.float64)
    loss = (y.reshape(seq, batch, 2, hidden).transpose(1, 2) * weight).sum()
    loss.backward()

    feeds = {"x": x.detach().numpy(), "w": w.detach().numpy(), "r": r.detach().numpy(), "b": b.detach().numpy()}
    attrs = {"linear_before_reset": 1} if op == "GRU" else {}
    model = single_node_model(op, feeds, n_outputs=1, opset=22, hidden_size=hidden, direction="bidirectional",
                              **attrs)
    grads = run_model(gradient_model(model, list(feeds), {"y0": weight.numpy()}), feeds)[1:]
    np.testing.assert_allclose(grads[0], x.grad.numpy(), rtol=1e-7, atol=1e-9)
    expected_w = torch.stack([onnx_layout(params[f"weight_ih_l0{s}"].grad) for s in ("", "_reverse")])
    np.testing.assert_allclose(grads[1], expected_w.numpy(), rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("op,opts,reference", CONFIGS, ids=_ids())
def test_dynamic_sequence_length(op, opts, reference):
    """A sequence length known only at run time: each direction runs as a Scan over one step; its gradient
    equals the unrolled one of the same model with a static length (both float32, on onnxruntime)."""
    if opts.get("layout"):
        pytest.skip("onnxruntime's recurrent kernels support layout=0 only")
    model, feeds = build(op, opts)
    rng = np.random.default_rng(5)
    outputs = run_model(_float32(model), {k: v.astype(np.float32) for k, v in feeds.items()}, backend="ort")
    weights = {f"y{k}": rng.standard_normal(o.shape) for k, o in enumerate(outputs)}
    weights32 = {k: w.astype(np.float32) for k, w in weights.items()}
    feeds32 = {k: v.astype(np.float32) for k, v in feeds.items()}
    expected = run_model(gradient_model(_float32(model), list(feeds), weights32), feeds32, backend="ort")[1:]
    dynamic = _float32(model)
    for axis, name in enumerate(("seq", "batch")):
        dynamic.graph.input[0].type.tensor_type.shape.dim[axis].dim_param = name
    for out in dynamic.graph.output:
        out.type.tensor_type.ClearField("shape")
    gmodel = gradient_model(dynamic, list(feeds), weights32)
    assert any(n.op_type == "Scan" for n in gmodel.graph.node)
    got = run_model(gmodel, feeds32, backend="ort")[1:]
    for name, e, g in zip(feeds, expected, got):
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5 * (1 + np.abs(e).max()), err_msg=f"d{name}")
