"""Blocks find the graph they build into from their inputs (Values), with no module-level state."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from onnxtrain import blocks
from onnxtrain.blocks.base import BuildContext, Value
from onnxtrain.ir.builder import GraphBuilder
from onnxtrain.ir.types import TensorInfo, infer_tensor_info


def _model(ctx: BuildContext, outputs=()) -> onnx.ModelProto:
    graph = helper.make_graph(ctx.builder.nodes, "g", [helper.make_tensor_value_info("y", 1, [4, 3]), *ctx.new_inputs],
                              [helper.make_tensor_value_info(o, 1, []) for o in outputs],
                              initializer=ctx.builder.initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _context() -> BuildContext:
    return BuildContext(GraphBuilder(17), {"y": TensorInfo(onnx.TensorProto.FLOAT, (4, 3))},
                        reinfer=lambda ctx: infer_tensor_info(_model(ctx)))


def test_a_custom_loss_builds_into_the_graph_of_its_input():
    class WeightedSum(blocks.Block):
        def __init__(self):
            super().__init__()
            self.mse, self.l1 = blocks.MSELoss(), blocks.L1Loss()

        def build(self, output, target="target"):
            return blocks.Add()(self.mse(output, target), blocks.Mul(0.1)(self.l1(output, target)))

    ctx = _context()
    loss = WeightedSum()(ctx.value("y"))
    assert isinstance(loss, Value) and loss.context is ctx
    model = _model(ctx, [loss])
    onnx.checker.check_model(model, full_check=True)
    from onnx.reference import ReferenceEvaluator

    y, t = np.random.default_rng(0).normal(size=(2, 4, 3)).astype(np.float32)
    (got,) = ReferenceEvaluator(model).run(None, {"y": y, "target": t})
    np.testing.assert_allclose(got, np.mean((y - t) ** 2) + 0.1 * np.mean(np.abs(y - t)), rtol=1e-5)


def test_two_graphs_built_side_by_side_stay_apart():
    a, b = _context(), _context()
    out_a = blocks.Relu()(a.value("y"))
    out_b = blocks.Exp()(b.value("y"))
    assert [n.op_type for n in a.builder.nodes] == ["Relu"] and out_a.context is a
    assert [n.op_type for n in b.builder.nodes] == ["Exp"] and out_b.context is b


def test_a_block_called_on_plain_names_says_what_it_needs():
    with pytest.raises(TypeError, match="Relu: none of its inputs \\['y'\\] is a value of a graph being built"):
        blocks.Relu()("y")


def test_inputs_from_two_graphs_are_refused():
    with pytest.raises(ValueError, match="belong to different graphs"):
        blocks.Add()(_context().value("y"), _context().value("y"))


def test_a_block_knows_its_graph_only_while_called():
    block = blocks.Relu()
    block(_context().value("y"))
    with pytest.raises(RuntimeError, match="only while the block is called"):
        _ = block.op
