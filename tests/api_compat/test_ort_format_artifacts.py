"""``generate_artifacts(..., ort_format=True)`` for a mobile app, then the same artifacts validated in Python by
their .ort paths (the mobile samples' apps load the ORT-format files).

Source: generate_artifacts' docstring, ``ort_format``: "Whether to save the generated artifacts in ORT format"
(https://github.com/microsoft/onnxruntime/blob/main/orttraining/orttraining/python/training/artifacts.py) and the
Android sample's training loop (https://github.com/microsoft/onnxruntime-training-examples/blob/master/on_device_training/mobile/android/c-cpp/train.ipynb).
Adapted: the imports; a small model built with onnx.helper. onnxtrain's Python runtime reads ONNX; given a .ort
path it reads the .onnx generate_artifacts wrote beside it, and without one it says so.
"""

import os

import numpy as np
import pytest
from onnx import helper, numpy_helper

from onnxtrain import artifacts  # was: from onnxruntime.training import artifacts
from onnxtrain.api import CheckpointState, Module, Optimizer  # was: from onnxruntime.training.api import ...


def test_ort_format_artifacts_by_their_ort_paths(tmp_path):
    rng = np.random.default_rng(0)
    weights = {"W": rng.normal(0, 0.5, (6, 4)).astype(np.float32), "B": np.zeros(4, np.float32)}
    graph = helper.make_graph([helper.make_node("Gemm", ["x", "W", "B"], ["logits"])], "m",
                              [helper.make_tensor_value_info("x", 1, ["N", 6])],
                              [helper.make_tensor_value_info("logits", 1, ["N", 4])],
                              [numpy_helper.from_array(v, k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    out = str(tmp_path)
    artifacts.generate_artifacts(model, requires_grad=["W", "B"], loss=artifacts.LossType.CrossEntropyLoss,
                                 optimizer=artifacts.OptimType.AdamW, artifact_directory=out, prefix="app_",
                                 ort_format=True)
    for kind in ("training", "eval", "optimizer"):
        assert os.path.exists(f"{out}/app_{kind}_model.ort")

    state = CheckpointState.load_checkpoint(f"{out}/app_checkpoint")
    model = Module(f"{out}/app_training_model.ort", state, f"{out}/app_eval_model.ort")
    optimizer = Optimizer(f"{out}/app_optimizer_model.ort", model)
    x = rng.standard_normal((8, 6)).astype(np.float32)
    y = rng.integers(0, 4, 8).astype(np.int64)
    losses = []
    for _ in range(5):
        losses.append(float(model(x, y)))
        optimizer.step()
        model.lazy_reset_grad()
    assert losses[-1] < losses[0]

    os.remove(f"{out}/app_eval_model.onnx")
    with pytest.raises(ValueError, match=r"app_eval_model.ort' is in ORT format.*app_eval_model.onnx' is missing"):
        Module(f"{out}/app_training_model.ort", state, f"{out}/app_eval_model.ort")
