"""Make the .tflite / .circle test models once (they are committed; tests never run this).

A rerun writes equivalent models, not byte-identical ones (Keras numbers layer names per process and the
converter's output varies slightly between runs), so commit only the files you meant to change.

    python3 -m venv /work/tfvenv && /work/tfvenv/bin/pip install tensorflow-cpu==2.21.0 tflite==2.18.0 \
        circle-schema==0.10.1
    /work/tfvenv/bin/python tests/tflite/data/make_models.py

Random (seeded) Keras weights, converted with TensorFlow 2.21's TFLiteConverter (float32, no optimizations,
dynamic batch). Weights are rounded to multiples of 1/256 so the files compress well; ONERT's MNIST model
(784-128-10, 400 KB) is committed gzipped. The .circle files are the .tflite ones re-serialized with
circle-schema's object API under the "CIR0" file identifier, as ONE's tflite2circle does (circle's schema is
tflite's with fields appended, so the tables read the same); `SubGraph.dataFormat` stays CHANNELS_LAST.
"""

import gzip
import os

import numpy as np
import tensorflow as tf

HERE = os.path.dirname(os.path.abspath(__file__))
keras = tf.keras
layers = keras.layers


def digits_cnn() -> keras.Model:
    """Every op ONERT trains on NHWC images: conv, depthwise conv, pooling, pad, concat, add, mean, flatten."""
    inp = keras.Input((8, 8, 1), name="image")
    x = layers.Conv2D(8, 3, padding="same", activation="relu", name="conv1")(inp)
    a = layers.DepthwiseConv2D(3, padding="same", activation="relu6", name="dw")(x)
    b = layers.Conv2D(8, 1, name="pw")(x)
    y = layers.Add()([a, b])
    y = layers.Concatenate()([y, x])
    y = layers.MaxPooling2D(2)(y)
    y = layers.ZeroPadding2D(2)(y)  # not foldable into the VALID convolution: stays a PAD
    y = layers.Conv2D(16, 3, activation="relu", name="conv2")(y)
    y = layers.AveragePooling2D(2)(y)
    g = layers.GlobalAveragePooling2D()(y)
    f = layers.Flatten()(y)
    h = layers.Concatenate()([f, g])
    h = layers.Dense(32, activation="relu", name="fc1")(h)
    out = layers.Dense(10, name="logits")(h)
    return keras.Model(inp, out)


def mlp() -> keras.Model:
    """Dense layers, Mul / Sub, a batched matmul of two activations and a softmax output."""
    inp = keras.Input((64,), name="features")
    h1 = layers.Dense(32, activation="relu", name="fc1")(inp)
    h2 = layers.Dense(32, activation="tanh", name="fc2")(inp)
    h = layers.Subtract()([layers.Multiply()([h1, h2]), h1])
    r = layers.Reshape((4, 8))(h)
    q = layers.Lambda(lambda t: tf.matmul(t, t, transpose_b=True))(r)
    h = layers.Concatenate()([h, layers.Flatten()(q)])
    out = layers.Dense(10, activation="softmax", name="fc3")(h)
    return keras.Model(inp, out)


def op_zoo() -> keras.Model:
    """The other converters: strided SAME conv, LEAKY_RELU, LOGISTIC, SAME max pool, PADV2, REDUCE_MAX / SUM /
    MEAN with and without keep_dims on NCHW values, TRANSPOSE, DIV, MUL, RELU6 / RELU_N1_TO_1, softmax."""
    inp = keras.Input((9, 9, 3), name="image")
    x = layers.Conv2D(6, 3, strides=2, padding="same", name="c_s2")(inp)
    x = layers.LeakyReLU(0.2)(x)
    y = layers.ZeroPadding2D(2)(x)
    y = layers.Conv2D(6, 3, activation="sigmoid", name="c_2")(y)
    y = layers.MaxPooling2D(2, padding="same")(y)
    z = layers.Lambda(lambda t: tf.pad(t, [[0, 0], [1, 0], [0, 1], [0, 0]], constant_values=0.5))(y)
    z = layers.Lambda(lambda t: tf.reduce_max(t, axis=[1, 2], keepdims=True))(z)
    s = layers.Lambda(lambda t: tf.reduce_sum(t, axis=[3], keepdims=True))(y)
    m = layers.Lambda(lambda t: tf.reduce_mean(t, axis=[2]))(y)
    m = layers.Lambda(lambda t: tf.transpose(t, [0, 2, 1]))(m)
    d = layers.Lambda(lambda t: t[0] / (1.0 + t[1] * t[1]))([y, s])
    f = layers.Lambda(lambda t: tf.squeeze(t, axis=[1, 2]))(z)
    h = layers.Concatenate()([layers.Flatten()(d), f, layers.Flatten()(m)])
    h = layers.Dense(8, activation="relu6")(h)
    h = layers.Lambda(lambda t: tf.clip_by_value(t, -1.0, 1.0))(h)
    return keras.Model(inp, layers.Lambda(lambda t: tf.nn.softmax(t, axis=-1))(layers.Dense(5)(h)))


def onert_mnist() -> keras.Model:
    """ONE's docs/howto "Training a simple CNN model on MNIST using ONERT": Flatten(28x28), Dense(128, relu),
    Dense(10)."""
    return keras.Sequential([keras.Input((28, 28), name="image"), layers.Flatten(),
                             layers.Dense(128, activation="relu"), layers.Dense(10)])


def convert(model: keras.Model, float16: bool = False) -> bytes:
    rng = np.random.default_rng(0)
    model.set_weights([np.round(rng.normal(0, 0.3, w.shape) * 256) / 256 for w in model.get_weights()])
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    if float16:  # LiteRT's "float16 quantization": float16 weights, each read through a DEQUANTIZE
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.target_spec.supported_types = [tf.float16]
    return converter.convert()


def to_circle(data: bytes) -> bytes:
    import flatbuffers
    from circle_schema.v0_10.circle.Model import ModelT

    model = ModelT.InitFromPackedBuf(bytearray(data), 0)
    builder = flatbuffers.Builder(len(data) + 1024)
    builder.Finish(model.Pack(builder), file_identifier=b"CIR0")
    return bytes(builder.Output())


def main() -> None:
    for name, make in (("digits_cnn", digits_cnn), ("mlp", mlp), ("onert_mnist", onert_mnist)):
        data = convert(make())
        if name == "onert_mnist":
            with gzip.GzipFile(os.path.join(HERE, f"{name}.tflite.gz"), "wb", mtime=0) as f:
                f.write(data)
            continue
        with open(os.path.join(HERE, f"{name}.tflite"), "wb") as f:
            f.write(data)
        with open(os.path.join(HERE, f"{name}.circle"), "wb") as f:
            f.write(to_circle(data))
    with open(os.path.join(HERE, "digits_cnn_fp16.tflite"), "wb") as f:
        f.write(convert(digits_cnn(), float16=True))
    with open(os.path.join(HERE, "op_zoo.tflite"), "wb") as f:
        f.write(convert(op_zoo()))


if __name__ == "__main__":
    main()
