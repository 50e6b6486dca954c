"""Make the models of tests/foreign/test_tf2onnx.py once (they are committed; tests never run this).

Run it in a TensorFlow environment (the test environment has no TensorFlow):

    python3 -m venv /tmp/tfvenv && /tmp/tfvenv/bin/pip install tensorflow-cpu==2.21.0 tf2onnx==1.17.0
    /tmp/tfvenv/bin/python tests/foreign/data/tf2onnx/make_models.py

Each Keras 3 model (random weights, seeded) is converted the way named after it: ``keras13`` / ``keras17`` by
``tf2onnx.convert.from_keras`` at that opset, ``nchw`` the same at opset 17 with ``inputs_as_nchw``, ``saved`` by
``python -m tf2onnx.convert --saved-model`` (opset 17) on ``model.export(dir)``, ``export`` by Keras 3's own
``model.export(path, format="onnx")``. Beside each ``.onnx`` an ``.npz`` holds what TensorFlow computes on one batch
in inference mode: ``x``, ``y``, ``output``, ``loss`` and ``grad:<initializer>`` (``tf.GradientTape``) for each
initializer that holds a Keras variable's values (possibly transposed or reshaped; matched by value).
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import tempfile
import warnings

import numpy as np
import onnx
import tensorflow as tf
import tf2onnx
from onnx import numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
keras = tf.keras
layers = keras.layers


def _randomize(model: keras.Model, seed: int) -> None:
    """Non-trivial values everywhere, BatchNorm statistics included (fresh ones are zeros and ones)."""
    rng = np.random.default_rng(seed)
    for v in model.weights:
        shape = tuple(v.shape)
        if "moving_variance" in v.path or "gamma" in v.path:
            v.assign((0.5 + rng.random(shape)).astype(np.float32))
        elif "moving_mean" in v.path or "beta" in v.path or "bias" in v.path:
            v.assign((0.1 * rng.standard_normal(shape)).astype(np.float32))
        elif "normalization" not in v.path or "_normalization" in v.path:   # keep Normalization's statistics
            fan_in = max(1, int(np.prod(shape[:-1])))
            v.assign((rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32))


def mlp() -> keras.Model:
    """Dense, BatchNormalization after a Dense (a Mul and an Add), Dropout."""
    inp = keras.Input((10,), name="features")
    x = layers.BatchNormalization()(layers.Dense(16, activation="relu")(inp))
    x = layers.Dense(8, activation="tanh")(layers.Dropout(0.3)(x))
    return keras.Model(inp, layers.Dense(3, name="logits")(x))


def cnn() -> keras.Model:
    """Any image size: conv, BatchNorm, MaxPooling (odd sizes drop a row), depthwise conv with depth_multiplier=2,
    SAME max pooling with stride 1, global average pooling, dropout."""
    inp = keras.Input((None, None, 3), name="image")
    x = layers.ReLU()(layers.BatchNormalization()(layers.Conv2D(6, 3, padding="same")(inp)))
    x = layers.DepthwiseConv2D(3, padding="valid", depth_multiplier=2)(layers.MaxPooling2D(2)(x))
    x = layers.Conv2D(8, 1, activation="relu")(layers.MaxPooling2D(2, strides=1, padding="same")(x))
    x = layers.Dropout(0.5)(layers.GlobalAveragePooling2D()(x))
    return keras.Model(inp, layers.Dense(4, name="logits")(x))


def cnn_flat() -> keras.Model:
    """Strided conv, average pooling, Flatten, BatchNormalization on the flat features."""
    inp = keras.Input((8, 8, 2), name="image")
    x = layers.Conv2D(4, 3, strides=2, padding="same", activation="relu")(inp)
    x = layers.BatchNormalization()(layers.Flatten()(layers.AveragePooling2D(2)(x)))
    return keras.Model(inp, layers.Dense(3, name="logits")(x))


def bilstm() -> keras.Model:
    """Any sequence length: Embedding, a bidirectional LSTM feeding a GRU(reset_after=False)."""
    inp = keras.Input((None,), dtype="int32", name="tokens")
    x = layers.Bidirectional(layers.LSTM(5, return_sequences=True))(layers.Embedding(30, 6)(inp))
    return keras.Model(inp, layers.Dense(3, name="logits")(layers.GRU(4, reset_after=False)(x)))


def attn() -> keras.Model:
    """Any sequence length: causal MultiHeadAttention, LayerNormalization, mean over time, a regression head."""
    inp = keras.Input((None, 8), name="sequence")
    a = layers.MultiHeadAttention(num_heads=2, key_dim=4)(inp, inp, use_causal_mask=True)
    x = layers.GlobalAveragePooling1D()(layers.LayerNormalization()(inp + a))
    return keras.Model(inp, layers.Dense(2, name="regression")(x))


def prep() -> keras.Model:
    """Rescaling and an adapted Normalization (constants in Keras) before a conv."""
    inp = keras.Input((None, None, 3), name="image")
    x = layers.Rescaling(1 / 255.0, offset=-0.5)(inp)
    x = layers.Normalization(axis=-1, mean=[0.1, -0.2, 0.05], variance=[0.5, 2.0, 1.5])(x)
    x = layers.GlobalAveragePooling2D()(layers.Conv2D(4, 3, padding="same", activation="relu")(x))
    return keras.Model(inp, layers.Dense(3, name="logits")(x))


# name: (builder, input maker, loss ("ce" on logits or "mse"), classes or outputs, conversions)
MODELS = {
    "mlp": (mlp, lambda r: r.standard_normal((5, 10)), "ce", 3, ["saved"]),
    "cnn": (cnn, lambda r: r.standard_normal((3, 11, 11, 3)), "ce", 4, ["keras13", "nchw"]),
    "cnn_flat": (cnn_flat, lambda r: r.standard_normal((4, 8, 8, 2)), "ce", 3, ["export"]),
    "bilstm": (bilstm, lambda r: r.integers(0, 30, (4, 6)), "ce", 3, ["keras17"]),
    "attn": (attn, lambda r: r.standard_normal((3, 5, 8)), "mse", 2, ["keras13"]),
    "prep": (prep, lambda r: 255 * r.random((3, 6, 6, 3)), "ce", 3, ["keras17"]),
}


def _loss(kind: str, out, y):
    if kind == "ce":
        return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, out, from_logits=True))
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


def _convert(model: keras.Model, how: str, path: str) -> None:
    spec = tuple(tf.TensorSpec((None, *i.shape[1:]), i.dtype, name=i.name) for i in model.inputs)
    if how.startswith("keras"):
        onnx.save(tf2onnx.convert.from_keras(model, input_signature=spec, opset=int(how[-2:]))[0], path)
    elif how == "nchw":
        proto, _ = tf2onnx.convert.from_keras(model, input_signature=spec, opset=17,
                                              inputs_as_nchw=[model.inputs[0].name])
        onnx.save(proto, path)
    elif how == "saved":
        folder = tempfile.mkdtemp()
        model.export(folder)
        subprocess.run([sys.executable, "-m", "tf2onnx.convert", "--saved-model", folder, "--opset", "17",
                        "--output", path], check=True, capture_output=True)
    else:
        model.export(path, format="onnx")


def make(name: str) -> None:
    build, make_input, kind, n, conversions = MODELS[name]
    keras.utils.set_random_seed(0)
    model = build()
    _randomize(model, seed=len(name))
    rng = np.random.default_rng(1)
    x = make_input(rng)
    x = x.astype(np.int32 if x.dtype.kind == "i" else np.float32)
    y = (rng.integers(0, n, len(x)).astype(np.int64) if kind == "ce"
         else rng.standard_normal((len(x), n)).astype(np.float32))
    variables = model.trainable_variables
    with tf.GradientTape() as tape:
        out = model(x, training=False)
        loss = _loss(kind, out, y)
    grads = [tf.convert_to_tensor(g).numpy() for g in tape.gradient(loss, variables)]
    values = [v.numpy() for v in variables]
    for how in conversions:
        base = os.path.join(HERE, f"{name}_{how}")
        _convert(model, how, base + ".onnx")
        proto = onnx.load(base + ".onnx")
        data = {"x": np.transpose(x, (0, 3, 1, 2)) if how == "nchw" else x, "y": y, "output": out.numpy(),
                "loss": np.float64(loss.numpy())}
        for init in proto.graph.initializer:
            value = numpy_helper.to_array(init)
            if value.dtype == np.float32 and value.size >= 2 and (hit := _match(value, values)) is not None:
                i, perm = hit
                data[f"grad:{init.name}"] = np.transpose(grads[i], perm).reshape(value.shape)
        np.savez_compressed(base + ".npz", **data)
        print(f"{name}_{how}: {len(proto.graph.node)} nodes, {sum(k.startswith('grad:') for k in data)}/"
              f"{len(proto.graph.initializer)} initializers with a TF gradient, {os.path.getsize(base + '.onnx')} B")


if __name__ == "__main__":
    warnings.simplefilter("ignore")
    for model_name in sys.argv[1:] or MODELS:
        make(model_name)
