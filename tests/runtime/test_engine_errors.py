"""A failure inside onnxruntime names the step, the op and the node, with a hint that fits the op."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxtrain import artifacts
from onnxtrain.api import CheckpointState, Module
from onnxtrain.errors import ExecutionError, InputError


def test_a_shape_failure_names_the_node_and_does_not_blame_the_labels(tmp_path):
    """The input's feature axis is symbolic, so a wrong width passes the runtime's own checks and fails in the
    first MatMul: the error names that node, and says nothing about class labels."""
    weight = numpy_helper.from_array(np.ones((3, 2), np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="first_matmul")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "features"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    paths = artifacts.generate_artifacts(model, loss=artifacts.LossType.CrossEntropyLoss, artifact_directory=tmp_path)
    module = Module(paths["training"], CheckpointState.load_checkpoint(paths["checkpoint"]), paths["eval"])
    labels = np.zeros(4, np.int64)
    with pytest.raises(ExecutionError) as info:
        module(np.ones((4, 5), np.float32), labels)
    message = str(info.value)
    assert "the training step failed in a MatMul node ('first_matmul')" in message
    assert "class labels" not in message and "shapes" in message
    with pytest.raises(InputError, match="class label 9 at index"):  # refused before the run: 2 classes declared
        module(np.ones((4, 3), np.float32), np.full(4, 9, np.int64))


def test_a_node_onnxruntime_has_no_kernel_for_names_the_types_it_reads(tmp_path):
    """torch's dynamo export of Falcon computes ALiBi in bfloat16: valid ONNX, but onnxruntime's CPU provider has
    no bfloat16 Mul, so the artifacts (and the exported model) cannot be opened; the error says why."""
    from onnxtrain.errors import ArtifactError

    weight = numpy_helper.from_array(np.ones((3, 2), np.float32), "w")
    nodes = [helper.make_node("Cast", ["x"], ["x16"], to=TensorProto.BFLOAT16),
             helper.make_node("Mul", ["x16", "x16"], ["squared16"], name="bf16_square"),
             helper.make_node("Cast", ["squared16"], ["squared"], to=TensorProto.FLOAT),
             helper.make_node("MatMul", ["squared", "w"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    paths = artifacts.generate_artifacts(model, loss=artifacts.LossType.CrossEntropyLoss, artifact_directory=tmp_path)
    with pytest.raises(ArtifactError, match=r"cannot be loaded: .*'bf16_square' reads bfloat16, bfloat16: this "
                                            r"onnxruntime build has no Mul kernel for those types.*float32"):
        module = Module(paths["training"], CheckpointState.load_checkpoint(paths["checkpoint"]), paths["eval"])
        module(np.ones((4, 3), np.float32), np.zeros(4, np.int64))  # sessions open at the first step


@pytest.mark.parametrize("message", [
    "[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Got invalid dimensions for input: w2 for the following indices "
    "index: 0 Got: 5 Expected: 3 Please fix either the inputs/outputs or the model.",
    "[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Invalid rank for input: x Got: 3 Expected: 2 Please fix either "
    "the inputs/outputs or the model.",
])
def test_a_feed_refused_before_any_node_runs_gets_the_shapes_hint(message):
    """onnxruntime checks the feeds against the declared inputs before running a node: no node is named, and
    the hint is about shapes, not class labels."""
    from onnxtrain.runtime.engine_errors import run_session

    class Refusing:
        def run(self, *args, **kwargs):
            raise RuntimeError(message)

    with pytest.raises(ExecutionError) as info:
        run_session(Refusing(), "training step")
    assert "class labels" not in str(info.value) and "check the inputs' shapes and values" in str(info.value)
    assert str(info.value).startswith("the training step failed: Got invalid dimensions" if "dimensions" in message
                                      else "the training step failed: Invalid rank")


def test_an_index_past_an_embedding_gets_the_token_id_hint():
    """A token id past the vocabulary fails in the embedding's Gather: the hint speaks of token ids, not of
    class labels, which the loss's checks have already cleared."""
    from onnxtrain.runtime.engine_errors import run_session

    class Refusing:
        def run(self, *args, **kwargs):
            raise RuntimeError("[ONNXRuntimeError] : 1 : FAIL : Non-zero status code returned while running Gather "
                               "node. Name:'/embeddings/word_embeddings/Gather' Status Message: indices element out "
                               "of data bounds, idx=100 must be within the inclusive range [-100,99]")

    with pytest.raises(ExecutionError) as info:
        run_session(Refusing(), "training step")
    message = str(info.value)
    assert message.startswith("the training step failed in a Gather node ('/embeddings/word_embeddings/Gather'): "
                              "indices element out of data bounds, idx=100")
    assert "token ids must be below the embedding's vocabulary size" in message and "class labels" not in message


def test_a_kernel_that_stops_on_a_nan_input_names_the_input():
    """onnxruntime 1.17-1.23's MaxUnpool (a MaxPool's gradient) stops with gsl's narrowing_error on a NaN input,
    where later releases run and the loss shows the NaN: either way a NonFiniteError names the input and where."""
    from onnxtrain.errors import NonFiniteError
    from onnxtrain.runtime.engine_errors import run_session

    class Refusing:
        def run(self, *args, **kwargs):
            raise RuntimeError("[ONNXRuntimeError] : 1 : FAIL : Non-zero status code returned while running "
                               "MaxUnpool node. Name:'grad/MaxUnpool_61' Status Message: narrowing_error")

    x = np.zeros((2, 1, 4, 4), np.float32)
    x[1, 0, 2, 3] = np.nan
    with pytest.raises(NonFiniteError, match=r"^the training step failed in a MaxUnpool node \('grad/MaxUnpool_61'\): "
                                             r"narrowing_error; input 'x' holds nan at index \[1, 0, 2, 3\]"):
        run_session(Refusing(), "training step", {"x": x, "labels": np.zeros(2, np.int64)})
    with pytest.raises(ExecutionError, match="narrowing_error"):   # finite inputs: the engine's error as it is
        run_session(Refusing(), "training step", {"x": np.zeros((2, 1, 4, 4), np.float32)})


@pytest.mark.parametrize("message", [
    "[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Non-zero status code returned while running MatMul node. "
    "Name:'/encoder/MatMul' Status Message: /onnxruntime_src/onnxruntime/core/framework/bfc_arena.cc:376 void* "
    "onnxruntime::BFCArena::AllocateRawInternal(size_t, bool, onnxruntime::Stream*, bool, "
    "onnxruntime::WaitNotificationFn) Failed to allocate memory for requested buffer of size 3221225472",
    "[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Exception during initialization: std::bad_alloc",
])
def test_running_out_of_memory_says_what_holds_less(message):
    """An allocation failure inside the engine: the hint names what needs less memory (update_in_backward among
    them), not the inputs' values."""
    from onnxtrain.runtime.engine_errors import run_session

    class Refusing:
        def run(self, *args, **kwargs):
            raise RuntimeError(message)

    with pytest.raises(ExecutionError) as info:
        run_session(Refusing(), "training step")
    text = str(info.value)
    assert text.startswith("the training step failed in a MatMul node ('/encoder/MatMul'): onnxruntime could not "
                           "allocate 3,072 MiB (out of memory" if "MatMul" in message
                           else "the training step failed: Exception during initialization: std::bad_alloc (out of")
    assert "out of memory" in text and "update_in_backward=True" in text and "check the input" not in text
