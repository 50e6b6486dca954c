"""scikit-learn models converted by skl2onnx, fine-tuned on new data on the device.

skl2onnx ends a classifier with ``ai.onnx.ml`` ops: the label (int64 or string) through ArrayFeatureExtractor,
and the probabilities as a ZipMap (a sequence of maps) unless converted with ``zipmap=False``. onnxtrain takes
those ops out of the training graphs; a loss asked to read their outputs gets an error naming the output and
the logits to use instead. Linear models convert to ``LinearClassifier``/``LinearRegressor`` (weights as
attributes, no gradient) unless ``black_op`` asks for MatMul/Add.
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from onnxtrain import blocks
from onnxtrain.artifacts import LossType
from tests.foreign.harness import Trained, finite_difference_errors

pytest.importorskip("skl2onnx")
torch = pytest.importorskip("torch")
from skl2onnx import convert_sklearn  # noqa: E402
from skl2onnx.common.data_types import FloatTensorType  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.linear_model import LogisticRegression  # noqa: E402
from sklearn.neural_network import MLPClassifier, MLPRegressor  # noqa: E402

LINEAR_OPS = {"LinearClassifier", "LinearRegressor", "Normalizer"}


@pytest.fixture(scope="module")
def digits():
    """Digits scaled to [0, 1]; the first 300 pre-train, the next 60 are one user's new data."""
    d = load_digits()
    x = (d.data / 16).astype(np.float32)
    return x[:300], d.target[:300], x[300:360], d.target[300:360]


def _convert(model, zipmap: bool = True, black_op=None) -> onnx.ModelProto:
    options = None if zipmap or not hasattr(model, "classes_") else {id(model): {"zipmap": False}}
    return convert_sklearn(model, initial_types=[("X", FloatTensorType([None, 64]))], options=options,
                           target_opset={"": 17, "ai.onnx.ml": 3}, black_op=black_op)


def _fit(estimator, x, y):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ConvergenceWarning: a few iterations are enough here
        return estimator.fit(x, y)


def _logits(model: onnx.ModelProto) -> str:
    """The value the classifier's Softmax (or Sigmoid) reads."""
    (node,) = [n for n in model.graph.node if n.op_type in ("Softmax", "Sigmoid")]
    return node.input[0]


def _mlp_forward_torch(x, weights, names):
    w1, b1, w2, b2 = (torch.tensor(weights[n], dtype=torch.float64, requires_grad=True) for n in names)
    return torch.relu(torch.tensor(x, dtype=torch.float64) @ w1 + b1) @ w2 + b2, (w1, b1, w2, b2)


