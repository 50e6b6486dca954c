"""Models below opset 13 are converted to opset 17; a training-mode export at opset 12 carries BatchNormalization
nodes with 5 outputs (training mode then meant the output count), which the ONNX converter alone refuses."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from onnxtrain.api import CheckpointState, Module
from onnxtrain.artifacts import LossType, OptimType, generate_artifacts

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("OPSET", [12, 17])
def test_opset_12_training_mode_batchnorm_converts(tmp_path, OPSET):  # noqa: N803
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                              torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 3))
    path = tmp_path / "bn12.onnx"
    torch.onnx.export(net, (torch.randn(2, 3, 8, 8),), str(path), input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "N"}}, opset_version=OPSET, do_constant_folding=False,
                      training=torch.onnx.TrainingMode.TRAINING, dynamo=False)
    bn = [n for n in onnx.load(str(path)).graph.node if n.op_type == "BatchNormalization"]
    assert len(bn) == 1 and len(bn[0].output) == (5 if OPSET == 12 else 3)  # 5: what makes this case
    paths = generate_artifacts(str(path), loss=LossType.CrossEntropyLoss, optimizer=OptimType.SGD,
                               artifact_directory=tmp_path)
    module = Module(paths["training"], CheckpointState.load_checkpoint(paths["checkpoint"]), paths["eval"])
    x = np.random.default_rng(0).standard_normal((5, 3, 8, 8)).astype(np.float32)
    module(x, np.array([0, 1, 2, 0, 1]))  # training mode: batch statistics, running statistics updated
    module.export_model_for_inferencing(str(tmp_path / "inference.onnx"))
    got = ort.InferenceSession(str(tmp_path / "inference.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    net[1].momentum = 0.1
    with torch.no_grad():
        net.train()(torch.from_numpy(x))  # the same running-statistics update in torch
        want = net.eval()(torch.from_numpy(x)).numpy()
    # rtol 1e-3: ONNX's BatchNormalization updates the running variance with the biased batch variance, torch with
    # the unbiased one (n / (n - 1) = 180 / 179 here); the same at opset 17, with no conversion.
    np.testing.assert_allclose(got[0], want, rtol=1e-3, atol=1e-5)
