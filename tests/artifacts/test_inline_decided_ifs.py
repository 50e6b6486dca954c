"""InlineDecidedIfs: TorchScript exports of ``Tensor.tile`` and of ``squeeze(dim)`` write an If on the input's
rank or on a size; shape inference gave everything after it no rank and generation raised UnknownShapeError
(DINOv3, xLSTM). The If whose condition the ranks and static sizes decide is replaced by its branch: the artifacts
generate, and their gradients are torch's at other batch sizes and lengths."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from onnxtrain.artifacts import LossType, generate_artifacts
from onnxtrain.artifacts.passes import InlineDecidedIfs
from tests.artifacts.torch_step import assert_step_matches_torch

torch = pytest.importorskip("torch")


class _TileAndSqueeze(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(4, 4)
        self.gate = torch.nn.Linear(8, 1)
        self.head = torch.nn.Linear(8, 5)

    def forward(self, x):                                    # x: (batch, n, 4)
        h = self.lin(x).tile(2)                              # an If on rank(h) < len(dims)
        g = torch.sigmoid(self.gate(h)).squeeze(-1)          # an If on Shape(.)[-1] == 1
        a = torch.softmax(h @ h.transpose(1, 2), -1) * g.unsqueeze(1)
        return self.head((a @ h).mean(1))


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    path = tmp_path_factory.mktemp("tile") / "model.onnx"
    model = _TileAndSqueeze().eval()
    torch.onnx.export(model, (torch.randn(2, 6, 4),), str(path), dynamo=False, opset_version=17,
                      do_constant_folding=False, input_names=["input"], output_names=["output"],
                      dynamic_axes={"input": {0: "batch", 1: "n"}, "output": {0: "batch"}})
    return model, path


def test_the_export_has_decided_ifs_and_they_go(export):
    _, path = export
    source = onnx.load(str(path))
    ifs = sum(n.op_type == "If" for n in source.graph.node)
    assert ifs >= 1  # else the exporter changed and this test exercises nothing
    weights = {i.name: onnx.numpy_helper.to_array(i) for i in source.graph.initializer}
    result = InlineDecidedIfs(weights)(source)
    assert result.modified
    assert not any(n.op_type == "If" for n in result.model.graph.node)


@pytest.mark.parametrize("batch, n", [(2, 6), (3, 9)])
def test_gradients_are_torchs(export, tmp_path, batch, n):
    model, path = export
    generate_artifacts(str(path), loss=LossType.CrossEntropyLoss, artifact_directory=tmp_path)
    training = onnx.load(str(tmp_path / "training_model.onnx"))
    assert not any(node.op_type == "If" for node in training.graph.node)
    rng = np.random.default_rng(batch)
    x = rng.standard_normal((batch, n, 4)).astype(np.float32)
    y = rng.integers(0, 5, batch).astype(np.int64)
    assert_step_matches_torch(model, tmp_path, x, y, torch.nn.functional.cross_entropy)


def test_an_if_on_a_run_time_size_stays():
    """The same squeeze over a dimension the model leaves symbolic: nothing decides it before the run."""
    from onnx import TensorProto, helper

    squeeze = helper.make_graph([helper.make_node("Squeeze", ["x", "last"], ["s"])], "then", [],
                                [helper.make_tensor_value_info("s", TensorProto.FLOAT, None)])
    keep = helper.make_graph([helper.make_node("Identity", ["x"], ["i"])], "else", [],
                             [helper.make_tensor_value_info("i", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Gather", ["shape", "last"], ["size"], axis=0),
             helper.make_node("Equal", ["size", "one"], ["cond"]),
             helper.make_node("If", ["cond"], ["y"], then_branch=squeeze, else_branch=keep)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "k"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [onnx.numpy_helper.from_array(np.array(-1, np.int64), "last"),
                               onnx.numpy_helper.from_array(np.array(1, np.int64), "one")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    weights = {i.name: onnx.numpy_helper.to_array(i) for i in graph.initializer}
    assert not InlineDecidedIfs(weights)(model).modified


def test_branch_values_with_taken_names_are_renamed():
    """Two decided Ifs whose branches both make a value named 't' (names are unique per graph, not across
    subgraphs): after inlining, each keeps its own, and the model computes what it did."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    def branch(op: str, out: str) -> onnx.GraphProto:
        return helper.make_graph([helper.make_node(op, ["x"], ["t"]), helper.make_node("Neg", ["t"], [out])],
                                 "b", [], [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)])

    nodes = [helper.make_node("Shape", ["x"], ["shape"]), helper.make_node("Size", ["shape"], ["rank"]),
             helper.make_node("Less", ["rank", "three"], ["cond"]),
             helper.make_node("If", ["cond"], ["a"], then_branch=branch("Exp", "ta"), else_branch=branch("Abs", "ea")),
             helper.make_node("If", ["cond"], ["b"], then_branch=branch("Sin", "tb"), else_branch=branch("Cos", "eb")),
             helper.make_node("Add", ["a", "b"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])],
                              [onnx.numpy_helper.from_array(np.array(3, np.int64), "three")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    weights = {"three": np.array(3, np.int64)}
    result = InlineDecidedIfs(weights)(model)
    assert result.modified and not any(n.op_type == "If" for n in result.model.graph.node)
    onnx.checker.check_model(result.model, full_check=True)
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    run = [ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
           for m in (model, result.model)]
    np.testing.assert_allclose(run[1], run[0], rtol=1e-6)
    np.testing.assert_allclose(run[1], -np.exp(x) - np.sin(x), rtol=1e-6)
