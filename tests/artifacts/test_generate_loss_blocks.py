"""generate_artifacts with the peer's onnxblock losses: ``self.base`` inside a custom loss, LabelEncoder, a loss
block that returns (loss, *outputs), ``loss=None`` keeping the model's other outputs, and argument types."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import onnxtrain.onnxblock as onnxblock
from onnxtrain.api import CheckpointState, Module
from onnxtrain.artifacts import OptimType, generate_artifacts
from tests import models

rng = np.random.default_rng(0)
X = rng.standard_normal((5, 8)).astype(np.float32)
T = rng.standard_normal((5, 4)).astype(np.float32)


def _module(directory) -> Module:
    state = CheckpointState.load_checkpoint(directory / "checkpoint")
    return Module(directory / "training_model.onnx", state, directory / "eval_model.onnx")


def _forward(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        ["output"], {"input": x})[0]


def _default_domain_only(directory) -> bool:
    return all(n.domain in ("", "ai.onnx") for f in ("training_model.onnx", "eval_model.onnx")
               for n in onnx.load(directory / f).graph.node)


def test_a_custom_loss_reads_and_edits_self_base(tmp_path):
    """The peer builds the loss inside onnxblock.base(model): its own losses and users' read self.base."""

    class ScaledMSE(onnxblock.Block):
        def __init__(self):
            super().__init__()
            self.mse, self.mul = onnxblock.loss.MSELoss(), onnxblock.blocks.Mul()

        def build(self, output_name):
            assert output_name in [o.name for o in self.base.graph.output]
            self.base.graph.initializer.append(onnx.numpy_helper.from_array(np.array(2.5, np.float32), "scale"))
            target = onnxblock.blocks.InputLike(output_name)("target")
            return self.mul(self.mse(output_name, target), "scale")

    generate_artifacts(models.mlp(), loss=ScaledMSE(), optimizer=OptimType.SGD, artifact_directory=tmp_path)
    module = _module(tmp_path)
    assert module.input_names() == ["input", "target"]
    np.testing.assert_allclose(module(X, T), 2.5 * np.mean((_forward(models.mlp(), X) - T) ** 2), rtol=1e-5)


def test_label_encoder_in_a_custom_loss_trains_with_default_domain_artifacts(tmp_path):
    """LabelEncoder was an ai.onnx.ml node, which detach_foreign_ops took out with the loss it fed."""

    class EncodedCE(onnxblock.Block):
        def __init__(self):
            super().__init__()
            self.ce = onnxblock.loss.CrossEntropyLoss()
            self.encode = onnxblock.blocks.LabelEncoder(keys_int64s=[10, 11, 12, 13], values_int64s=[0, 1, 2, 3])

        def build(self, output_name):
            return self.ce(output_name, self.encode("raw_labels"))

    model = models.mlp()
    model.graph.input.append(helper.make_tensor_value_info("raw_labels", TensorProto.INT64, ["batch"]))
    generate_artifacts(model, loss=EncodedCE(), optimizer=OptimType.SGD, artifact_directory=tmp_path)
    assert _default_domain_only(tmp_path)
    raw = np.array([13, 10, 12, 11, 10])
    y = _forward(models.mlp(), X)
    logp = y - np.log(np.exp(y).sum(1, keepdims=True))
    np.testing.assert_allclose(_module(tmp_path)(X, raw), -np.mean(logp[np.arange(5), raw - 10]), rtol=1e-5)


def test_a_typo_in_a_custom_loss_names_the_block_and_the_value(tmp_path):
    class Typo(onnxblock.Block):
        def __init__(self):
            super().__init__()
            self.mse, self.add = onnxblock.loss.MSELoss(), onnxblock.blocks.Add()

        def build(self, output_name):
            return self.add(self.mse(output_name), "fc2.weigth")

    with pytest.raises(ValueError, match=r"block Add reads 'fc2.weigth' .*did you mean 'fc2.weight'"):
        generate_artifacts(models.mlp(), loss=Typo(), artifact_directory=tmp_path)


def test_a_loss_block_returning_loss_and_outputs_returns_them_after_the_loss(tmp_path):
    class WithLogits(onnxblock.Block):
        def __init__(self):
            super().__init__()
            self.mse = onnxblock.loss.MSELoss()

        def build(self, output_name):
            return self.mse(output_name), output_name

    generate_artifacts(models.mlp(), loss=WithLogits(), optimizer=OptimType.SGD, artifact_directory=tmp_path)
    module = _module(tmp_path)
    assert module.output_names() == ["loss", "output"]
    loss, logits = module(X, T)
    np.testing.assert_allclose(logits, _forward(models.mlp(), X), rtol=1e-5)
    np.testing.assert_allclose(loss, np.mean((logits - T) ** 2), rtol=1e-5)


def _model_with_its_loss() -> onnx.ModelProto:
    """Outputs (my_loss, output): a model that computes its own loss, as the peer's loss=None users export."""
    model = models.mlp()
    graph = model.graph
    graph.input.append(helper.make_tensor_value_info("target", TensorProto.FLOAT, ["batch", 4]))
    graph.node.extend([helper.make_node("Sub", ["output", "target"], ["d"]),
                       helper.make_node("Mul", ["d", "d"], ["d2"]),
                       helper.make_node("ReduceMean", ["d2"], ["my_loss"], keepdims=0)])
    graph.output.insert(0, helper.make_tensor_value_info("my_loss", TensorProto.FLOAT, []))
    return model


def test_loss_none_returns_the_models_other_outputs_after_the_loss(tmp_path):
    """The peer's loss=None is a PassThrough of every output: `loss, logits = module(x, y)` works, and the model's
    loss output keeps its name, as the peer's does (a script that leaves it out of the export by name works)."""
    generate_artifacts(_model_with_its_loss(), loss=None, optimizer=OptimType.SGD, artifact_directory=tmp_path)
    module = _module(tmp_path)
    assert module.output_names() == ["my_loss", "output"]
    loss, logits = module(X, T)
    np.testing.assert_allclose(loss, np.mean((logits - T) ** 2), rtol=1e-5)
    module.eval()
    assert module.output_names() == ["my_loss", "output"]
    # additional_output_names says which outputs follow the loss; loss_input_names=[loss] alone: none
    generate_artifacts(_model_with_its_loss(), loss=None, artifact_directory=tmp_path / "a",
                       additional_output_names=["d"])
    assert _module(tmp_path / "a").output_names() == ["my_loss", "d"]
    generate_artifacts(_model_with_its_loss(), loss=None, artifact_directory=tmp_path / "b",
                       loss_input_names=["my_loss"])
    assert _module(tmp_path / "b").output_names() == ["my_loss"]


@pytest.mark.parametrize("argument", ["additional_output_names", "loss_input_names"])
def test_a_name_list_given_as_one_string_is_a_type_error(tmp_path, argument):
    """A str was read as its characters: "ValueError: 'o' is not a value of the model"."""
    with pytest.raises(TypeError, match=rf"{argument} must be a list of value names, not one str: pass \['output'\]"):
        generate_artifacts(models.mlp(), loss=onnxblock.loss.MSELoss(), artifact_directory=tmp_path,
                           **{argument: "output"})
    with pytest.raises(TypeError, match=rf"{argument} must be a list of value names \(str\), got \[1\]"):
        generate_artifacts(models.mlp(), loss=onnxblock.loss.MSELoss(), artifact_directory=tmp_path,
                           **{argument: [1]})
