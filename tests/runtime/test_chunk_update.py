"""ChunkUpdate (runtime/passes/chunk_update.py): the optimizer graph split into chunks bound to slices of the flat
vectors trains exactly as the whole-vector graph, fused or not; what it cannot split is a PassError and the
runtime then runs the graph whole."""

from __future__ import annotations

import logging

import numpy as np
import onnx
import pytest
from onnx import helper

from onnxtrain import blocks
from onnxtrain.api import CheckpointState, Module, Optimizer
from onnxtrain.artifacts import LossType, generate_artifacts
from onnxtrain.errors import PassError
from onnxtrain.runtime import update as update_module
from onnxtrain.runtime.passes import ChunkUpdate, chunk_bounds
from tests import models

OPTIMIZERS = {"adamw_clip_decay": lambda: blocks.AdamW(weight_decay=0.01, max_norm=0.5),
              "adamw_torch": lambda: blocks.AdamW(mode="torch"),
              "sgd_nesterov": lambda: blocks.SGD(momentum=0.9, nesterov=True)}


@pytest.mark.parametrize("sizes,target", [([128, 16, 64, 4], 32), ([5, 7, 3, 1000, 2], 64), ([10] * 9, 1000),
                                          ([1], 16), ([33, 33], 16)])
def test_chunk_bounds_cover_the_vector_in_pieces_of_at_most_target(sizes, target):
    bounds = chunk_bounds(sizes, target)
    assert bounds[0][0] == 0 and bounds[-1][1] == sum(sizes)
    assert all(a < b for a, b in bounds) and all(b == c for (_, b), (c, _) in zip(bounds, bounds[1:]))
    assert max(b - a for a, b in bounds) <= max(target, 16 * -(-target // 16))
    offsets = set(np.cumsum([0, *sizes]).tolist())
    # a chunk boundary inside a slot only where the slot is larger than the target
    inner = [a for a, _ in bounds if a not in offsets]
    starts = np.cumsum([0, *sizes])
    assert all(sizes[np.searchsorted(starts, a, side="right") - 1] > target for a in inner)


def _train(folder, chunk, fuse, monkeypatch, steps=4, poison_step=None):
    monkeypatch.setattr(update_module, "CHUNK", chunk)
    state = CheckpointState.load_checkpoint(folder / "checkpoint")
    module = Module(folder / "training_model.onnx", state)
    opt = Optimizer(folder / "optimizer_model.onnx", module)
    module.training_run.fuse = fuse
    rng = np.random.default_rng(1)
    for k in range(steps):
        x = rng.standard_normal((5, 8)).astype(np.float32)
        if k == poison_step:
            x[0, 0] = np.inf
        module(x, rng.integers(0, 4, 5).astype(np.int64))
        opt.step()
        module.lazy_reset_grad()
    bounds = module.training_run.update_graph.bounds
    return bounds, {n: p.data for n, p in state.parameters.items()}, state.step


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "separate"])
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_chunked_update_trains_as_the_whole_vector_update(tmp_path, monkeypatch, optimizer, fuse):
    generate_artifacts(models.mlp(), loss=LossType.CrossEntropyLoss, optimizer=OPTIMIZERS[optimizer](),
                       artifact_directory=tmp_path)
    whole_bounds, whole, _ = _train(tmp_path, 1 << 20, fuse, monkeypatch)
    bounds, chunked, _ = _train(tmp_path, 32, fuse, monkeypatch)
    assert whole_bounds is None and len(bounds) >= 7  # 212 parameters; fc1.weight (128) split in four
    assert whole.keys() == chunked.keys()
    initial = CheckpointState.load_checkpoint(tmp_path / "checkpoint").parameters
    for name in whole:
        np.testing.assert_allclose(chunked[name], whole[name], rtol=1e-6, atol=1e-7, err_msg=name)
        assert not np.allclose(chunked[name], initial[name].data), name


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "separate"])
def test_chunked_update_skips_a_step_with_nonfinite_gradients(tmp_path, monkeypatch, fuse):
    generate_artifacts(models.mlp(), loss=LossType.CrossEntropyLoss, optimizer=blocks.AdamW(),
                       artifact_directory=tmp_path)
    _, clean, clean_steps = _train(tmp_path, 32, fuse, monkeypatch, steps=2)
    _, poisoned, poisoned_steps = _train(tmp_path, 32, fuse, monkeypatch, steps=3, poison_step=2)
    assert (clean_steps, poisoned_steps) == (2, 2)
    for name in clean:
        np.testing.assert_array_equal(poisoned[name], clean[name], err_msg=name)


