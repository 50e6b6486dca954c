"""Models as the ONNX Model Zoo has them (opsets 6-7, IR version 3): BatchNormalization with ``spatial``,
Upsample with a ``scales`` attribute, Slice and Pad with attributes, Dropout with a ``ratio`` attribute, Gemm
with ``broadcast``, and every initializer also listed as a graph input; and torch exports at opsets 9-11.
generate_artifacts converts them to opset 17; gradients by finite differences (and against torch), training at
two batch sizes, and the exported model against the original.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto
from onnx import helper as h
from onnx import numpy_helper as nh
from onnx.reference import ReferenceEvaluator

from onnxtrain.artifacts import LossType
from tests.foreign.harness import Trained, finite_difference_errors


def _model(nodes, inits, in_shape, out_shape, opset: int) -> onnx.ModelProto:
    """IR version 3: initializers are graph inputs too, as exporters of that time wrote them."""
    inputs = [h.make_tensor_value_info("x", TensorProto.FLOAT, in_shape)]
    inputs += [h.make_tensor_value_info(i.name, i.data_type, i.dims) for i in inits]
    graph = h.make_graph(nodes, "old", inputs, [h.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", opset)])
    model.ir_version = 3
    onnx.checker.check_model(model)
    return model


def cnn_opset7() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = lambda name, shape, scale=0.3: nh.from_array((scale * rng.standard_normal(shape)).astype(np.float32), name)  # noqa: E731
    nodes = [
        h.make_node("Conv", ["x", "conv.w", "conv.b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        h.make_node("BatchNormalization", ["c", "bn.scale", "bn.bias", "bn.mean", "bn.var"], ["b"], spatial=1),
        h.make_node("Relu", ["b"], ["r"]),
        h.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        h.make_node("Upsample", ["p"], ["u"], scales=[1.0, 1.0, 2.0, 2.0], mode="nearest"),
        h.make_node("Slice", ["u"], ["s"], starts=[1, 1], ends=[7, 7], axes=[2, 3]),
        h.make_node("Pad", ["s"], ["q"], pads=[0, 0, 1, 0, 0, 0, 0, 1], mode="constant", value=0.5),
        h.make_node("Dropout", ["q"], ["d"], ratio=0.3),
        h.make_node("Flatten", ["d"], ["f"], axis=1),
        h.make_node("Gemm", ["f", "fc.w", "fc.b"], ["y"], transB=1),
    ]
    inits = [w("conv.w", (4, 2, 3, 3)), w("conv.b", (4,)),
             nh.from_array((1 + 0.2 * rng.random(4)).astype(np.float32), "bn.scale"), w("bn.bias", (4,)),
             w("bn.mean", (4,), 0.1), nh.from_array((0.5 + rng.random(4)).astype(np.float32), "bn.var"),
             w("fc.w", (3, 4 * 7 * 7), 0.1), w("fc.b", (3,))]
    return _model(nodes, inits, ["N", 2, 8, 8], ["N", 3], 7)


def mlp_opset6() -> onnx.ModelProto:
    """Gemm-6 with ``broadcast=1`` (its bias broadcast was explicit before opset 7)."""
    rng = np.random.default_rng(1)
    w = lambda name, shape: nh.from_array((0.4 * rng.standard_normal(shape)).astype(np.float32), name)  # noqa: E731
    nodes = [h.make_node("Gemm", ["x", "fc1.w", "fc1.b"], ["a"], transB=1, broadcast=1),
             h.make_node("Tanh", ["a"], ["t"]),
             h.make_node("Gemm", ["t", "fc2.w", "fc2.b"], ["y"], broadcast=1, alpha=0.5)]
    return _model(nodes, [w("fc1.w", (6, 5)), w("fc1.b", (6,)), w("fc2.w", (6, 4)), w("fc2.b", (4,))],
                  ["N", 5], ["N", 4], 6)


MODELS = {"cnn_opset7": (cnn_opset7, (2, 8, 8), 3), "mlp_opset6": (mlp_opset6, (5,), 4)}


@pytest.mark.parametrize("name", list(MODELS))
def test_old_opset_model_converts_trains_and_exports(tmp_path, name):
    build, shape, classes = MODELS[name]
    source = build()
    run = Trained(source, tmp_path, LossType.CrossEntropyLoss)
    assert onnx.load(run.paths["training"]).opset_import[0].version == 17
    if name == "cnn_opset7":  # inference-mode BatchNorm: statistics stay constants, scale and bias train
        assert {"conv.w", "bn.scale", "bn.bias"} <= set(run.trainable) and "bn.mean" not in run.trainable
    rng = np.random.default_rng(2)
    x = rng.standard_normal((5, *shape)).astype(np.float32)
    y = rng.integers(0, classes, 5)

    errors = finite_difference_errors(run, [x, y], per_parameter=4)
    assert len(errors) == len(run.trainable) and max(errors.values()) <= 1.0, errors

    exported = onnx.load(run.export())
    assert [i.name for i in exported.graph.input] == ["x"]  # the initializers listed as inputs are weights
    if source.opset_import[0].version < 7:  # onnxruntime no longer runs Gemm-6
        original = ReferenceEvaluator(source).run(None, {"x": x})[0]
    else:
        original = ort.InferenceSession(source.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, {"x": x})[0]
    session = ort.InferenceSession(exported.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, {"x": x})[0], original, rtol=1e-5, atol=1e-6)

    losses = run.train(5, x, y)
    assert losses[-1] < losses[0], losses
    run.train(1, x[:2], y[:2])  # another batch size, same artifacts


@pytest.mark.parametrize("opset", [9, 10, 11])
def test_torch_exports_at_opsets_9_to_11_match_torch(tmp_path, opset):
    """What the Model Zoo's torch-made files hold: Upsample (9) or Resize (10, 11), Slice with attributes (9) or
    inputs, Pad with attributes (9, 10) or a computed pads input (11), inference-mode BatchNorm (no ``spatial``
    from 9 on), a dynamic batch axis."""
    torch = pytest.importorskip("torch")
    import io
    import warnings

    F = torch.nn.functional

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn = torch.nn.Conv2d(2, 4, 3, padding=1), torch.nn.BatchNorm2d(4)
            self.drop, self.fc = torch.nn.Dropout(0.3), torch.nn.Linear(4 * 7 * 7, 3)

        def forward(self, x):
            h = F.interpolate(F.max_pool2d(F.relu(self.bn(self.conv(x))), 2), scale_factor=2.0, mode="nearest")
            h = F.pad(h[:, :, 1:, 1:][:, :, :6, :6], (1, 0, 0, 1), value=0.5)
            return self.fc(self.drop(h).flatten(1))

    torch.manual_seed(0)
    net = Net().eval()
    with torch.no_grad():
        for p in [*net.parameters(), *net.buffers()]:
            if p.is_floating_point():  # distinct values: the exporter merges equal tensors into aliases
                p.copy_(torch.rand_like(p) + 0.5 if p.dim() == 1 else p + 0.05 * torch.randn_like(p))
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (torch.randn(2, 2, 8, 8),), buffer, dynamo=False, opset_version=opset,
                          do_constant_folding=False, input_names=["x"], output_names=["y"],
                          dynamic_axes={"x": {0: "N"}, "y": {0: "N"}})
    run = Trained(onnx.load_from_string(buffer.getvalue()), tmp_path, LossType.CrossEntropyLoss)
    params = dict(net.named_parameters())
    assert set(run.trainable) == set(params)
    rng = np.random.default_rng(opset)
    x, y = rng.standard_normal((5, 2, 8, 8)).astype(np.float32), rng.integers(0, 3, 5)
    loss, grads = run.gradients(x, y)
    ref = F.cross_entropy(net(torch.from_numpy(x)), torch.from_numpy(y))
    ref.backward()
    assert abs(loss - float(ref)) <= 1e-5 * float(ref)
    for name, p in params.items():
        want = p.grad.numpy()
        assert np.linalg.norm(grads[name] - want) <= 1e-4 * np.linalg.norm(want) + 1e-7, name
    errors = finite_difference_errors(run, [x, y], per_parameter=3)
    assert max(errors.values()) <= 1.0, errors
    session = ort.InferenceSession(str(run.export()), providers=["CPUExecutionProvider"])
    with torch.no_grad():
        np.testing.assert_allclose(session.run(None, {"x": x})[0], net(torch.from_numpy(x)).numpy(), rtol=1e-4,
                                   atol=1e-5)


@pytest.mark.parametrize("opset", [12, 13])
def test_training_mode_batchnorm_before_opset_14_trains_as_torch(tmp_path, opset):
    """Before opset 14 a BatchNormalization is in training mode when it outputs its running statistics (the
    TorchScript exporter with ``training=TRAINING``); at opset 13 it was kept as it was and differentiated as in
    inference mode: the loss right, the gradients of everything before it wrong, the statistics never updated."""
    torch = pytest.importorskip("torch")
    import io
    import warnings

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                              torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 3)).train()
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (torch.randn(2, 1, 8, 8),), buffer, dynamo=False, opset_version=opset,
                          training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False, input_names=["x"],
                          output_names=["y"], dynamic_axes={"x": {0: "N"}, "y": {0: "N"}})
    run = Trained(onnx.load_from_string(buffer.getvalue()), tmp_path, LossType.MSELoss)
    assert set(run.state.buffers) == {"1.running_mean", "1.running_var"}
    rng = np.random.default_rng(opset)
    x, y = rng.standard_normal((4, 1, 8, 8)).astype(np.float32), rng.standard_normal((4, 3)).astype(np.float32)
    loss, grads = run.gradients(x, y)
    ref = torch.nn.functional.mse_loss(net(torch.from_numpy(x)), torch.from_numpy(y))
    ref.backward()
    assert abs(loss - float(ref)) <= 1e-5 * float(ref)
    for name in ("0.weight", "1.weight", "4.weight"):
        want = dict(net.named_parameters())[name].grad.numpy()
        assert np.linalg.norm(grads[name] - want) <= 1e-4 * np.linalg.norm(want), name
    np.testing.assert_allclose(run.state.buffers["1.running_mean"], net[1].running_mean.numpy(), rtol=1e-5, atol=1e-6)
