import glob
import json
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxtrain.artifacts import LossType, generate_artifacts
from onnxtrain.artifacts.passes import BackwardOrder
from onnxtrain.artifacts.passes.recompute import forward_nodes
from onnxtrain.conventions import TrainingMeta, grad_output_name
from onnxtrain.ir.passes import ancestors
from onnxtrain.ir.types import infer_tensor_info
from onnxtrain.runtime.passes.specialize_reset import SpecializeReset
from tests.artifacts.as_built import as_built

N, C, S = 2, 4, 8


def _cnn() -> onnx.ModelProto:
    """Three 3x3 Conv + ReLU layers, global average pooling, a classifier; batch left dynamic."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=(C, 3 if i == 1 else C, 3, 3)).astype(np.float32) * 0.3,
                                     f"W{i}") for i in (1, 2, 3)]
    inits.append(numpy_helper.from_array(rng.normal(size=(5, C)).astype(np.float32), "Wc"))
    nodes, x = [], "x"
    for i in (1, 2, 3):
        nodes += [helper.make_node("Conv", [x, f"W{i}"], [f"c{i}"], pads=[1, 1, 1, 1], name=f"conv{i}"),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}")]
        x = f"r{i}"
    nodes += [helper.make_node("GlobalAveragePool", [x], ["g"]), helper.make_node("Flatten", ["g"], ["f"]),
              helper.make_node("Gemm", ["f", "Wc"], ["y"], transB=1)]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, S, S])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5])], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _training_model(tmp_path) -> onnx.ModelProto:
    with as_built():
        paths = generate_artifacts(_cnn(), requires_grad=["W1", "W2", "W3", "Wc"], frozen_params=[],
                                   loss=LossType.CrossEntropyLoss, artifact_directory=tmp_path)
    return onnx.load(paths["training"])


def _feeds(model: onnx.ModelProto) -> dict:
    rng = np.random.default_rng(1)
    init = {i.name: numpy_helper.to_array(i) for i in _cnn().graph.initializer}
    feeds = {"x": rng.normal(size=(N, 3, S, S)).astype(np.float32), "labels": np.array([1, 3], np.int64)}
    for i in model.graph.input:
        if i.name not in feeds:
            shape = [d.dim_value for d in i.type.tensor_type.shape.dim]
            feeds[i.name] = init[i.name] if i.name in init else np.zeros(shape, np.float32)
    return feeds


def _pass(model: onnx.ModelProto, ranks: bool) -> BackwardOrder:
    """The pass, with the ranks of the values (as generate_artifacts gives them) or without (a Shape per view)."""
    return BackwardOrder(infos=infer_tensor_info(model) if ranks else None)


def _specialized(model: onnx.ModelProto) -> onnx.ModelProto:
    """The graph the runtime runs after a gradient reset: each gradient written straight to its output."""
    return SpecializeReset(TrainingMeta.from_model(model).accumulation, True)(model).model


def _execution_order(model: onnx.ModelProto, tmp_path, tag: str) -> tuple[list[str], list[np.ndarray]]:
    """The node names in the order onnxruntime ran the graph the runtime runs after a reset, and the outputs."""
    model = _specialized(model)
    so = ort.SessionOptions()
    so.enable_profiling, so.profile_file_prefix = True, os.path.join(tmp_path, tag)
    session = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    outputs = session.run(None, _feeds(model))
    with open(session.end_profiling()) as f:
        events = [e for e in json.load(f) if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    assert glob.glob(os.path.join(tmp_path, tag + "*.json"))
    return [e["name"][: -len("_kernel_time")] for e in sorted(events, key=lambda e: e["ts"])], outputs


def test_conv_weight_gradients_are_still_written_straight_to_their_outputs(tmp_path):
    """Waiting for a weight gradient must not read the gradient itself: the runtime would then copy it to its
    output with an Identity instead of having its producer write it there."""
    model = _training_model(tmp_path)
    before = _specialized(model)
    after = _specialized(BackwardOrder()(model).model)
    copies = [[n.input[0] for n in m.graph.node if n.op_type == "Identity"] for m in (before, after)]
    assert copies[0] == []
    assert all(TrainingMeta.from_model(model).accumulation for _ in copies)
    # the classifier's Gemm and the biases' ReduceSums are read by the waits (small copies); no Conv weight's
    conv_grads = {grad_output_name(w) for w in ("W1", "W2", "W3")}
    producer = {o: n for n in after.graph.node for o in n.output}
    assert not [o for o in conv_grads if producer[o].op_type == "Identity"]


def _masks_and_grads(model: onnx.ModelProto) -> list[tuple[str, str]]:
    """(ReLU mask node, the node making the gradient it masks) for each ReLU."""
    producer = {o: n for n in model.graph.node for o in n.output}
    relu_out = {n.output[0] for n in model.graph.node if n.op_type == "Relu"}
    pairs = []
    for n in model.graph.node:
        if n.op_type == "Greater" and n.input[0] in relu_out:
            cast = next(m for m in model.graph.node if m.input and m.input[0] == n.output[0])
            mul = next(m for m in model.graph.node if cast.output[0] in m.input)
            dy = next(x for x in mul.input if x != cast.output[0])
            pairs.append((n.name, producer[dy].name))
    return pairs


@pytest.mark.parametrize("ranks", [False, True])
def test_the_gradients_are_the_same(tmp_path, ranks):
    model = _training_model(tmp_path)
    result = _pass(model, ranks)(model)
    assert result.modified
    shapes = [n for n in result.model.graph.node if n.op_type == "Shape" and "/waits" in n.name]
    views = [n for n in result.model.graph.node if n.op_type == "Reshape" and n.name.endswith("/waits")]
    assert views
    # with the ranks known, a view keeps its input's dimensions with [0] * rank: no Shape node
    assert len(shapes) == (0 if ranks else len(views))
    _, before = _execution_order(model, tmp_path, "before")
    _, after = _execution_order(result.model, tmp_path, "after")
    for a, b in zip(before, after):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("ranks", [False, True])
def test_relu_masks_wait_for_the_gradient_they_mask(tmp_path, ranks):
    """onnxruntime computes a ReLU's mask (it reads only the ReLU's output) during the forward, where it stays
    alive through the backward's start, unless the mask waits for the backward."""
    model = _training_model(tmp_path)
    pairs = _masks_and_grads(model)
    assert len(pairs) == 3
    order, _ = _execution_order(model, tmp_path, "before")
    assert any(order.index(mask) < order.index(grad) for mask, grad in pairs)  # what the pass is for
    rewritten = _pass(model, ranks)(model).model
    order, _ = _execution_order(rewritten, tmp_path, "after")
    for mask, grad in pairs:
        assert order.index(mask) > order.index(grad), mask