def _vector_model(op_type, extra_input=None):
    x = helper.make_tensor_value_info("params", onnx.TensorProto.FLOAT, [40])
    inputs = [x] + ([extra_input] if extra_input is not None else [])
    node = helper.make_node(op_type, ["params", *([extra_input.name] if extra_input is not None else [])],
                            ["params.out"])
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("params.out", 1, [40])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_an_op_that_is_not_elementwise_is_refused_by_name():
    axis = helper.make_tensor_value_info("axis", onnx.TensorProto.INT64, [])
    with pytest.raises(PassError, match="CumSum node .*only elementwise ops"):
        ChunkUpdate(chunk_bounds([40], 16))(_vector_model("CumSum", axis))


def test_a_vector_combined_with_a_non_scalar_is_refused():
    other = helper.make_tensor_value_info("other", onnx.TensorProto.FLOAT, [1, 40])
    with pytest.raises(PassError, match="combines a vector with 'other'"):
        ChunkUpdate(chunk_bounds([40], 16))(_vector_model("Add", other))


def test_an_unsplittable_optimizer_runs_whole_and_says_why(tmp_path, monkeypatch, caplog):
    """A custom update rule with a non-elementwise op: logged, and the graph runs over whole vectors."""

    class CumulativeSGD(blocks.Optimizer):
        state_names = ()

        def update(self, p, g, states, lr, step):
            op = self.builder.op
            cumulative = op.CumSum(g, self.builder.const(np.int64(0)))
            return op.Sub(p, op.Mul(op.Sub(cumulative, op.CumSum(op.Sub(g, g), self.builder.const(np.int64(0)))),
                                    lr)), {}

    generate_artifacts(models.mlp(), loss=LossType.CrossEntropyLoss, optimizer=CumulativeSGD(),
                       artifact_directory=tmp_path)
    with caplog.at_level(logging.INFO, logger="onnxtrain.runtime.update"):
        bounds, params, steps = _train(tmp_path, 32, True, monkeypatch, steps=2)
    assert bounds is None and steps == 2
    assert "CumSum" in caplog.text


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_the_optimizers_split_without_onnx_shape_inference(tmp_path, optimizer, monkeypatch):
    """Scalars are found by propagation: shape inference loads onnx's operator schemas (7.5 MB of RSS)."""
    def refuse(*args, **kwargs):
        raise AssertionError("ChunkUpdate ran onnx's shape inference")

    generate_artifacts(models.mlp(), loss=LossType.CrossEntropyLoss, optimizer=OPTIMIZERS[optimizer](),
                       artifact_directory=tmp_path)
    model = onnx.load(tmp_path / "optimizer_model.onnx")
    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", refuse)
    result = ChunkUpdate(chunk_bounds([212], 32)).run(model)
    assert result.modified and len(result.model.graph.node) > len(model.graph.node)


def test_a_scalar_only_shape_inference_finds_still_splits():
    """A shared value computed by an op the propagation does not follow (here Expand to shape [1])."""
    shape = helper.make_tensor("shape", onnx.TensorProto.INT64, [1], [1])
    lr = helper.make_tensor_value_info("lr", onnx.TensorProto.FLOAT, [])
    params = helper.make_tensor_value_info("params", onnx.TensorProto.FLOAT, [40])
    nodes = [helper.make_node("Expand", ["lr", "shape"], ["lr1"]), helper.make_node("Mul", ["params", "lr1"],
                                                                                     ["params.out"])]
    graph = helper.make_graph(nodes, "g", [params, lr], [helper.make_tensor_value_info("params.out", 1, [40])],
                              initializer=[shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert ChunkUpdate(chunk_bounds([40], 16))(model).modified