def test_mlp_classifier_fine_tunes_on_new_data(tmp_path, digits):
    x, y, x_new, y_new = digits
    clf = _fit(MLPClassifier(hidden_layer_sizes=(16,), max_iter=40, random_state=0), x, y)
    model = _convert(clf, zipmap=False)
    run = Trained(model, tmp_path, LossType.CrossEntropyLoss, blocks.AdamW(), loss_input_names=[_logits(model)])
    names = ["coefficient", "intercepts", "coefficient1", "intercepts1"]
    assert run.trainable == names

    loss, grads = run.gradients(x_new, y_new)
    logits, params = _mlp_forward_torch(x_new, {n: p.data for n, p in run.state.parameters}, names)
    ref = torch.nn.functional.cross_entropy(logits, torch.tensor(y_new))
    ref.backward()
    assert abs(loss - float(ref)) <= 1e-5 * float(ref)
    for n, p in zip(names, params):
        np.testing.assert_allclose(grads[n], p.grad.numpy(), rtol=1e-4, atol=1e-6, err_msg=n)
    errors = finite_difference_errors(run, [x_new, y_new], per_parameter=4)
    assert max(errors.values()) <= 1.0, errors

    # The exported model still answers with the probabilities, as skl2onnx's did before training...
    before = ort.InferenceSession(str(run.export()), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(before.run(["probabilities"], {"X": x_new})[0], clf.predict_proba(x_new),
                               rtol=1e-4, atol=1e-6)
    run.optimizer.set_learning_rate(0.01)
    losses = run.train(30, x_new, y_new)
    assert losses[-1] < 0.5 * losses[0], losses
    # ...and the trained weights go back into scikit-learn: the same probabilities.
    trained = {n: p.data for n, p in run.state.parameters}
    clf.coefs_ = [trained["coefficient"], trained["coefficient1"]]
    clf.intercepts_ = [trained["intercepts"].reshape(-1), trained["intercepts1"].reshape(-1)]
    after = ort.InferenceSession(str(run.export()), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(after.run(["probabilities"], {"X": x_new})[0], clf.predict_proba(x_new),
                               rtol=1e-4, atol=1e-6)
    assert (clf.predict(x_new) == y_new).mean() > 0.9


def test_loss_on_the_label_output_names_it_and_the_logits(tmp_path, digits):
    x, y, _, _ = digits
    model = _convert(_fit(MLPClassifier(hidden_layer_sizes=(8,), max_iter=5, random_state=0), x, y), zipmap=False)
    logits = _logits(model)
    with pytest.raises(ValueError, match=rf"'label'.*int64 tensor made by ai\.onnx\.ml::ArrayFeatureExtractor.*"
                                         rf"'probabilities' is a Softmax of '{logits}'.*"
                                         rf"loss_input_names=\['{re.escape(logits)}'\]"):
        Trained(model, tmp_path, LossType.CrossEntropyLoss)
    with pytest.raises(ValueError, match=r"additional_output_names: 'label' is an int64 tensor"):
        Trained(model, tmp_path, LossType.CrossEntropyLoss, loss_input_names=[logits],
                additional_output_names=["label"])
    with pytest.warns(UserWarning, match=rf"'probabilities', the output of a Softmax.*\['{re.escape(logits)}'\]"):
        Trained(model, tmp_path, LossType.CrossEntropyLoss, loss_input_names=["probabilities"])
    # a custom block reads every output: it would get one fewer than the file has
    with pytest.raises(ValueError, match=r"NLLLossOfProbabilities reads every output of the model, and \['label'\] "
                                         r"cannot be read.*pass loss_input_names"):
        Trained(model, tmp_path, NLLLossOfProbabilities())
    with pytest.raises(ValueError, match=r"cannot read 'label' \(the model's first output is the loss\)"):
        Trained(model, tmp_path, None)


class NLLLossOfProbabilities(blocks.Block):
    def build(self, probabilities):
        return blocks.NLLLoss()(blocks.Log()(probabilities))


def test_zipmap_and_string_labels_name_the_output_to_use(tmp_path, digits):
    x, y, x_new, y_new = digits
    words = np.array(["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"])
    clf = _fit(MLPClassifier(hidden_layer_sizes=(8,), max_iter=5, random_state=0), x, words[y])
    model = _convert(clf)  # skl2onnx's default: string labels, probabilities as a ZipMap
    logits = _logits(model)
    with pytest.raises(ValueError, match=r"'output_label'.*a string tensor made by ai\.onnx\.ml::"):
        Trained(model, tmp_path, LossType.CrossEntropyLoss)
    with pytest.raises(ValueError, match=rf"'output_probability'.*a sequence of maps made by ai\.onnx\.ml::ZipMap"
                                         rf".*loss_input_names=\['{re.escape(logits)}'\]"):
        Trained(model, tmp_path, LossType.CrossEntropyLoss, loss_input_names=["output_probability"])
    # What the message says works: the logits, with class indices in the order of clf.classes_.
    run = Trained(model, tmp_path / "ok", LossType.CrossEntropyLoss, loss_input_names=[logits])
    labels = np.searchsorted(clf.classes_, words[y_new])
    losses = run.train(5, x_new, labels)
    assert losses[-1] < losses[0]


def test_binary_classifier_trains_with_bce_on_its_logit(tmp_path, digits):
    x, y, x_new, y_new = digits
    model = _convert(_fit(MLPClassifier(hidden_layer_sizes=(8,), max_iter=20, random_state=0), x, y % 2),
                     zipmap=False)
    run = Trained(model, tmp_path, blocks.BCEWithLogitsLoss(), loss_input_names=[_logits(model)])
    target = (y_new % 2).astype(np.float32).reshape(-1, 1)
    errors = finite_difference_errors(run, [x_new, target])
    assert max(errors.values()) <= 1.0, errors
    losses = run.train(10, x_new, target)
    assert losses[-1] < losses[0]


def test_mlp_regressor_trains_with_mse(tmp_path, digits):
    x, y, x_new, y_new = digits
    model = _convert(_fit(MLPRegressor(hidden_layer_sizes=(8,), max_iter=20, random_state=0), x, y.astype(float)))
    run = Trained(model, tmp_path, LossType.MSELoss)  # its output "variable" is a float tensor [N, 1]
    target = y_new.astype(np.float32).reshape(-1, 1)
    errors = finite_difference_errors(run, [x_new, target])
    assert max(errors.values()) <= 1.0, errors
    run.optimizer.set_learning_rate(1e-3)
    losses = run.train(10, x_new, target)
    assert losses[-1] < losses[0]


def test_logistic_regression_trains_as_converted_and_trees_are_refused(tmp_path, digits):
    """skl2onnx's default LogisticRegression (LinearClassifier, Normalizer, ZipMap) is rewritten in the default
    domain (artifacts/ml_ops.py); the error for its label output names the logits that then train."""
    x, y, x_new, y_new = digits
    clf = _fit(LogisticRegression(max_iter=50), x, y)
    with pytest.raises(ValueError, match=r"'output_label'.*'probabilities' is a Softmax of '(.*)'.*"
                                         r"loss_input_names=\['LinearClassifier/Gemm'\]") as error:
        Trained(_convert(clf), tmp_path, LossType.CrossEntropyLoss)
    run = Trained(_convert(clf), tmp_path / "ok", LossType.CrossEntropyLoss,
                  loss_input_names=["LinearClassifier/Gemm"])
    assert "LinearClassifier/Gemm" in str(error.value)
    assert sorted(run.trainable) == ["LinearClassifier.coefficients", "LinearClassifier.intercepts"]
    errors = finite_difference_errors(run, [x_new, y_new])
    assert max(errors.values()) <= 1.0, errors
    losses = run.train(5, x_new, y_new)
    assert losses[-1] < losses[0]
    # the same model converted with black_op: skl2onnx's own MatMul/Add, initializers coef and intercept
    model = _convert(clf, zipmap=False, black_op=LINEAR_OPS)
    run = Trained(model, tmp_path / "black_op", LossType.CrossEntropyLoss, loss_input_names=[_logits(model)])
    assert sorted(run.trainable) == ["coef", "intercept"]

    from sklearn.tree import DecisionTreeClassifier

    tree = _fit(DecisionTreeClassifier(max_depth=3), x, y)
    with pytest.raises(ValueError, match=r"every output .*ml::TreeEnsembleClassifier.*tree ensembles.*no gradient"):
        Trained(_convert(tree, zipmap=False), tmp_path / "tree", LossType.CrossEntropyLoss)



def test_float64_conversion_gets_an_error_with_the_fix(tmp_path, digits):
    """skl2onnx with DoubleTensorType keeps scikit-learn's float64 weights; the optimizer updates float32."""
    from skl2onnx.common.data_types import DoubleTensorType

    x, y, _, _ = digits
    clf = _fit(MLPClassifier(hidden_layer_sizes=(8,), max_iter=5, random_state=0), x, y)
    model = convert_sklearn(clf, initial_types=[("X", DoubleTensorType([None, 64]))],
                            options={id(clf): {"zipmap": False}}, target_opset={"": 17, "ai.onnx.ml": 3})
    with pytest.raises(TypeError, match=r"float32 parameters; the 4 trainable parameters are float64 \(e\.g\. "
                                        r"'coefficient'\): convert the model to float32 first \(skl2onnx: "
                                        r"FloatTensorType"):
        Trained(model, tmp_path, LossType.CrossEntropyLoss, loss_input_names=[_logits(model)])
