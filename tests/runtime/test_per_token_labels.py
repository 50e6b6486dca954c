"""Per-token labels given to a class loss that reads the classes on axis 1: a language model's (batch, sequence,
vocabulary) logits with artifacts generated with the default cross-entropy expect labels shaped (batch,
vocabulary). The InputError names the input and both shapes, then says that the labels look per-token and how to
generate the artifacts again (the blocks loss with class_axis=-1)."""

import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxtrain import blocks
from onnxtrain.api import CheckpointState, Module
from onnxtrain.artifacts import LossType, OptimType, generate_artifacts
from onnxtrain.errors import InputError

N, S, V, D = 2, 5, 7, 3


def _language_model(dynamic: bool) -> onnx.ModelProto:
    """ids (N, S) -> Gather(embedding) -> MatMul -> logits (N, S, V)."""
    batch, seq = ("batch", "seq") if dynamic else (N, S)
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["embedding", "ids"], ["hidden"]),
         helper.make_node("MatMul", ["hidden", "head"], ["logits"])],
        "lm", [helper.make_tensor_value_info("ids", TensorProto.INT64, [batch, seq])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, seq, V])],
        [numpy_helper.from_array(rng.standard_normal((V, D)).astype(np.float32), "embedding"),
         numpy_helper.from_array(rng.standard_normal((D, V)).astype(np.float32), "head")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _module(out) -> Module:
    state = CheckpointState.load_checkpoint(out / "checkpoint")
    return Module(out / "training_model.onnx", state, out / "eval_model.onnx")


def _batch():
    rng = np.random.default_rng(1)
    return rng.integers(0, V, (N, S)), rng.integers(0, V, (N, S))


@pytest.mark.parametrize("dynamic, expected, scores", [
    (False, "int64[2, 7]", "[2, 5, 7]"),
    (True, "int64[batch, 7]", "[batch, ?, 7]"),  # the class count of axis 1 is not declared: the labels' shape
])
@pytest.mark.parametrize("loss, fix", [
    (LossType.CrossEntropyLoss, "CrossEntropyLoss(class_axis=-1)"),
    (blocks.CrossEntropyLoss(ignore_index=-100), "CrossEntropyLoss(class_axis=-1, ignore_index=-100)"),
    (blocks.NLLLoss(), "NLLLoss(class_axis=-1)"),
])
def test_per_token_labels_name_the_input_the_shapes_and_class_axis(tmp_path, dynamic, expected, scores, loss, fix):
    generate_artifacts(_language_model(dynamic), loss=loss, optimizer=OptimType.AdamW, artifact_directory=tmp_path)
    module = _module(tmp_path)
    ids, labels = _batch()
    message = (f"input 'labels' expects shape {expected}, got [2, 5] (axis 1 should be 7); these look like "
               f"per-token labels: the loss reads the classes on axis 1 of 'logits' {scores} (torch's (N, C, ...) "
               f"layout), and [2, 5] is its shape without the last axis. If the classes are on the last axis (a "
               f"language model's (batch, sequence, vocabulary) logits), generate the artifacts again with "
               f"loss=onnxtrain.blocks.{fix}")
    with pytest.raises(InputError, match="^training step: " + re.escape(message) + "$"):
        module(ids, labels)
    module.eval()
    with pytest.raises(InputError, match="^eval step: " + re.escape(message) + "$"):
        module(ids, labels)


@pytest.mark.parametrize("dynamic", [False, True])
def test_the_named_fix_trains_on_per_token_labels(tmp_path, dynamic):
    generate_artifacts(_language_model(dynamic), loss=blocks.CrossEntropyLoss(class_axis=-1),
                       optimizer=OptimType.AdamW, artifact_directory=tmp_path)
    ids, labels = _batch()
    assert np.isfinite(_module(tmp_path)(ids, labels))


def test_labels_of_another_shape_get_no_per_token_hint(tmp_path):
    generate_artifacts(_language_model(False), loss=LossType.CrossEntropyLoss, optimizer=OptimType.AdamW,
                       artifact_directory=tmp_path)
    ids, _ = _batch()
    with pytest.raises(InputError, match=r"^training step: input 'labels' expects shape int64\[2, 7\], got \[2, 4\] "
                                         r"\(axis 1 should be 7\)$"):
        _module(tmp_path)(ids, np.zeros((N, S - 1), np.int64))


def test_no_per_token_hint_when_the_loss_already_reads_the_last_axis(tmp_path):
    """With class_axis=-1 the loss reads Transpose(logits): (N, V) labels are wrong, and not for want of it."""
    generate_artifacts(_language_model(False), loss=blocks.CrossEntropyLoss(class_axis=-1),
                       optimizer=OptimType.AdamW, artifact_directory=tmp_path)
    ids, _ = _batch()
    with pytest.raises(InputError, match=r"^training step: input 'labels' expects shape int64\[2, 5\], got \[2, 7\] "
                                         r"\(axis 1 should be 5\)$"):
        _module(tmp_path)(ids, np.zeros((N, V), np.int64))
