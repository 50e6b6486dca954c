"""Depthwise convolution and training-mode BatchNormalization gradients at the sizes of real layers
(test_rules.py's rows are small): strides, unequal strides, asymmetric pads, dilations, 1-D and 3-D, dY with
100+ positions (the sizes where the cropping of the depthwise weight gradient and the output padding of
ConvTranspose matter). Each against finite differences (float64, onnx.reference) and torch, and in float32 on
onnxruntime.
"""

from __future__ import annotations

import numpy as np
import pytest

from onnxtrain.autodiff.check import check_gradients, gradient_model, run_model, single_node_model

torch = pytest.importorskip("torch")
rng = np.random.default_rng(42)

# (input shape, kernel, strides, pads (begin..., end...), dilations): depthwise, 1-3 spatial axes
DEPTHWISE = [
    ((2, 3, 12, 11), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    ((2, 3, 21, 22), (3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),       # stride phases, odd and even sizes
    ((1, 2, 25, 23), (3, 2), (2, 3), (0, 1, 2, 0), (1, 1)),       # unequal strides, asymmetric pads
    ((1, 2, 16, 15), (3, 3), (1, 1), (2, 2, 2, 2), (2, 2)),       # dilation
    ((1, 2, 23, 24), (3, 3), (2, 1), (1, 0, 0, 1), (2, 3)),       # stride and dilation together
    ((2, 4, 130), (5,), (1,), (2, 2), (1,)),                      # 1-D
    ((1, 2, 6, 5, 6), (3, 3, 3), (1, 1, 1), (1, 1, 1, 1, 1, 1), (1, 1, 1)),  # 3-D
]


def _torch_conv(x, w, strides, pads, dilations, group):
    n = len(strides)
    pad = [p for i in reversed(range(n)) for p in (pads[i], pads[i + n])]   # F.pad: last axis first
    conv = {1: torch.nn.functional.conv1d, 2: torch.nn.functional.conv2d, 3: torch.nn.functional.conv3d}[n]
    return conv(torch.nn.functional.pad(x, pad), w, stride=strides, dilation=dilations, groups=group)


@pytest.mark.parametrize("shape,kernel,strides,pads,dilations", DEPTHWISE, ids=[str(c[0]) for c in DEPTHWISE])
def test_depthwise_gradients(shape, kernel, strides, pads, dilations):
    c = shape[1]
    inputs = {"x": rng.standard_normal(shape), "w": rng.standard_normal((c, 1, *kernel))}
    attrs = dict(group=c, strides=list(strides), pads=list(pads), dilations=list(dilations))
    model = single_node_model("Conv", inputs, **attrs)
    report = check_gradients(model, inputs, ["x", "w"], max_elements=40)
    assert report.ok, str(report)

    x, w = (torch.tensor(v, requires_grad=True) for v in inputs.values())
    y = _torch_conv(x, w, strides, pads, dilations, c)
    (y * torch.tensor(report.weights["y0"])).sum().backward()
    np.testing.assert_allclose(report.analytic["w"], w.grad.numpy(), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(report.analytic["x"], x.grad.numpy(), rtol=1e-9, atol=1e-9)

    f32 = {k: v.astype(np.float32) for k, v in inputs.items()}
    model32 = single_node_model("Conv", f32, **attrs)
    weights32 = {k: v.astype(np.float32) for k, v in report.weights.items()}
    got = run_model(gradient_model(model32, ["w"], weights32), f32, backend="ort")[1]
    np.testing.assert_allclose(got, report.analytic["w"], rtol=1e-4, atol=1e-4 * np.abs(report.analytic["w"]).max())


@pytest.mark.parametrize("shape", [(4, 3, 5, 6), (6, 2), (3, 4, 5)], ids=["4d", "2d", "3d"])
def test_batch_normalization_training_gradient(shape):
    c = shape[1]
    inputs = {"x": rng.standard_normal(shape) * 2 + 1, "s": rng.standard_normal(c), "b": rng.standard_normal(c)}
    consts = {"m": rng.standard_normal(c), "v": rng.uniform(0.5, 1.5, c)}
    model = single_node_model("BatchNormalization", inputs, constant_inputs=consts, training_mode=1)
    report = check_gradients(model, inputs, ["x", "s", "b"])
    assert report.ok, str(report)
    x, s, b = (torch.tensor(v, requires_grad=True) for v in inputs.values())
    y = torch.nn.functional.batch_norm(x, None, None, s, b, training=True)
    (y * torch.tensor(report.weights["y0"])).sum().backward()
    for name, t in zip("xsb", (x, s, b)):
        np.testing.assert_allclose(report.analytic[name], t.grad.numpy(), rtol=1e-7, atol=1e-9, err_msg=name)

    # onnxruntime wants training-mode BatchNormalization's three outputs; the check weights the first only
    f32 = {k: v.astype(np.float32) for k, v in inputs.items()}
    model32 = single_node_model("BatchNormalization", f32, n_outputs=3, training_mode=1,
                                constant_inputs={k: v.astype(np.float32) for k, v in consts.items()})
    got = run_model(gradient_model(model32, ["x"], {"y0": report.weights["y0"].astype(np.float32)}), f32,
                    backend="ort")[1]
    np.testing.assert_allclose(got, report.analytic["x"], rtol=1e-3, atol=1e-4)


def test_depthwise_conv_transpose_weight_gradient():
    """ConvTranspose's dW is the Conv weight gradient with the roles of X and dY swapped: it must read the output
    gradient's padded extent (output_padding included) exactly."""
    inputs = {"x": rng.standard_normal((2, 3, 12, 11)), "w": rng.standard_normal((3, 1, 3, 3))}
    attrs = dict(group=3, strides=[2, 2], pads=[1, 0, 1, 1], output_padding=[1, 1])
    model = single_node_model("ConvTranspose", inputs, **attrs)
    report = check_gradients(model, inputs, ["w"])   # onnx.reference's ConvTranspose is slow: dW only
    assert report.ok, str(report)
    x, w = (torch.tensor(v, requires_grad=True) for v in inputs.values())
    y = torch.nn.functional.conv_transpose2d(x, w, stride=2, padding=0, output_padding=1, groups=3)
    y = y[:, :, 1:-1, 0:-1]   # ONNX pads [1, 0, 1, 1] crop the full output on each side
    (y * torch.tensor(report.weights["y0"])).sum().backward()
    np.testing.assert_allclose(report.analytic["w"], w.grad.numpy(), rtol=1e-9, atol=1e-9)
