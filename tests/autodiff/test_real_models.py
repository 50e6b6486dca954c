"""Models exported by torch: every parameter's gradient matches torch autograd.

A U-Net-like model (Conv, BatchNormalization, MaxPool, ConvTranspose, Resize, Concat), an LSTM and a GRU
sequence classifier, and a transformer encoder layer (LayerNormalization, attention, Gelu). Each runs in
float64 on onnx.reference and in float32 on onnxruntime (the runtime the training graphs use).
"""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import pytest

from onnxtrain.autodiff.check import gradient_model, run_model

torch = pytest.importorskip("torch")
nn, F = torch.nn, torch.nn.functional


class UNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc1, self.bn1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.enc2 = nn.Conv2d(8, 16, 3, padding=1)
        self.up = nn.ConvTranspose2d(16, 8, 2, stride=2)
        self.dec = nn.Conv2d(16, 8, 3, padding=1)
        self.head = nn.Conv2d(8, 2, 1)

    def forward(self, x):
        e1 = F.relu(self.bn1(self.enc1(x)))
        e2 = F.relu(self.enc2(F.max_pool2d(e1, 2)))
        skip = F.interpolate(e2, scale_factor=2.0, mode="bilinear", align_corners=False)[:, :8]
        d = F.relu(self.dec(torch.cat([self.up(e2) + skip, e1], 1)))
        return self.head(d)


class Recurrent(nn.Module):
    def __init__(self, cell):
        super().__init__()
        self.rnn = cell(5, 6, batch_first=True, bidirectional=True)
        self.head = nn.Linear(12, 3)

    def forward(self, x):
        y, _ = self.rnn(x)
        return self.head(y[:, -1])


class Block(nn.Module):
    """A pre-LN causal transformer block (nn.TransformerEncoderLayer does not export with the TorchScript
    exporter): LayerNormalization, Split, attention with an additive causal mask, Softmax, Gelu (erf)."""

    def __init__(self, d: int = 8, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for z in self.qkv(self.ln1(x)).chunk(3, dim=-1))
        mask = torch.triu(torch.full((t, t), -1e9, dtype=x.dtype), diagonal=1)
        attention = torch.softmax(q @ k.transpose(-2, -1) / (d // self.heads) ** 0.5 + mask, dim=-1)
        x = x + self.proj((attention @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


MODELS = {
    "unet": (UNet, (2, 3, 8, 8)),
    "lstm": (lambda: Recurrent(nn.LSTM), (2, 4, 5)),
    "gru": (lambda: Recurrent(nn.GRU), (2, 4, 5)),
    "transformer": (Block, (2, 5, 8)),
}


def export(module, x) -> onnx.ModelProto:
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (x,), f, dynamo=False, opset_version=17, do_constant_folding=False,
                          input_names=["x"], output_names=["y"])
    return onnx.load_from_string(f.getvalue())


def params_as_inputs(model: onnx.ModelProto, names: list[str]) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Move the initializers ``names`` to graph inputs (so they are fed, like parameters are)."""
    m = onnx.ModelProto.FromString(model.SerializeToString())
    values = {i.name: onnx.numpy_helper.to_array(i) for i in m.graph.initializer if i.name in names}
    keep = [i for i in m.graph.initializer if i.name not in names]
    del m.graph.initializer[:]
    m.graph.initializer.extend(keep)
    m.graph.input.extend(onnx.helper.make_tensor_value_info(k, onnx.helper.np_dtype_to_tensor_dtype(v.dtype),
                                                            v.shape) for k, v in values.items())
    return m, values


def _distinct_parameters(module) -> None:
    """Perturb parameters and buffers: the exporter de-duplicates equal tensors (a LayerNorm's ones weight
    and a BatchNorm's ones running_var become one initializer and an Identity), which ties them in the graph."""
    with torch.no_grad():
        for t in [*module.parameters(), *module.buffers()]:
            if t.is_floating_point():
                t.copy_(torch.rand_like(t) + 0.5 if t.dim() == 1 else t + 0.01 * torch.randn_like(t))


@pytest.mark.parametrize("dtype,backend", [("float64", "reference"), ("float32", "ort")])
@pytest.mark.parametrize("name", list(MODELS))
def test_parameter_gradients_match_torch(name, dtype, backend):
    make, shape = MODELS[name]
    torch.manual_seed(0)
    module = make().to(getattr(torch, dtype)).eval()
    _distinct_parameters(module)
    x = torch.randn(*shape, dtype=getattr(torch, dtype), requires_grad=True)
    model = export(module, x)
    params = dict(module.named_parameters())
    exported = [n for n in params if any(i.name == n for i in model.graph.initializer)]
    assert len(exported) == len(params), f"parameters not kept as initializers: {set(params) - set(exported)}"
    model, feeds = params_as_inputs(model, exported)
    feeds["x"] = x.detach().numpy()

    y = module(x)
    weight = torch.randn(*y.shape, dtype=y.dtype)
    (y * weight).sum().backward()
    grads = run_model(gradient_model(model, ["x", *exported], {"y": weight.numpy()}), feeds, backend=backend)[1:]
    tight = dtype == "float64"
    for n, g in zip(["x", *exported], grads):
        expected = (x if n == "x" else params[n]).grad.numpy()
        scale = float(np.abs(expected).max())
        np.testing.assert_allclose(g, expected, rtol=1e-6 if tight else 2e-3,
                                   atol=(1e-9 if tight else 2e-4) * (1 + scale), err_msg=f"{name}: d{n}")


def _tiny_bert():
    """The benchmark's transformer workload (bench/workloads.py), at a small size."""
    import sys
    from pathlib import Path

    bench = str(Path(__file__).resolve().parents[2] / "bench")
    if bench not in sys.path:
        sys.path.insert(0, bench)
    workloads = pytest.importorskip("workloads")
    return workloads.TinyBert(vocab=50, seq=6, d=8, layers=2, heads=2, ffn=16, classes=3)


@pytest.mark.parametrize("dtype,backend", [("float64", "reference"), ("float32", "ort")])
def test_transformer_workload_matches_torch(dtype, backend):
    """TinyBert exported as the benchmark does it (opset 17, symbolic batch axis): embedding Gather,
    LayerNormalization, attention, Gelu, a mean over the sequence."""
    torch.manual_seed(0)
    module = _tiny_bert().to(getattr(torch, dtype)).eval()
    _distinct_parameters(module)
    ids = torch.randint(0, 50, (4, 6))
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (ids,), f, dynamo=False, opset_version=17, do_constant_folding=False,
                          input_names=["input"], output_names=["output"],
                          dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}})
    model = onnx.load_from_string(f.getvalue())
    params = dict(module.named_parameters())
    names = [n for n in params if any(i.name == n for i in model.graph.initializer)]
    assert len(names) == len(params)
    model, feeds = params_as_inputs(model, names)
    feeds["input"] = ids.numpy()
    y = module(ids)
    weight = torch.randn(*y.shape, dtype=y.dtype)
    (y * weight).sum().backward()
    grads = run_model(gradient_model(model, names, {"output": weight.numpy()}), feeds, backend=backend)[1:]
    for n, g in zip(names, grads):
        expected = params[n].grad.numpy()
        scale = float(np.abs(expected).max())
        tight = dtype == "float64"
        np.testing.assert_allclose(g, expected, rtol=1e-6 if tight else 2e-3,
                                   atol=(1e-9 if tight else 2e-4) * (1 + scale), err_msg=f"d{n}")