@pytest.mark.parametrize("ranks", [False, True])
def test_each_weight_gradient_is_computed_before_the_backward_moves_on(tmp_path, ranks):
    """conv3's weight gradient (which reads conv3's dY and input) is computed before conv2's input gradient,
    not after the whole chain of input gradients."""
    model = _training_model(tmp_path)
    producer = {o: n for n in model.graph.node for o in n.output}
    where = producer[grad_output_name("W3")]
    reshape = producer[where.input[1]]
    assert reshape.op_type == "Reshape"   # of the product that makes dW3, which is what must run early
    dw3 = producer[reshape.input[0]].name
    forward = forward_nodes(model.graph.node, model.graph.output[0].name)
    nodes = list(model.graph.node)
    backward = [n for k, n in enumerate(nodes) if k not in forward]
    # conv2's dX: a Conv of dY with W2 flipped, or on small images the ConvTranspose of dY with W2
    w2_readers = [n.name for n in backward if n.op_type in ("Conv", "ConvTranspose")
                  and "W2" in {n.input[1], *(x for a in ancestors(backward, [n.input[1]]) for x in backward[a].input)}]
    assert len(w2_readers) == 1
    order, _ = _execution_order(model, tmp_path, "before")
    assert order.index(dw3) > order.index(w2_readers[0])
    rewritten = _pass(model, ranks)(model).model
    order, _ = _execution_order(rewritten, tmp_path, "after")
    assert order.index(dw3) < order.index(w2_readers[0])


def test_a_graph_without_backward_is_left_alone():
    model = _cnn()
    model.graph.output[0].name = "y"
    assert not BackwardOrder(loss="y")(model).modified
