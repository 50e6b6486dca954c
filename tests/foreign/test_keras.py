"""Keras models converted by tf2onnx (tests/foreign/data/make_models.py): MobileNetV2- and EfficientNet-style
CNNs (BatchNorm folded by the converter, depthwise convs, ReLU6 as Clip, swish, squeeze-and-excite, a softmax
head, NHWC inputs, an image size fixed at run time), LSTM and GRU text classifiers (an ONNX LSTM, and a Loop
for keras 3's GRU), a transformer block (MultiHeadAttention as einsum, LayerNormalization as GlobalAveragePool
arithmetic); opsets 13 and 17, dynamic batch axes named ``unk__<n>``.

For each: the loss and the gradients of onnxtrain's training graph against TensorFlow's (tf.GradientTape,
computed offline on the same weights) and against finite differences in float64; training steps through
onnxtrain.api at two batch sizes with one set of artifacts; the exported inference model against Keras.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from onnxtrain import blocks
from onnxtrain.artifacts import LossType
from tests.foreign.harness import DATA, Trained, finite_difference_errors

# name: (loss, logits value for a softmax head or None)
MODELS = {
    "keras_mobilenet": (LossType.CrossEntropyLoss, None),
    "keras_efficientnet": (LossType.CrossEntropyLoss, "softmax"),
    "keras_lstm": (LossType.CrossEntropyLoss, None),
    "keras_gru": (LossType.CrossEntropyLoss, None),
    "keras_transformer": (LossType.MSELoss, None),
}
CASES = [f"{name}_op{opset}" for name in MODELS for opset in (13, 17)]


def _softmax_input(model: onnx.ModelProto) -> str:
    (node,) = [n for n in model.graph.node if n.op_type == "Softmax"]
    return node.input[0]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    cache = {}

    def get(case: str) -> tuple[Trained, dict]:
        if case not in cache:
            loss, head = MODELS[case.rsplit("_op", 1)[0]]
            path = DATA / f"{case}.onnx"
            kwargs = {}
            if head == "softmax":  # Keras's from_logits=False loss is a cross-entropy of the softmax's logits
                kwargs["loss_input_names"] = [_softmax_input(onnx.load(path))]
            run = Trained(str(path), tmp_path_factory.mktemp(case), loss, blocks.SGD(), **kwargs)
            cache[case] = (run, dict(np.load(DATA / f"{case}.npz")))
        return cache[case]

    return get


@pytest.mark.parametrize("case", CASES)
def test_gradients_match_tensorflow(trained, case):
    run, ref = trained(case)
    loss, grads = run.gradients(ref["x"], ref["y"])
    assert abs(loss - float(ref["loss"])) <= 1e-5 * abs(float(ref["loss"])) + 1e-6, (loss, float(ref["loss"]))
    with_tf = [k.removeprefix("grad:") for k in ref if k.startswith("grad:")]
    assert with_tf, "make_models.py matched no initializer to a Keras variable"
    assert set(with_tf) <= set(run.trainable)
    scale = max(float(np.linalg.norm(g)) for g in grads.values())
    for name in with_tf:  # atol: the key bias's gradient is zero in exact arithmetic (softmax is shift-invariant)
        want = ref[f"grad:{name}"]
        assert np.linalg.norm(grads[name] - want) <= 2e-4 * np.linalg.norm(want) + 1e-6 * scale, name


@pytest.mark.parametrize("case", CASES)
def test_gradients_match_finite_differences(trained, case):
    run, ref = trained(case)
    errors = finite_difference_errors(run, [ref["x"], ref["y"]], per_parameter=2)
    assert len(errors) == len(run.trainable) > 0
    bad = {k: v for k, v in errors.items() if v > 1.0}
    assert not bad, bad


@pytest.mark.parametrize("case", CASES)
def test_trains_at_two_batch_sizes_and_exports(trained, case):
    run, ref = trained(case)
    x, y = ref["x"], ref["y"]
    first = run.train(4, x, y)
    assert first[-1] < first[0], first
    run.train(1, x[:2], y[:2])  # the same artifacts at another batch size (the unk__ axis)
    path = run.export()
    model = onnx.load(path)
    assert [i.name for i in model.graph.input] == [i.name for i in onnx.load(DATA / f"{case}.onnx").graph.input]
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(None, {model.graph.input[0].name: x})[0]
    assert got.shape == ref["output"].shape
    assert not np.allclose(got, ref["output"], atol=1e-4)  # trained: no longer Keras's output


@pytest.mark.parametrize("case", ["keras_mobilenet_op13", "keras_gru_op17", "keras_transformer_op13"])
def test_untrained_export_matches_keras(tmp_path, case):
    loss, _ = MODELS[case.rsplit("_op", 1)[0]]
    run = Trained(str(DATA / f"{case}.onnx"), tmp_path, loss)
    ref = np.load(DATA / f"{case}.npz")
    session = ort.InferenceSession(str(run.export()), providers=["CPUExecutionProvider"])
    got = session.run(None, {session.get_inputs()[0].name: ref["x"]})[0]
    np.testing.assert_allclose(got, ref["output"], rtol=1e-5, atol=1e-5)


def test_efficientnet_trains_on_other_image_sizes(tmp_path):
    """The image axes are dynamic (keras.Input((None, None, 3))): strided SAME depthwise conv on a run-time size."""
    run = Trained(str(DATA / "keras_efficientnet_op17.onnx"), tmp_path, LossType.CrossEntropyLoss,
                  loss_input_names=[_softmax_input(onnx.load(DATA / "keras_efficientnet_op17.onnx"))])
    rng = np.random.default_rng(3)
    for size in (7, 10, 13):
        x = rng.standard_normal((2, size, size, 3)).astype(np.float32)
        losses = run.train(2, x, np.array([0, 3]))
        assert np.isfinite(losses).all()


def test_cross_entropy_on_a_softmax_head_warns_and_names_the_logits(tmp_path):
    path = DATA / "keras_efficientnet_op13.onnx"
    logits = _softmax_input(onnx.load(path))
    with pytest.warns(UserWarning, match=rf"'probs', the output of a Softmax.*loss_input_names=\['{logits}'\]"):
        Trained(str(path), tmp_path, LossType.CrossEntropyLoss)


def test_head_only_fine_tuning_with_trainable_ops(tmp_path):
    """trainable_ops=2 (the last MatMul and Add: the Dense head) as an Android transfer-learning app does; the
    convolutions stay frozen, and the exported model equals Keras's except for the head."""
    path = DATA / "keras_mobilenet_op17.onnx"
    ref = np.load(DATA / "keras_mobilenet_op17.npz")
    run = Trained(str(path), tmp_path, LossType.CrossEntropyLoss, trainable_ops=2)
    source = {i.name: onnx.numpy_helper.to_array(i) for i in onnx.load(path).graph.initializer}
    head = {n.input[1] for n in onnx.load(path).graph.node[-2:]}
    assert set(run.trainable) == head & set(source)
    frozen = [n for n, p in run.state.parameters if not p.requires_grad]
    assert frozen and all(w.ndim == 4 for w in map(source.get, frozen) if w.ndim > 1)
    run.train(3, ref["x"], ref["y"])
    for name in frozen:
        np.testing.assert_array_equal(run.state.parameters[name].data, source[name])
    assert any(not np.array_equal(run.state.parameters[n].data, source[n]) for n in run.trainable)


