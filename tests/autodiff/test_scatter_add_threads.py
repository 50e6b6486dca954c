"""Gradients that add into repeated positions (an embedding's rows) on onnxruntime with several threads.

onnxruntime's ScatterND(reduction="add") adds its slices on several threads without regard for repeated
indices, so additions into one row race and some are lost (at 2 threads, an embedding row looked up 1,024 times
kept about half of its gradient, differently on every run). onnx.reference runs one thread, so the finite
difference checks of tests/autodiff/test_rules.py cannot see it: these run the gradient graphs on onnxruntime.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from onnxtrain.autodiff.check import gradient_model, single_node_model

THREADS = 4
RUNS = 5


def _gradients(model: onnx.ModelProto, inputs: dict[str, np.ndarray], weights: np.ndarray) -> list[np.ndarray]:
    """d(sum(y * weights))/dx from onnxruntime at THREADS threads, RUNS times."""
    gmodel = gradient_model(model, ["x"], {"y0": weights})
    so = ort.SessionOptions()
    so.intra_op_num_threads = THREADS
    session = ort.InferenceSession(gmodel.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return [session.run(None, inputs)[1] for _ in range(RUNS)]


@pytest.mark.parametrize("rows", [1, 3])
def test_an_embedding_looked_up_by_every_token_gets_every_tokens_gradient(rows):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, 384)).astype(np.float32)
    ids = rng.integers(0, rows, size=(8, 128)).astype(np.int64)  # 1,024 lookups of at most 3 rows (BERT's sizes)
    model = single_node_model("Gather", {"x": x, "i": ids}, axis=0)  # indices fed: onnxruntime cannot fold
    weights = rng.standard_normal((8, 128, 384)).astype(np.float32)
    want = np.zeros((rows, 384), np.float64)
    np.add.at(want, ids.ravel(), weights.reshape(-1, 384).astype(np.float64))
    for got in _gradients(model, {"x": x, "i": ids}, weights):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)


def test_gather_nd_slices_repeated_at_two_index_levels():
    """Indices of depth 2 (slices of the last axis): scattered at their flat positions."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 384)).astype(np.float32)
    ids = np.stack([rng.integers(0, 2, 1024), rng.integers(-3, 3, 1024)], axis=1).astype(np.int64)  # negatives too
    model = single_node_model("GatherND", {"x": x, "i": ids})
    weights = rng.standard_normal((1024, 384)).astype(np.float32)
    want = np.zeros((2, 3, 384), np.float64)
    np.add.at(want, (ids[:, 0], ids[:, 1] % 3), weights.astype(np.float64))
    for got in _gradients(model, {"x": x, "i": ids}, weights):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)


def test_no_gradient_graph_adds_with_scatter_nd():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((5, 4)).astype(np.float32)
    for model in (single_node_model("Gather", {"x": x}, constant_inputs={"i": np.array([0, 0, 4], np.int64)}),
                  single_node_model("GatherND", {"x": x}, constant_inputs={"i": np.array([[1, 2], [1, 2]], np.int64)})):
        gmodel = gradient_model(model, ["x"], {"y0": np.ones((3, 4) if model.graph.node[0].op_type == "Gather"
                                                             else (2,), np.float32)})
        assert "ScatterND" not in {n.op_type for n in gmodel.graph.node}
