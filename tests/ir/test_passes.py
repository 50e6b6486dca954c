"""ir/passes.py: the shared NodeIndex of a model and what it must agree with."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from onnxtrain.ir import passes
from onnxtrain.ir.pass_infra import Pass, PassManager, PassResult
from onnxtrain.ir.passes import NodeIndex, ancestors, node_index, node_inputs, producer_index, shared_node_indices


def _model() -> onnx.ModelProto:
    """x -> Relu -> If (its branches read ``r`` from the outer scope) -> Neg; and an unrelated Abs."""
    vi = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [2])  # noqa: E731
    branch = lambda op: helper.make_graph([helper.make_node(op, ["r"], ["b"])], op, [], [vi("b")])  # noqa: E731
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("If", ["c"], ["i"], then_branch=branch("Exp"), else_branch=branch("Sin")),
             helper.make_node("Neg", ["i"], ["y"]),
             helper.make_node("Abs", ["x"], ["z"])]
    graph = helper.make_graph(nodes, "g", [vi("x"), helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                              [vi("y"), vi("z")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_the_index_agrees_with_the_walks_it_replaces():
    model = _model()
    index = NodeIndex(model)
    nodes = list(model.graph.node)
    assert index.reads == [node_inputs(n) for n in nodes]
    assert index.reads[1] == ["c", "r"] and index.implicit == {1: ["r"]}
    assert index.producer == producer_index(nodes)
    assert index.ancestors("y") == ancestors(nodes, ["y"]) == {0, 1, 2}
    assert index.ancestors("z") == {3} and index.ancestors("x") == set()


def test_an_index_is_shared_only_inside_the_block_and_per_model_object():
    model, other = _model(), _model()
    assert node_index(model) is not node_index(model)
    with shared_node_indices():
        first = node_index(model)
        assert node_index(model) is first
        assert node_index(other) is not first
    assert node_index(model) is not first


class _Reads(Pass):
    """Reads the index; rewrites (a copy) when ``modify``."""

    def __init__(self, modify: bool):
        self.modify = modify

    def call(self, model):
        node_index(model)
        if not self.modify:
            return PassResult(model, False)
        out = passes.clone(model)
        out.graph.node[3].op_type = "Neg"
        return PassResult(out, True)


def test_a_pass_manager_builds_an_index_once_per_model(monkeypatch):
    built = []
    real = NodeIndex.__init__

    def counting(self, model):
        built.append(model)
        real(self, model)

    monkeypatch.setattr(NodeIndex, "__init__", counting)
    PassManager([_Reads(False), _Reads(False), _Reads(True), _Reads(False)])(_model())
    assert len(built) == 2  # the input's (shared by the first three passes) and the rewritten model's


def test_a_block_shares_indices_within_its_own_thread_only():
    import threading

    model = _model()
    seen = []
    with shared_node_indices():
        shared = node_index(model)
        worker = threading.Thread(target=lambda: seen.extend([node_index(model), node_index(model)]))
        worker.start()
        worker.join()
        assert node_index(model) is shared
    assert seen[0] is not seen[1] and shared not in seen
