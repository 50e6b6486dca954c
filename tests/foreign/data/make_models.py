"""Make the Keras models of tests/foreign once, with tf2onnx (they are committed; tests never run this).

Run it in the TensorFlow environment (the test environment has no TensorFlow):

    python3 -m venv /work/tfvenv && /work/tfvenv/bin/pip install tensorflow-cpu==2.21.0 tf2onnx==1.17.0
    /work/tfvenv/bin/python tests/foreign/data/make_models.py

Each Keras model (random weights, seeded) is converted with ``tf2onnx.convert.from_keras`` at opsets 13 and 17,
as an Android / TensorFlow user converts theirs: NHWC inputs, a dynamic batch axis that tf2onnx names
``unk__<n>``, output names like ``dense_1`` or ``Identity:0``. Beside each ``<name>_op<opset>.onnx`` an
``<name>_op<opset>.npz`` holds what TensorFlow computes on one batch, in inference mode (the mode tf2onnx
exports): ``x`` (input), ``y`` (labels), ``output`` (Keras's output), ``loss`` (the loss of the test, on
``output``) and ``grad:<initializer>`` (``tf.GradientTape`` gradient of that loss for each ONNX initializer
that holds a Keras variable's values as they are, possibly transposed or reshaped; initializers tf2onnx
computed from several variables, as BatchNorm folded into a convolution, have none and are checked by finite
differences only).
"""

from __future__ import annotations

import itertools
import os
import sys
import warnings

import numpy as np
import onnx
import tensorflow as tf
import tf2onnx
from onnx import numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
keras = tf.keras
layers = keras.layers
OPSETS = (13, 17)


def _randomize(model: keras.Model, seed: int) -> None:
    """Non-trivial values everywhere, BatchNorm statistics included (fresh ones are zeros and ones)."""
    rng = np.random.default_rng(seed)
    for v in model.weights:
        shape = tuple(v.shape)
        if "moving_variance" in v.path or "gamma" in v.path:
            v.assign((0.5 + rng.random(shape)).astype(np.float32))
        elif "moving_mean" in v.path or "beta" in v.path or "bias" in v.path:
            v.assign((0.1 * rng.standard_normal(shape)).astype(np.float32))
        else:
            fan_in = max(1, int(np.prod(shape[:-1])))
            v.assign((rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32))


def mobilenet() -> keras.Model:
    """A MobileNetV2-style block: strided SAME conv, BatchNorm, ReLU6, depthwise conv, inverted residual,
    global average pooling, dropout, dense logits."""
    inp = keras.Input((12, 12, 3), name="image")
    x = layers.Conv2D(8, 3, strides=2, padding="same", use_bias=False)(inp)
    x = layers.ReLU(6.0)(layers.BatchNormalization()(x))
    y = layers.Conv2D(16, 1, use_bias=False)(x)
    y = layers.ReLU(6.0)(layers.BatchNormalization()(y))
    y = layers.DepthwiseConv2D(3, padding="same", use_bias=False)(y)
    y = layers.ReLU(6.0)(layers.BatchNormalization()(y))
    y = layers.BatchNormalization()(layers.Conv2D(8, 1, use_bias=False)(y))
    x = layers.Add()([x, y])
    x = layers.GlobalAveragePooling2D()(x)
    x = layers.Dropout(0.2)(x)
    return keras.Model(inp, layers.Dense(5, name="logits")(x))


def efficientnet() -> keras.Model:
    """An EfficientNet-style block on images of any size: swish, squeeze-and-excite (global pooling kept 4-D,
    two 1x1 convs, sigmoid gate), a strided depthwise conv with SAME padding on a run-time size, and a softmax
    head as keras.applications has by default."""
    inp = keras.Input((None, None, 3), name="image")
    x = layers.Conv2D(8, 3, padding="same")(inp)
    x = layers.Activation("swish")(layers.BatchNormalization()(x))
    y = layers.DepthwiseConv2D(3, strides=2, padding="same")(x)
    y = layers.Activation("swish")(layers.BatchNormalization()(y))
    s = layers.GlobalAveragePooling2D(keepdims=True)(y)
    s = layers.Conv2D(4, 1, activation="swish")(s)
    s = layers.Conv2D(8, 1, activation="sigmoid")(s)
    y = layers.Multiply()([y, s])
    y = layers.GlobalAveragePooling2D()(y)
    return keras.Model(inp, layers.Dense(4, activation="softmax", name="probs")(y))


def recurrent(cell) -> keras.Model:
    """A text classifier: embedding, one recurrent layer (last state), dense logits."""
    inp = keras.Input((7,), dtype="int32", name="tokens")
    x = layers.Embedding(20, 6)(inp)
    x = cell(8)(x)
    return keras.Model(inp, layers.Dense(3, name="logits")(x))


def transformer() -> keras.Model:
    """A post-LN transformer block on float sequences: MultiHeadAttention, LayerNormalization, a GELU
    feed-forward (tanh approximation), mean over the sequence, a regression head (MSE)."""
    inp = keras.Input((6, 8), name="sequence")
    a = layers.MultiHeadAttention(num_heads=2, key_dim=4)(inp, inp)
    x = layers.LayerNormalization(epsilon=1e-5)(inp + a)
    # Keras's exact GELU is written with Erfc, which tf2onnx 1.17 cannot convert: the tanh approximation
    f = layers.Dense(8)(layers.Dense(16, activation=lambda t: keras.activations.gelu(t, approximate=True))(x))
    x = layers.LayerNormalization(epsilon=1e-5)(x + f)
    x = layers.GlobalAveragePooling1D()(x)
    return keras.Model(inp, layers.Dense(2, name="regression")(x))


