"""The custom-loss example of the peer's documentation: a weighted average of two MSE losses as an onnxblock.Block.

Source: https://onnxruntime.ai/docs/api/python/on_device_training/training_artifacts.html (Custom Loss), i.e.
https://github.com/microsoft/onnxruntime/blob/main/docs/python/on_device_training/training_artifacts.rst
Adapted: the imports; the docs' "model.onnx" with two outputs and weight1..bias3 is built here with onnx.helper.
The block is as documented, including its __init__ that does not call super().__init__().
"""

import os

import numpy as np
import onnx
from onnx import helper, numpy_helper

import onnxtrain.onnxblock as onnxblock  # was: import onnxruntime.training.onnxblock as onnxblock
from onnxtrain import artifacts  # was: from onnxruntime.training import artifacts
from onnxtrain.api import CheckpointState, Module, Optimizer  # was: from onnxruntime.training.api import ...


class WeightedAverageLoss(onnxblock.Block):
    def __init__(self):
        self._loss1 = onnxblock.loss.MSELoss()
        self._loss2 = onnxblock.loss.MSELoss()
        self._w1 = onnxblock.blocks.Constant(0.4)
        self._w2 = onnxblock.blocks.Constant(0.6)
        self._add = onnxblock.blocks.Add()
        self._mul = onnxblock.blocks.Mul()

    def build(self, loss_input_name1, loss_input_name2):
        return self._add(
            self._mul(self._w1(), self._loss1(loss_input_name1, target_name="target1")),
            self._mul(self._w2(), self._loss2(loss_input_name2, target_name="target2"))
        )


def _two_output_model(path):
    """x -> h = relu(x W3 + b3) (frozen) -> output1 = h W1 + b1, output2 = h W2 + b2."""
    rng = np.random.default_rng(0)
    w = {"weight3": rng.normal(0, 0.5, (6, 8)), "bias3": np.zeros(8), "weight1": rng.normal(0, 0.5, (8, 3)),
         "bias1": np.zeros(3), "weight2": rng.normal(0, 0.5, (8, 2)), "bias2": np.zeros(2)}
    nodes = [helper.make_node("Gemm", ["x", "weight3", "bias3"], ["h0"]), helper.make_node("Relu", ["h0"], ["h"]),
             helper.make_node("Gemm", ["h", "weight1", "bias1"], ["output1"]),
             helper.make_node("Gemm", ["h", "weight2", "bias2"], ["output2"])]
    graph = helper.make_graph(nodes, "two_outputs", [helper.make_tensor_value_info("x", 1, ["batch", 6])],
                              [helper.make_tensor_value_info("output1", 1, ["batch", 3]),
                               helper.make_tensor_value_info("output2", 1, ["batch", 2])],
                              [numpy_helper.from_array(v.astype(np.float32), k) for k, v in w.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return {k: v.astype(np.float32) for k, v in w.items()}


def test_weighted_average_custom_loss(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    weights = _two_output_model("model.onnx")

    my_custom_loss = WeightedAverageLoss()
    model_path = "model.onnx"
    base_model = onnx.load(model_path)
    requires_grad = ["weight1", "bias1", "weight2", "bias2"]
    frozen_params = ["weight3", "bias3"]
    artifacts.generate_artifacts(base_model, requires_grad=requires_grad, frozen_params=frozen_params,
                                 loss=my_custom_loss, optimizer=artifacts.OptimType.AdamW)
    # "Successful completion of the above call will generate 4 files in the current working directory"
    assert {"training_model.onnx", "eval_model.onnx", "checkpoint", "optimizer_model.onnx"} <= set(os.listdir("."))

    state = CheckpointState.load_checkpoint("checkpoint")
    module = Module("training_model.onnx", state, "eval_model.onnx")
    optimizer = Optimizer("optimizer_model.onnx", module)
    assert module.input_names() == ["x", "target1", "target2"]

    rng = np.random.default_rng(1)
    x = rng.standard_normal((16, 6)).astype(np.float32)
    t1, t2 = rng.standard_normal((16, 3)).astype(np.float32), rng.standard_normal((16, 2)).astype(np.float32)
    h = np.maximum(x @ weights["weight3"] + weights["bias3"], 0)
    expected = (0.4 * np.mean((h @ weights["weight1"] - t1) ** 2) + 0.6 * np.mean((h @ weights["weight2"] - t2) ** 2))
    module.eval()
    np.testing.assert_allclose(module(x, t1, t2), expected, rtol=1e-5)

    module.train()
    losses = []
    for _ in range(30):
        losses.append(float(np.squeeze(module(x, t1, t2))))  # the peer's loss has shape [1] here
        optimizer.step()
        module.lazy_reset_grad()
    assert losses[-1] < 0.95 * losses[0]
    np.testing.assert_array_equal(state.parameters["weight3"].data, weights["weight3"])
    assert not np.allclose(state.parameters["weight1"].data, weights["weight1"])