class ClassAndScore(blocks.Block):
    """A custom loss over both heads: cross-entropy of the logits plus the squared error of the score."""

    def __init__(self):
        super().__init__()
        self.ce, self.mse = blocks.CrossEntropyLoss(), blocks.MSELoss()

    def build(self, logits, score):
        return blocks.Add()(self.ce(logits, "labels"), self.mse(score, "target"))


@pytest.mark.parametrize("opset", [13, 17])
def test_two_inputs_two_heads_with_a_custom_loss(tmp_path, opset):
    """Two inputs whose batch axes tf2onnx names apart (unk__81, unk__82), an image whose NHWC-to-NCHW transpose
    is a Reshape (one channel), Conv1D with causal padding, global max pooling, ELU, and two outputs read by one
    custom loss block."""
    case = f"keras_two_heads_op{opset}"
    ref = dict(np.load(DATA / f"{case}.npz"))
    run = Trained(str(DATA / f"{case}.onnx"), tmp_path, ClassAndScore())
    feeds = [ref["x0"], ref["x1"], ref["y"], ref["y"][:, None].astype(np.float32)]
    loss, grads = run.gradients(*feeds)
    assert abs(loss - float(ref["loss"])) <= 1e-5 * float(ref["loss"])
    with_tf = [k.removeprefix("grad:") for k in ref if k.startswith("grad:")]
    assert len(with_tf) >= 6
    for name in with_tf:
        want = ref[f"grad:{name}"]
        assert np.linalg.norm(grads[name] - want) <= 2e-4 * np.linalg.norm(want) + 1e-7, name
    errors = finite_difference_errors(run, feeds)
    assert len(errors) == len(run.trainable) and max(errors.values()) <= 1.0, errors

    session = ort.InferenceSession(str(run.export()), providers=["CPUExecutionProvider"])
    got = session.run(["label", "score"], {"image": ref["x0"], "series": ref["x1"]})
    for g, want in zip(got, [ref["output0"], ref["output1"]]):
        np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-5)
    run.optimizer.set_learning_rate(0.01)
    losses = run.train(4, *feeds)
    assert losses[-1] < losses[0], losses
    run.train(1, *(f[:2] for f in feeds))