def two_heads() -> keras.Model:
    """Two inputs and two outputs, as a functional Keras model has them: an NHWC image through a conv and
    global max pooling, a token sequence through Conv1D (tf2onnx: Unsqueeze, Conv, Squeeze) and global max
    pooling over time; a classification head (logits) and a regression head."""
    image = keras.Input((8, 8, 1), name="image")
    tokens = keras.Input((10, 4), name="series")
    a = layers.GlobalMaxPooling2D()(layers.Conv2D(4, 3, activation="tanh")(image))
    b = layers.GlobalMaxPooling1D()(layers.Conv1D(4, 3, padding="causal", activation="relu")(tokens))
    h = layers.Dense(8, activation="elu")(layers.Concatenate()([a, b]))
    return keras.Model([image, tokens], [layers.Dense(3, name="label")(h), layers.Dense(1, name="score")(h)])


# name: (builder, input maker, loss kind, number of classes or outputs)
MODELS = {
    "keras_mobilenet": (mobilenet, lambda r: r.standard_normal((4, 12, 12, 3)), "ce", 5),
    "keras_efficientnet": (efficientnet, lambda r: r.standard_normal((3, 10, 10, 3)), "nll", 4),
    "keras_lstm": (lambda: recurrent(layers.LSTM), lambda r: r.integers(0, 20, (4, 7)), "ce", 3),
    "keras_gru": (lambda: recurrent(layers.GRU), lambda r: r.integers(0, 20, (4, 7)), "ce", 3),
    "keras_transformer": (transformer, lambda r: r.standard_normal((3, 6, 8)), "mse", 2),
    "keras_two_heads": (two_heads, lambda r: [r.standard_normal((4, 8, 8, 1)), r.standard_normal((4, 10, 4))],
                        "ce+mse", 3),
}


def _loss(kind: str, out, y):
    if kind == "ce+mse":  # CrossEntropyLoss on the first output plus MSELoss on the second (target: the labels)
        return _loss("ce", out[0], y) + _loss("mse", out[1], tf.cast(y[:, None], tf.float32))
    if kind == "ce":  # CrossEntropyLoss on logits
        return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, out, from_logits=True))
    if kind == "nll":  # probabilities: the loss of Keras's from_logits=False, -log p[y]
        return -tf.reduce_mean(tf.math.log(tf.gather(out, y, axis=1, batch_dims=1)))
    return tf.reduce_mean(tf.square(out - y))


def _match(value: np.ndarray, variables) -> tuple[int, tuple] | None:
    """(variable index, permutation) of the Keras variable that ``value`` holds, transposed and reshaped."""
    for i, v in enumerate(variables):
        if v.size != value.size:
            continue
        for perm in itertools.permutations(range(v.ndim)):
            if np.array_equal(np.transpose(v, perm).reshape(value.shape), value):
                return i, perm
    return None


def make(name: str) -> None:
    build, make_input, kind, n = MODELS[name]
    keras.utils.set_random_seed(0)
    model = build()
    _randomize(model, seed=len(name))
    rng = np.random.default_rng(1)
    made = make_input(rng)
    cast = lambda a: a.astype(np.int32 if a.dtype.kind == "i" else np.float32)  # noqa: E731
    xs = [cast(a) for a in made] if isinstance(made, list) else None
    x = xs if xs is not None else cast(made)
    batch = len(x if xs is None else xs[0])
    y = rng.integers(0, n, batch).astype(np.int64) if kind != "mse" else rng.standard_normal((batch, n)).astype(
        np.float32)
    variables = model.trainable_variables
    with tf.GradientTape() as tape:
        out = model(x, training=False)
        loss = _loss(kind, out, y)
    grads = [g.numpy() if not isinstance(g, tf.IndexedSlices) else tf.convert_to_tensor(g).numpy()
             for g in tape.gradient(loss, variables)]
    values = [v.numpy() for v in variables]
    for opset in OPSETS:
        spec = tuple(tf.TensorSpec((None, *i.shape[1:]), i.dtype, name=i.name) for i in model.inputs)
        proto, _ = tf2onnx.convert.from_keras(model, input_signature=spec, opset=opset)
        if xs is None:
            data = {"x": x, "y": y, "output": out.numpy(), "loss": np.float64(loss.numpy())}
        else:  # x0, x1, ... and output0, output1, ...
            data = {"y": y, "loss": np.float64(loss.numpy())}
            data.update({f"x{k}": a for k, a in enumerate(xs)})
            data.update({f"output{k}": o.numpy() for k, o in enumerate(out)})
        for init in proto.graph.initializer:
            value = numpy_helper.to_array(init)
            if value.dtype != np.float32 or value.size < 2:
                continue
            hit = _match(value, values)
            if hit is not None:
                i, perm = hit
                data[f"grad:{init.name}"] = np.transpose(grads[i], perm).reshape(value.shape)
        base = os.path.join(HERE, f"{name}_op{opset}")
        onnx.save(proto, base + ".onnx")
        np.savez_compressed(base + ".npz", **data)
        print(f"{name} opset {opset}: {len(proto.graph.node)} nodes, "
              f"{sum(k.startswith('grad:') for k in data)}/{len(proto.graph.initializer)} initializers with a "
              f"TF gradient, {os.path.getsize(base + '.onnx')} bytes")


if __name__ == "__main__":
    warnings.simplefilter("ignore")
    for model_name in sys.argv[1:] or MODELS:
        make(model_name)
