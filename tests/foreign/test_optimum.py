"""A BERT classifier exported by Hugging Face optimum (tests/foreign/data/make_optimum.py): inputs
``input_ids``, ``attention_mask``, ``token_type_ids`` with axes ``batch_size`` and ``sequence_length``, opset 18,
Linear weights renamed ``onnx::MatMul_*`` and stored transposed, zero biases and ones LayerNorm weights
de-duplicated into Identity aliases (each trains as its own parameter, as in torch)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from onnxtrain.artifacts import LossType
from tests.foreign.harness import DATA, Trained, finite_difference_errors

MODEL = DATA / "bert_optimum.onnx"
INPUTS = ("input_ids", "attention_mask", "token_type_ids")


@pytest.fixture(scope="module")
def ref():
    return dict(np.load(DATA / "bert_optimum.npz"))


def _feeds(ref, rows=slice(None), length=None):
    return [ref[k][rows, :length] for k in INPUTS] + [ref["labels"][rows]]


def test_gradients_match_torch_and_finite_differences(tmp_path, ref):
    run = Trained(str(MODEL), tmp_path, LossType.CrossEntropyLoss)
    expected = {k.removeprefix("grad:"): v for k, v in ref.items() if k.startswith("grad:")}
    assert set(run.trainable) == set(expected)  # every torch parameter, aliases included, and nothing else
    loss, grads = run.gradients(*_feeds(ref))
    assert abs(loss - float(ref["loss"])) <= 1e-5 * float(ref["loss"])
    scale = max(float(np.linalg.norm(g)) for g in expected.values())
    for name, want in expected.items():
        assert np.linalg.norm(grads[name] - want) <= 1e-4 * np.linalg.norm(want) + 1e-6 * scale, name
    errors = finite_difference_errors(run, _feeds(ref), per_parameter=2)
    assert max(errors.values()) <= 1.0, errors


def test_trains_at_other_sizes_and_exports_with_the_same_inputs(tmp_path, ref):
    run = Trained(str(MODEL), tmp_path, LossType.CrossEntropyLoss, requires_grad=["classifier.*", "bert.pooler.*"])
    session = ort.InferenceSession(str(run.export()), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == list(INPUTS)
    assert session.get_inputs()[0].shape == ["batch_size", "sequence_length"]
    np.testing.assert_allclose(session.run(None, dict(zip(INPUTS, _feeds(ref))))[0], ref["logits"], rtol=1e-4,
                               atol=1e-5)
    losses = run.train(5, *_feeds(ref))
    assert losses[-1] < losses[0]
    run.train(1, *_feeds(ref, slice(0, 2), 5))  # another batch size and sequence length
    assert sorted(run.trainable) == ["bert.pooler.dense.bias", "bert.pooler.dense.weight", "classifier.bias",
                                     "classifier.weight"]  # the pooler's bias is an alias in the file
