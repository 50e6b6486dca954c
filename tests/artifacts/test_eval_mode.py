"""EvalMode's stochastic depth: a training-mode TorchScript export writes drop path as a product with a random
mask; the eval and exported inference models must pass the branch on as torch's eval mode does, while training
stays stochastic."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxtrain import artifacts
from onnxtrain.api import CheckpointState, Module
from onnxtrain.artifacts.passes import EvalMode

torch = pytest.importorskip("torch")

RANDOM = {"RandomUniform", "RandomUniformLike", "RandomNormal", "RandomNormalLike", "Bernoulli"}


def hf_drop_path(x, keep: float):
    """Hugging Face's ``drop_path`` (BEiT, Swin, ConvNeXt ...): floor of keep + uniform, input divided by keep."""
    shape = (x.shape[0],) + (1,) * (x.ndim - 1)
    mask = keep + torch.rand(shape, dtype=x.dtype)
    return x.div(keep) * mask.floor()


def bernoulli_drop_path(x, keep: float, scale: bool, per_sample: bool = True):
    """timm's ``DropPath`` and torchvision's ``StochasticDepth``: a bernoulli(keep) mask, divided by keep or not."""
    shape = (x.shape[0],) + (1,) * (x.ndim - 1) if per_sample else (1,) * x.ndim
    mask = x.new_empty(shape).bernoulli_(keep)
    return x * (mask / keep if scale else mask)


class Residual(torch.nn.Module):
    def __init__(self, variant: str):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = torch.nn.Linear(6, 6), torch.nn.Linear(6, 3)
        self.variant = variant

    def forward(self, x):
        h = self.a(x)
        if self.training:
            keep = 0.7
            if self.variant == "floor":
                h = hf_drop_path(h, keep)
            elif self.variant == "bernoulli_scaled":
                h = bernoulli_drop_path(h, keep, scale=True)
            elif self.variant == "bernoulli_unscaled":
                h = bernoulli_drop_path(h, keep, scale=False)
            else:
                h = bernoulli_drop_path(h, keep, scale=True, per_sample=False)
        return self.b(x + h)


def export_training_mode(module, path, dynamo: bool = False):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:  # writes CastLike where TorchScript writes Cast
            torch.onnx.export(module.train(), (torch.randn(4, 6),), str(path), dynamo=True, optimize=False,
                              input_names=["x"], output_names=["y"],
                              dynamic_shapes=({0: torch.export.Dim.DYNAMIC},), verbose=False)
            return
        torch.onnx.export(module.train(), (torch.randn(4, 6),), str(path), dynamo=False, opset_version=17,
                          do_constant_folding=False, training=torch.onnx.TrainingMode.TRAINING,
                          input_names=["x"], output_names=["y"], dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})


def random_ops(model: onnx.ModelProto) -> set[str]:
    return {n.op_type for n in model.graph.node} & RANDOM


@pytest.mark.parametrize("variant,dynamo", [("floor", False), ("bernoulli_scaled", False),
                                            ("bernoulli_unscaled", False), ("bernoulli_batch", False),
                                            ("bernoulli_scaled", True)])
def test_eval_and_inference_models_pass_the_branch_on_as_torch_eval(tmp_path, variant, dynamo):
    if dynamo:
        pytest.importorskip("onnxscript", reason="torch's dynamo exporter needs onnxscript")
    module = Residual(variant)
    export_training_mode(module, tmp_path / "model.onnx", dynamo)
    source = onnx.load(tmp_path / "model.onnx")
    assert random_ops(source), "the export has no random mask to test"
    # on the export itself (the generator first turns CastLike into Cast where the type is declared)
    assert not random_ops(EvalMode()(source).model)
    artifacts.generate_artifacts(str(tmp_path / "model.onnx"), loss=artifacts.LossType.MSELoss,
                                 optimizer=artifacts.OptimType.AdamW, artifact_directory=tmp_path / "art",
                                 additional_output_names=["y"])
    assert not random_ops(onnx.load(tmp_path / "art" / "eval_model.onnx"))
    assert random_ops(onnx.load(tmp_path / "art" / "training_model.onnx"))  # training stays stochastic

    x = np.random.default_rng(0).standard_normal((5, 6)).astype(np.float32)
    target = np.zeros((5, 3), np.float32)
    with torch.no_grad():
        expected = module.eval()(torch.from_numpy(x)).numpy()
    state = CheckpointState.load_checkpoint(tmp_path / "art" / "checkpoint")
    trainer = Module(tmp_path / "art" / "training_model.onnx", state, tmp_path / "art" / "eval_model.onnx")
    trainer.eval()
    _, first = trainer(x, target)
    _, second = trainer(x, target)
    np.testing.assert_allclose(first, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(first, second)
    trainer.export_model_for_inferencing(tmp_path / "inference.onnx", ["y"])
    inference = onnx.load(tmp_path / "inference.onnx")
    assert not random_ops(inference)


def _masked_product(low: float, keep_in_less: float, keep_in_div: float) -> onnx.ModelProto:
    """y = x * (Cast(Less(U(low, 1), k1)) / k2), U shaped like x."""
    nodes = [
        helper.make_node("RandomUniformLike", ["x"], ["u"], low=low, high=1.0),
        helper.make_node("Less", ["u", "k1"], ["kept"]),
        helper.make_node("Cast", ["kept"], ["mask"], to=TensorProto.FLOAT),
        helper.make_node("Div", ["mask", "k2"], ["scaled"]),
        helper.make_node("Mul", ["x", "scaled"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])],
                              [numpy_helper.from_array(np.array(keep_in_less, np.float32), "k1"),
                               numpy_helper.from_array(np.array(keep_in_div, np.float32), "k2")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_the_recognised_product_becomes_identity():
    result = EvalMode()(_masked_product(0.0, 0.8, 0.8))
    assert result.modified
    assert [n.op_type for n in result.model.graph.node] == ["Identity"]
    assert list(result.model.graph.node[0].input) == ["x"]


@pytest.mark.parametrize("low,keep_in_less,keep_in_div", [(-1.0, 0.8, 0.8), (0.0, 0.8, 0.5), (0.0, 1.5, 1.5)])
def test_other_random_products_are_left_alone(low, keep_in_less, keep_in_div):
    """Noise that is not a keep-with-probability-k mask (U not over [0, 1), k not a probability), or a mask divided
    by another constant, is not stochastic depth: the pass does not guess."""
    result = EvalMode()(_masked_product(low, keep_in_less, keep_in_div))
    assert not result.modified
