"""Keras models through the three ways a TensorFlow user gets ONNX (tests/foreign/data/tf2onnx/make_models.py makes
them offline): ``tf2onnx.convert.from_keras`` (opsets 13 and 17, also with ``inputs_as_nchw``), the command line
on a SavedModel (``python -m tf2onnx.convert --saved-model``: every name under ``StatefulPartitionedCall/``, the
output ``output_0``) and Keras 3's ``model.export(format="onnx")`` on the TensorFlow backend (tf2onnx underneath,
output ``Identity:0``). The models add what tests/foreign/test_keras.py lacks: BatchNormalization after a Dense
(folded into a Mul and an Add, not into a convolution), MaxPooling on odd sizes, a depthwise conv with
depth_multiplier=2 on a dynamic image size, Flatten, a bidirectional LSTM feeding a GRU(reset_after=False) over a
dynamic sequence, and a causal MultiHeadAttention over a dynamic sequence.

Each: the loss and gradients against TensorFlow's (tf.GradientTape, offline, on the same weights and batch) and
against float64 finite differences, the untrained export against Keras's predict, AdamW steps at two batch sizes.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from onnxtrain import blocks
from onnxtrain.artifacts import LossType, generate_artifacts
from tests.foreign.harness import DATA, Trained, finite_difference_errors

TF2ONNX = DATA / "tf2onnx"
CASES = ["mlp_saved", "cnn_keras13", "cnn_nchw", "cnn_flat_export", "bilstm_keras17", "attn_keras13", "prep_keras17"]


def _loss(ref: dict) -> LossType:
    return LossType.CrossEntropyLoss if ref["y"].dtype == np.int64 else LossType.MSELoss


def _readers(path) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for node in onnx.load(path).graph.node:
        for name in node.input:
            found.setdefault(name, set()).add(node.op_type)
    return found


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    cache = {}

    def get(case: str) -> tuple[Trained, dict]:
        if case not in cache:
            ref = dict(np.load(TF2ONNX / f"{case}.npz"))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")   # attn: its 0-d constants stay constants (warned)
                run = Trained(str(TF2ONNX / f"{case}.onnx"), tmp_path_factory.mktemp(case), _loss(ref),
                              blocks.AdamW())
            cache[case] = (run, ref)
        return cache[case]

    return get


@pytest.mark.parametrize("case", CASES)
def test_untrained_export_matches_keras(trained, case):
    run, ref = trained(case)
    session = ort.InferenceSession(str(run.export()), providers=["CPUExecutionProvider"])
    got = session.run(None, {session.get_inputs()[0].name: ref["x"]})[0]
    np.testing.assert_allclose(got, ref["output"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", CASES)
def test_gradients_match_tensorflow(trained, case):
    run, ref = trained(case)
    loss, grads = run.gradients(ref["x"], ref["y"])
    assert abs(loss - float(ref["loss"])) <= 1e-5 * abs(float(ref["loss"])), (loss, float(ref["loss"]))
    with_tf = [k.removeprefix("grad:") for k in ref if k.startswith("grad:")]
    assert len(with_tf) >= 4
    readers = _readers(TF2ONNX / f"{case}.onnx")
    # make_models.py matches initializers to Keras variables by value: a copy only Shape reads matches too
    assert all(readers[n] == {"Shape"} for n in with_tf if n not in run.trainable)
    scale = max(float(np.linalg.norm(g)) for g in grads.values())
    for name in (n for n in with_tf if n in run.trainable):  # atol: the attention's key bias has a zero gradient
        want = ref[f"grad:{name}"]
        assert np.linalg.norm(grads[name] - want) <= 2e-5 * np.linalg.norm(want) + 1e-6 * scale, name


@pytest.mark.parametrize("case", CASES)
def test_gradients_match_finite_differences(trained, case):
    run, ref = trained(case)
    x = ref["x"]
    if case.startswith("cnn_keras"):  # 10x10, not 11x11: onnx.reference's MaxUnpool cannot take a remainder
        x = x[:, :10, :10]
    elif case == "cnn_nchw":
        x = x[:, :, :10, :10]
    errors = finite_difference_errors(run, [x, ref["y"]], per_parameter=2)
    assert len(errors) == len(run.trainable) > 0
    assert max(errors.values()) <= 1.0, errors


@pytest.mark.parametrize("case", CASES)
def test_adamw_trains_at_two_batch_sizes(trained, case):
    run, ref = trained(case)
    run.optimizer.set_learning_rate(0.01)
    losses = run.train(4, ref["x"], ref["y"])
    assert losses[-1] < losses[0], losses
    assert np.isfinite(run.train(1, ref["x"][:2], ref["y"][:2])).all()


def test_dynamic_image_sizes_through_max_pooling(tmp_path):
    """keras.Input((None, None, 3)): MaxPooling2D(2) drops an odd row and column, whose gradient is zero."""
    run = Trained(str(TF2ONNX / "cnn_keras13.onnx"), tmp_path, LossType.CrossEntropyLoss, blocks.AdamW())
    rng = np.random.default_rng(0)
    for size in (8, 9, 12, 13):
        x = rng.standard_normal((2, size, size, 3)).astype(np.float32)
        _, grads = run.gradients(x, np.array([1, 3]))
        assert all(np.isfinite(g).all() for g in grads.values()) and any(g.any() for g in grads.values())


@pytest.mark.parametrize("case", ["bilstm_keras17", "attn_keras13"])
def test_other_sequence_lengths(trained, case):
    run, ref = trained(case)
    x = np.concatenate([ref["x"], ref["x"][:, :3]], axis=1)   # 6 + 3 tokens, 5 + 3 steps
    losses = run.train(2, x, ref["y"])
    assert np.isfinite(losses).all()


def test_copies_read_only_for_their_shape_are_not_trained(tmp_path):
    """A Keras attention over a dynamic sequence: tf2onnx's einsum reads the Shape of a second, 5-D copy of each
    projection weight. requires_grad=None used to train those copies, with a zero gradient at every step and a
    warning that they do not reach the loss."""
    path = TF2ONNX / "attn_keras13.onnx"
    readers = _readers(path)
    copies = [n for n, ops in readers.items() if ops == {"Shape"} and n.startswith("const_fold_opt")]
    assert len(copies) == 3
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = Trained(str(path), tmp_path, LossType.MSELoss, blocks.AdamW())
    assert not set(copies) & {n for n, _ in run.state.parameters}
    assert not [w for w in caught if "do not reach the loss" in str(w.message)]
    assert len(run.trainable) == 12   # q, k, v, output projections, LayerNorm and head: weights and biases


def test_requires_grad_by_tf2onnx_scope(tmp_path):
    """Head-only fine-tuning of a SavedModel conversion, named as tf2onnx names it: the other weights stay."""
    path = TF2ONNX / "mlp_saved.onnx"
    ref = dict(np.load(TF2ONNX / "mlp_saved.npz"))
    run = Trained(str(path), tmp_path, LossType.CrossEntropyLoss, blocks.AdamW(),
                  requires_grad=["StatefulPartitionedCall/functional_1/logits_1/*"])
    assert sorted(run.trainable) == sorted(n.removeprefix("grad:") for n in ref if "logits_1" in n)
    _, grads = run.gradients(ref["x"], ref["y"])
    for name, g in grads.items():
        np.testing.assert_allclose(g, ref[f"grad:{name}"], rtol=1e-5, atol=1e-7)
    run.train(2, ref["x"], ref["y"])
    source = {i.name: onnx.numpy_helper.to_array(i) for i in onnx.load(path).graph.initializer}
    exported = {i.name: onnx.numpy_helper.to_array(i) for i in onnx.load(run.export()).graph.initializer}
    assert set(exported) == set(source)
    for name, value in source.items():   # the other weights stay constants of the graphs, as converted
        assert np.array_equal(exported[name], value) == (name not in run.trainable), name


@pytest.mark.parametrize("name, scope", [("logits/kernel", "StatefulPartitionedCall/functional_1/logits_1"),
                                         ("batch_normalization/gamma:0",
                                          "StatefulPartitionedCall/functional_1/batch_normalization_1")])
def test_a_keras_variable_path_names_the_layers_tensors(tmp_path, name, scope):
    with pytest.raises(ValueError, match=rf"{name!r} is not an initializer.*Keras variable path.*tf2onnx.*"
                                         rf"requires_grad=\['{scope}/\*'\]"):
        generate_artifacts(str(TF2ONNX / "mlp_saved.onnx"), requires_grad=[name], loss=LossType.CrossEntropyLoss,
                           optimizer=blocks.AdamW(), artifact_directory=tmp_path)


def _unused_initializers(graph: onnx.GraphProto) -> list[str]:
    """Initializers of ``graph`` and its subgraphs that no node there (or below) reads."""
    def read(g: onnx.GraphProto) -> set[str]:
        names = {o.name for o in g.output}
        for node in g.node:
            names.update(node.input)
            for a in node.attribute:
                for sub in [a.g] if a.HasField("g") else list(a.graphs):
                    names |= read(sub)
        return names

    unused = [i.name for i in graph.initializer if i.name not in read(graph)]
    for node in graph.node:
        for a in node.attribute:
            for sub in [a.g] if a.HasField("g") else list(a.graphs):
                unused += _unused_initializers(sub)
    return unused


def test_loop_gradients_carry_no_unused_constants(trained):
    """keras 3's GRU is a Loop and the bidirectional LSTM's steps a Scan: their backward bodies kept the
    constants of forward nodes the gradient does not need, which onnxruntime warns about (one line each) at
    every session it opens."""
    run, _ = trained("bilstm_keras17")
    training = onnx.load(run.paths["training"])
    assert any(n.op_type in ("Loop", "Scan") for n in training.graph.node)
    assert _unused_initializers(training.graph) == []


def test_keras_preprocessing_constants_are_not_trained(tmp_path):
    """Rescaling(1/255, offset=-0.5) and an adapted Normalization before a conv (keras.applications' EfficientNets
    have both): grappler folds the offset and the mean into one Add and the variance into a reciprocal, under the
    layers' name scopes. Keras never trains them; requires_grad=None used to."""
    path = TF2ONNX / "prep_keras17.onnx"
    ref = dict(np.load(TF2ONNX / "prep_keras17.npz"))
    run = Trained(str(path), tmp_path, LossType.CrossEntropyLoss, blocks.AdamW())
    assert sorted(run.trainable) == sorted(k.removeprefix("grad:") for k in ref if k.startswith("grad:"))
    loss, grads = run.gradients(ref["x"], ref["y"])
    assert abs(loss - float(ref["loss"])) <= 1e-5 * float(ref["loss"])
    for name, g in grads.items():
        np.testing.assert_allclose(g, ref[f"grad:{name}"], rtol=1e-4, atol=1e-6)
    (offset,) = [i.name for i in onnx.load(path).graph.initializer if i.name.endswith("/rescaling_1/add:0")]
    named = Trained(str(path), tmp_path / "named", LossType.CrossEntropyLoss, blocks.AdamW(),
                    requires_grad=[offset])   # still trainable when named
    assert named.trainable == [offset]
