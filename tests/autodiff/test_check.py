"""The numerical gradient check itself (autodiff/check.py)."""

from __future__ import annotations

import numpy as np

from onnxtrain.autodiff.check import check_gradients, single_node_model


def test_finite_differences_perturb_an_input_that_is_a_strided_view():
    # a value captured from a run is often a transposed view: its finite differences must not be silently zero
    x = np.random.default_rng(0).standard_normal((3, 4)).T
    assert not x.flags["C_CONTIGUOUS"]
    model = single_node_model("Tanh", {"x": x})
    report = check_gradients(model, {"x": x}, wrt=["x"])
    assert report.ok, report.errors
    np.testing.assert_allclose(report.numeric["x"], report.weights["y0"] * (1 - np.tanh(x) ** 2), rtol=1e-6)
