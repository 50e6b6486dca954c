"""OrtSession: persistent arrays bound once, feeds bound at every run, results always from the arrays given."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from onnxtrain.runtime.backends.ort import OrtSession


def affine_session() -> OrtSession:
    """y = x * w + b, with x a feed, w a persistent input and y written into a persistent output."""
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["y"])], "affine",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3]),
         helper.make_tensor_value_info("w", TensorProto.FLOAT, [3]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return OrtSession(model)


def test_each_run_reads_the_feeds_and_state_it_is_given(rng):
    session = affine_session()
    w1, w2, b = (rng.standard_normal(3).astype(np.float32) for _ in range(3))
    x = rng.standard_normal((4, 3)).astype(np.float32)
    out = {"y": np.empty((4, 3), np.float32)}
    for w in (w1, w2, w1, w2):  # alternating persistent arrays, as double buffers do
        session.run({"x": x}, out, [], state={"w": w, "b": b})
        np.testing.assert_allclose(out["y"], x * w + b, rtol=1e-6)
    x[...] = 2.0  # the same feed array with new contents
    session.run({"x": x}, out, [], state={"w": w1, "b": b})
    np.testing.assert_allclose(out["y"], np.broadcast_to(2.0 * w1 + b, (4, 3)), rtol=1e-6)
    w1[...] = 3.0  # a persistent array written in place between runs
    session.run({"x": x}, out, [], state={"w": w1, "b": b})
    np.testing.assert_allclose(out["y"], np.broadcast_to(6.0 + b, (4, 3)), rtol=1e-6)


def test_state_the_model_does_not_read_and_strided_feeds(rng):
    session = affine_session()
    w, b = rng.standard_normal(3).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    wide = rng.standard_normal((5, 6)).astype(np.float32)
    x = wide[:, ::2]  # not contiguous
    out = {"y": np.empty((5, 3), np.float32)}
    for _ in range(12):  # a new unused array every run: more distinct keys than the bindings kept
        session.run({"x": x, "unused": np.ones(2)}, out, [], state={"w": w, "b": b, "other": np.zeros(3)})
        np.testing.assert_allclose(out["y"], x * w + b, rtol=1e-6)


def test_fetched_outputs_do_not_alias_between_runs(rng):
    session = affine_session()
    w, b = np.ones(3, np.float32), np.zeros(3, np.float32)
    first = session.run({"x": np.ones((2, 3), np.float32)}, {}, ["y"], state={"w": w, "b": b})[0]
    second = session.run({"x": np.full((3, 3), 5, np.float32)}, {}, ["y"], state={"w": w, "b": b})[0]
    np.testing.assert_array_equal(first, np.ones((2, 3)))  # not overwritten by the second run
    np.testing.assert_array_equal(second, np.full((3, 3), 5))
