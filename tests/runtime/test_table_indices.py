"""Inputs that index a parameter's rows (an embedding's token ids) are checked before a run: onnxruntime reads a
negative index as a row from the end (torch's Embedding refuses it), and an index past the table stopped the
engine with an error about a Gather node."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxtrain.api import CheckpointState, Module, Optimizer
from onnxtrain.artifacts import LossType, OptimType, generate_artifacts
from onnxtrain.errors import InputError
from onnxtrain.runtime.inputs import TableIndices, table_index_inputs
from tests import models


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    out = tmp_path_factory.mktemp("positions")
    generate_artifacts(models.position_classifier("slice"), loss=LossType.CrossEntropyLoss,
                       optimizer=OptimType.AdamW, artifact_directory=out)
    return out


def _module(out):
    state = CheckpointState.load_checkpoint(out / "checkpoint")
    module = Module(out / "training_model.onnx", state, out / "eval_model.onnx")
    return state, module, Optimizer(out / "optimizer_model.onnx", module)


@pytest.mark.parametrize("bad, message", [
    (-1, r"input 'ids' holds -1 at index \[1, 2\], and it indexes the \d+ rows of 'tokens': its values must be "
         r"from 0 to \d+ \(onnxruntime would read it as a row from the end"),
    (models.VOCAB, rf"input 'ids' holds {models.VOCAB} at index \[1, 2\], and it indexes the {models.VOCAB} rows "
                   rf"of 'tokens': its values must be from 0 to {models.VOCAB - 1}$"),
])
def test_an_index_outside_the_table_is_refused_before_the_run(artifacts, bad, message):
    state, module, optimizer = _module(artifacts)
    rng = np.random.default_rng(0)
    ids, labels = rng.integers(0, models.VOCAB, (3, 5)), np.array([0, 1, 0])
    before = state.parameters["tokens"].data
    ids[1, 2] = bad
    with pytest.raises(InputError, match="training step: " + message):
        module(ids, labels)
    assert np.array_equal(state.parameters["tokens"].data, before)
    module.eval()
    with pytest.raises(InputError, match="eval step: " + message):
        module(ids, labels)
    module.train()
    ids[1, 2] = models.VOCAB - 1  # the last row is a row: the same batch trains
    assert np.isfinite(module(ids, labels))
    optimizer.step()
    assert not np.array_equal(state.parameters["tokens"].data, before)


def _gather(data_is_parameter: bool, cast: bool) -> onnx.ModelProto:
    table = helper.make_tensor_value_info("table", TensorProto.FLOAT, [7, 2])
    ids = helper.make_tensor_value_info("ids", TensorProto.INT32 if cast else TensorProto.INT64, ["n"])
    nodes = [helper.make_node("Cast", ["ids"], ["ids64"], to=TensorProto.INT64)] if cast else []
    nodes.append(helper.make_node("Gather", ["table", "ids64" if cast else "ids"], ["rows"]))
    graph = helper.make_graph(nodes, "g", [ids] if data_is_parameter else [ids, table],
                              [helper.make_tensor_value_info("rows", TensorProto.FLOAT, ["n", 2])],
                              initializer=[numpy_helper.from_array(np.zeros((7, 2), np.float32), "table")]
                              if data_is_parameter else [])
    return helper.make_model(graph)


def test_indices_are_traced_through_casts_and_only_into_parameters():
    assert table_index_inputs(_gather(True, cast=True), ["table"]) == {"ids": TableIndices("table", 7)}
    assert table_index_inputs(_gather(True, cast=False), ["table"]) == {"ids": TableIndices("table", 7)}
    # a weight kept as a constant of the graph (not a parameter of the checkpoint) is a table too
    assert table_index_inputs(_gather(True, cast=False), []) == {"ids": TableIndices("table", 7)}
    # a Gather from another input of the model may mean a negative index as ONNX defines it: not checked
    assert table_index_inputs(_gather(False, cast=False), []) == {}
