"""``artifacts/ml_ops.py``: skl2onnx's linear models and scalers rewritten in the default domain compute what
onnxruntime's ai.onnx.ml kernels compute (labels and probabilities), and then train."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from onnxtrain.artifacts import LossType
from onnxtrain.artifacts.ml_ops import lower_ml_ops
from tests.foreign.harness import Trained, finite_difference_errors

pytest.importorskip("skl2onnx")
from skl2onnx import convert_sklearn  # noqa: E402
from skl2onnx.common.data_types import FloatTensorType  # noqa: E402
from sklearn.linear_model import LinearRegression, LogisticRegression, SGDRegressor  # noqa: E402
from sklearn.pipeline import make_pipeline  # noqa: E402
from sklearn.preprocessing import MinMaxScaler, Normalizer, StandardScaler  # noqa: E402

RNG = np.random.default_rng(0)
X = RNG.standard_normal((40, 5)).astype(np.float32)
Y3 = RNG.integers(0, 3, 40)
WORDS = np.array(["cat", "dog", "eel"])


def _fit(model, y):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model.fit(X, y)


CASES = {
    "logistic_3": lambda: _fit(LogisticRegression(), Y3),
    "logistic_binary": lambda: _fit(LogisticRegression(), Y3 % 2),
    "logistic_strings": lambda: _fit(LogisticRegression(), WORDS[Y3]),
    "ovr_binary_strings": lambda: _fit(LogisticRegression(), WORDS[Y3 % 2]),
    "scaled_logistic": lambda: _fit(make_pipeline(StandardScaler(), LogisticRegression()), Y3),
    "minmax_l2_logistic": lambda: _fit(make_pipeline(MinMaxScaler(), Normalizer("l2"), LogisticRegression()), Y3),
    "linear_regression": lambda: _fit(LinearRegression(), X @ np.arange(5.0)),
    "two_targets": lambda: _fit(LinearRegression(), np.stack([X @ np.arange(5.0), X[:, 0]], 1)),
    "scaled_sgd_regressor": lambda: _fit(make_pipeline(StandardScaler(), SGDRegressor()), X @ np.arange(5.0)),
}


def _convert(model, zipmap: bool = False) -> onnx.ModelProto:
    options = {id(model): {"zipmap": False}} if not zipmap and hasattr(model, "classes_") else None
    return convert_sklearn(model, initial_types=[("X", FloatTensorType([None, 5]))], options=options,
                           target_opset={"": 17, "ai.onnx.ml": 3})


def _run(model: onnx.ModelProto) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"X": X})


@pytest.mark.parametrize("case", list(CASES))
def test_lowered_model_computes_what_onnxruntime_ml_kernels_compute(case):
    source = _convert(CASES[case]())
    ml_ops = {n.op_type for n in source.graph.node if n.domain == "ai.onnx.ml"}
    lowered = onnx.ModelProto()
    lowered.CopyFrom(source)
    weights = {i.name: onnx.numpy_helper.to_array(i) for i in lowered.graph.initializer}
    replaced = lower_ml_ops(lowered, weights)
    assert set(replaced) == ml_ops - {"ArrayFeatureExtractor", "ZipMap"} and replaced
    assert not any(n.domain == "ai.onnx.ml" and n.op_type in replaced for n in lowered.graph.node)
    del lowered.graph.initializer[:]
    lowered.graph.initializer.extend(onnx.numpy_helper.from_array(v, k) for k, v in weights.items())
    for got, want in zip(_run(lowered), _run(source), strict=True):
        if want.dtype.kind in "OUi":
            np.testing.assert_array_equal(got, want)
        else:
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_default_logistic_regression_file_trains(tmp_path):
    """skl2onnx's default conversion (ZipMap, LinearClassifier, Normalizer): the loss reads the Gemm's scores."""
    clf = CASES["scaled_logistic"]()
    source = _convert(clf, zipmap=True)
    with pytest.raises(ValueError, match=r"'output_label'.*"):
        Trained(source, tmp_path / "default", LossType.CrossEntropyLoss)
    run = Trained(source, tmp_path, LossType.CrossEntropyLoss, loss_input_names=["probability_tensor"])
    assert sorted(run.trainable) == ["LinearClassifier.coefficients", "LinearClassifier.intercepts"]
    np.testing.assert_array_equal(run.state.parameters["LinearClassifier.coefficients"].data,
                                  clf[-1].coef_.astype(np.float32))
    errors = finite_difference_errors(run, [X, Y3])
    assert max(errors.values()) <= 1.0, errors
    losses = run.train(10, X, Y3)
    assert losses[-1] < losses[0]

