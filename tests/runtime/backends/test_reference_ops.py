"""Fixed onnx.reference kernels (runtime/backends/reference_ops.py) against onnxruntime, for the cases the
upstream kernels get wrong."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto
from onnx import helper as h
from onnx.reference import ReferenceEvaluator

from onnxtrain.runtime.backends.reference_ops import PATCHED_OPS


def _both(model: onnx.ModelProto, feeds: dict) -> tuple[list, list]:
    ours = ReferenceEvaluator(model, new_ops=PATCHED_OPS).run(None, feeds)
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    return ours, theirs


def test_global_max_pool_on_a_sequence_keeps_the_channels():
    node = h.make_node("GlobalMaxPool", ["x"], ["y"])
    graph = h.make_graph([node], "g", [h.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 5])],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    x = np.random.default_rng(0).standard_normal((2, 3, 5)).astype(np.float32)
    (ours,), (theirs,) = _both(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8), {"x": x})
    assert ours.shape == (2, 3, 1)
    np.testing.assert_array_equal(ours, theirs)


def test_loop_stacks_scan_outputs_of_any_rank():
    """Per iteration a (2, 3) matrix and a scalar: the scan outputs are (T, 2, 3) and (T,)."""
    body = h.make_graph(
        [h.make_node("Identity", ["cond"], ["cond_out"]),
         h.make_node("Add", ["acc", "x"], ["acc_out"]),
         h.make_node("Identity", ["acc_out"], ["scan_matrix"]),
         h.make_node("ReduceSum", ["acc_out"], ["scan_scalar"], keepdims=0)],
        "body",
        [h.make_tensor_value_info("i", TensorProto.INT64, []), h.make_tensor_value_info("cond", TensorProto.BOOL, []),
         h.make_tensor_value_info("acc", TensorProto.FLOAT, [2, 3])],
        [h.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         h.make_tensor_value_info("acc_out", TensorProto.FLOAT, [2, 3]),
         h.make_tensor_value_info("scan_matrix", TensorProto.FLOAT, [2, 3]),
         h.make_tensor_value_info("scan_scalar", TensorProto.FLOAT, [])])
    loop = h.make_node("Loop", ["trips", "go", "init"], ["final", "matrices", "scalars"], body=body)
    outputs = [h.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("final", "matrices", "scalars")]
    graph = h.make_graph([loop], "g", [h.make_tensor_value_info("trips", TensorProto.INT64, []),
                                       h.make_tensor_value_info("go", TensorProto.BOOL, []),
                                       h.make_tensor_value_info("init", TensorProto.FLOAT, [2, 3]),
                                       h.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])], outputs)
    rng = np.random.default_rng(0)
    feeds = {"trips": np.array(4), "go": np.array(True), "init": rng.standard_normal((2, 3)).astype(np.float32),
             "x": rng.standard_normal((2, 3)).astype(np.float32)}
    ours, theirs = _both(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8), feeds)
    assert [o.shape for o in ours] == [(2, 3), (4, 2, 3), (4,)]
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_scan_with_reversed_directions_and_other_axes():
    """A running sum over a (2, T, 3) input read along axis 1 backwards, its steps stacked on axis 1 backwards
    and, a second time, forwards on axis 0 (the form of a reverse-direction recurrence and of a Scan's backward)."""
    body = h.make_graph(
        [h.make_node("Add", ["acc", "x_t"], ["acc_out"]),
         h.make_node("Identity", ["acc_out"], ["backwards"]),
         h.make_node("Identity", ["acc_out"], ["forwards"])],
        "body",
        [h.make_tensor_value_info("acc", TensorProto.FLOAT, [2, 3]),
         h.make_tensor_value_info("x_t", TensorProto.FLOAT, [2, 3])],
        [h.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in ("acc_out", "backwards", "forwards")])
    scan = h.make_node("Scan", ["init", "x"], ["final", "backwards", "forwards"], body=body, num_scan_inputs=1,
                       scan_input_axes=[1], scan_input_directions=[1], scan_output_axes=[1, 0],
                       scan_output_directions=[1, 0])
    graph = h.make_graph([scan], "g", [h.make_tensor_value_info("init", TensorProto.FLOAT, [2, 3]),
                                       h.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 3])],
                         [h.make_tensor_value_info(n, TensorProto.FLOAT, None)
                          for n in ("final", "backwards", "forwards")])
    rng = np.random.default_rng(0)
    feeds = {"init": rng.standard_normal((2, 3)).astype(np.float32),
             "x": rng.standard_normal((2, 4, 3)).astype(np.float32)}
    ours, theirs = _both(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8), feeds)
    assert [o.shape for o in ours] == [(2, 3), (2, 4, 3), (4, 2, 3)]
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_softmax_cross_entropy_far_below_the_largest_score_is_finite():
    """A class 150 below the largest score: onnx.reference's log of the softmax gave inf (it underflows); the
    log-sum-exp form gives onnxruntime's loss, with class weights, ignore_index and each reduction."""
    rng = np.random.default_rng(0)
    scores = rng.standard_normal((4, 5, 3)).astype(np.float32)
    scores[0, 0, 1] = 150.0                       # label 2 at [0, 1] is then 150 below the largest
    labels = np.array([[1, 2, 0], [4, -1, 3], [0, 0, 2], [1, 3, 4]], np.int64)
    labels[0, 1] = 2
    for reduction in ("mean", "sum", "none"):
        for weighted in (False, True):
            inputs = ["scores", "labels", "weights"] if weighted else ["scores", "labels"]
            node = h.make_node("SoftmaxCrossEntropyLoss", inputs, ["loss", "log_prob"], reduction=reduction,
                               ignore_index=-1)
            graph = h.make_graph([node], "g", [h.make_tensor_value_info("scores", TensorProto.FLOAT, [4, 5, 3]),
                                               h.make_tensor_value_info("labels", TensorProto.INT64, [4, 3]),
                                               h.make_tensor_value_info("weights", TensorProto.FLOAT, [5])][
                                                   :len(inputs)],
                                 [h.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("loss", "log_prob")])
            feeds = {"scores": scores, "labels": labels, "weights": rng.uniform(0.5, 2, 5).astype(np.float32)}
            feeds = {k: v for k, v in feeds.items() if k in inputs}
            ours, theirs = _both(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8), feeds)
            assert np.isfinite(ours[0]).all()
            for a, b in zip(ours, theirs):
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_max_unpool_to_an_odd_output_shape_places_values_where_the_indices_say():
    """A 2x2 MaxPool over 11x11 and its MaxUnpool back to 11x11 (a MaxPool's gradient): upstream scatters into
    10x10 and fails on the indices of the 11-wide layout."""
    pool = h.make_node("MaxPool", ["x"], ["p", "i"], kernel_shape=[2, 2], strides=[2, 2])
    unpool = h.make_node("MaxUnpool", ["p", "i", "shape"], ["y"], kernel_shape=[2, 2], strides=[2, 2])
    graph = h.make_graph([pool, unpool], "g", [h.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 11, 11])],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                         [h.make_tensor("shape", TensorProto.INT64, [4], [2, 3, 11, 11])])
    x = np.random.default_rng(0).standard_normal((2, 3, 11, 11)).astype(np.float32)
    (ours,), (theirs,) = _both(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8), {"x": x})
    assert ours.shape == (2, 3, 11, 11)
    np.testing.assert_array_equal(ours, theirs)
    assert np.count_nonzero(ours) == 2 * 3 * 5 * 5
