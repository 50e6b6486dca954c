"""Make the models of tests/foreign/test_tools.py: torch exports run through the tools users apply before training
(onnxsim, onnxslim, onnxoptimizer's fuse passes, onnxconverter_common's float16), a LightGBM model converted by
onnxmltools, Keras 3's own ONNX export (torch backend); with ``--jax`` in a venv with jax2onnx and flax,
flax.nnx models exported by jax2onnx; with ``--paddle`` in a venv with paddlepaddle and paddle2onnx, a Paddle
CNN. Reference losses and gradients of the source framework go into an .npz beside each model, keyed by the
ONNX initializer that holds the variable (``grad:<initializer>``).

Run offline from the repository root (none of these tools is a test dependency):

    .venv/bin/pip install onnxsim onnxslim onnxoptimizer onnxconverter-common onnxmltools lightgbm keras
    .venv/bin/python tests/foreign/data/make_tools.py
    python3 -m venv /tmp/jvenv && /tmp/jvenv/bin/pip install jax2onnx flax
    /tmp/jvenv/bin/python tests/foreign/data/make_tools.py --jax
    python3 -m venv /tmp/pvenv && /tmp/pvenv/bin/pip install paddlepaddle paddle2onnx packaging onnx
    /tmp/pvenv/bin/python tests/foreign/data/make_tools.py --paddle

Checked with torch 2.13, onnxsim 0.8.1, onnxslim 0.1.98, onnxoptimizer 0.4.2, onnxconverter-common 1.16,
onnxmltools 1.16 + lightgbm 4.7, keras 3.15.1, jax2onnx 0.17.1 + flax 0.12.8 (jax 0.10.2), paddlepaddle 3.3.1 +
paddle2onnx 2.1.0.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import onnx

OUT = Path(__file__).resolve().parent / "tools"
ROOT = Path(__file__).resolve().parents[3]


def _by_value(model: onnx.ModelProto, value: np.ndarray) -> str | None:
    """The initializer of ``model`` equal to ``value`` (the only one), if any."""
    hits = [t.name for t in model.graph.initializer
            if tuple(t.dims) == value.shape and np.array_equal(onnx.numpy_helper.to_array(t), value)]
    return hits[0] if len(hits) == 1 else None


def _save_reference(name: str, model: onnx.ModelProto, x, target, loss, params: dict, grads: dict) -> None:
    """``name``.npz: input, target, loss, and the source framework's gradient of every variable an initializer
    holds unchanged (``grad:<initializer>``)."""
    ref = {"x": x, "y": target, "loss": np.float32(loss)}
    for key, value in params.items():
        init = _by_value(model, value)
        if init is not None:
            ref[f"grad:{init}"] = grads[key]
    np.savez(OUT / f"{name}.npz", **ref)


def torch_models() -> None:
    import torch

    class CNN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = torch.nn.Conv2d(3, 4, 3, padding=1)
            self.bn = torch.nn.BatchNorm2d(4)
            self.c2 = torch.nn.Conv2d(4, 4, 3, stride=2, padding=1)
            self.fc = torch.nn.Linear(4, 5)

        def forward(self, x):
            y = torch.relu(self.bn(self.c1(x)))
            return self.fc(torch.relu(self.c2(y)).mean((2, 3)))

    class LSTMNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = torch.nn.LSTM(4, 6, batch_first=True)
            self.fc = torch.nn.Linear(6, 3)

        def forward(self, x):
            return self.fc(self.lstm(x)[0][:, -1])

    def bert():
        from transformers import BertConfig, BertModel

        cfg = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=32, max_position_embeddings=32, hidden_dropout_prob=0.0,
                         attention_probs_dropout_prob=0.0)
        inner = BertModel(cfg, add_pooling_layer=False)

        class Bert(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.bert = inner

            def forward(self, ids, mask):
                return self.bert(input_ids=ids, attention_mask=mask).last_hidden_state
        return Bert()

    def make(kind):
        torch.manual_seed(0)
        model = {"cnn": CNN, "lstm": LSTMNet, "bert": bert}[kind]()
        with torch.no_grad():   # no equal parameters (zero biases, unit norms) for a tool to store once
            for p in model.parameters():
                p.add_(0.1 * torch.randn_like(p))
            if kind == "cnn":
                model.bn.running_mean.uniform_(-0.2, 0.2)
                model.bn.running_var.uniform_(0.5, 1.5)
        return model

    args = {"cnn": (torch.randn(2, 3, 8, 8),), "lstm": (torch.randn(2, 5, 4),),
            "bert": (torch.randint(0, 50, (2, 6)), torch.ones(2, 6, dtype=torch.int64))}
    names = {"cnn": ["x"], "lstm": ["x"], "bert": ["ids", "mask"]}
    axes = {"cnn": {"x": {0: "batch", 2: "h", 3: "w"}}, "lstm": {"x": {0: "batch", 1: "seq"}},
            "bert": {"ids": {0: "batch", 1: "seq"}, "mask": {0: "batch", 1: "seq"}}}

    def export(kind: str, mode: str) -> onnx.ModelProto:
        """mode: 'eval' (TorchScript, eval mode, no constant folding: the BatchNorm is there for a tool to fold),
        'train' (TorchScript, training mode) or 'dynamo' (torch.onnx.export's default)."""
        model, path = make(kind), OUT / "_export.onnx"
        if mode == "dynamo":
            model.eval()
            shapes = {n: {k: torch.export.Dim.AUTO for k in v} for n, v in axes[kind].items()}
            torch.onnx.export(model, args[kind], path, input_names=names[kind], output_names=["out"],
                              dynamic_shapes=shapes, dynamo=True)
        else:
            model.train(mode == "train")
            torch.onnx.export(model, args[kind], path, input_names=names[kind], output_names=["out"],
                              dynamic_axes={**axes[kind], "out": {0: "batch"}}, dynamo=False, opset_version=17,
                              do_constant_folding=False, training=torch.onnx.TrainingMode.TRAINING
                              if mode == "train" else torch.onnx.TrainingMode.EVAL)
        exported = onnx.load(path)
        for written in OUT.glob("_export.onnx*"):   # the dynamo exporter may write the weights beside it
            written.unlink()
        return exported

    import onnxoptimizer
    import onnxsim
    import onnxslim
    from onnxconverter_common import float16

    def sim(m):
        out, ok = onnxsim.simplify(m)
        assert ok
        return out

    fuse = ["fuse_bn_into_conv", "fuse_matmul_add_bias_into_gemm", "fuse_add_bias_into_conv",
            "fuse_transpose_into_gemm", "eliminate_identity", "extract_constant_to_initializer",
            "eliminate_unused_initializer"]
    cnn_eval, cnn_dynamo = export("cnn", "eval"), export("cnn", "dynamo")
    onnx.save(cnn_eval, OUT / "cnn_eval.onnx")
    onnx.save(cnn_dynamo, OUT / "cnn_dynamo.onnx")
    onnx.save(sim(cnn_eval), OUT / "cnn_eval_onnxsim.onnx")
    onnx.save(onnxslim.slim(cnn_eval), OUT / "cnn_eval_onnxslim.onnx")
    onnx.save(onnxoptimizer.optimize(cnn_eval, fuse), OUT / "cnn_eval_onnxoptimizer.onnx")
    onnx.save(sim(cnn_dynamo), OUT / "cnn_dynamo_onnxsim.onnx")
    onnx.save(onnxslim.slim(export("lstm", "dynamo")), OUT / "lstm_dynamo_onnxslim.onnx")
    onnx.save(onnxslim.slim(export("bert", "train")), OUT / "bert_train_onnxslim.onnx")
    onnx.save(float16.convert_float_to_float16(cnn_eval, keep_io_types=True), OUT / "cnn_eval_float16.onnx")


def lightgbm_models() -> None:
    import lightgbm
    import onnxmltools
    from onnxmltools.convert.common.data_types import FloatTensorType

    rng = np.random.default_rng(0)
    x = rng.standard_normal((60, 4)).astype(np.float32)
    for name, est, y in [("lightgbm_classifier", lightgbm.LGBMClassifier, (x[:, 0] > 0).astype(int)),
                         ("lightgbm_regressor", lightgbm.LGBMRegressor, 2 * x[:, 0])]:
        model = est(n_estimators=3, num_leaves=4, verbose=-1).fit(x, y)
        onnx.save(onnxmltools.convert_lightgbm(model, initial_types=[("x", FloatTensorType([None, 4]))],
                                               target_opset=15), OUT / f"{name}.onnx")


def keras_model() -> None:
    """Keras 3's ``model.export(format="onnx")`` with the torch backend (torch.onnx's TorchScript exporter)."""
    os.environ["KERAS_BACKEND"] = "torch"
    import keras
    import torch

    keras.utils.set_random_seed(0)
    inp = keras.Input((8, 8, 3))
    y = keras.layers.ReLU()(keras.layers.BatchNormalization()(keras.layers.Conv2D(4, 3, padding="same")(inp)))
    model = keras.Model(inp, keras.layers.Dense(5)(keras.layers.GlobalAveragePooling2D()(y)))
    for v in model.trainable_variables:   # no equal variables (zero biases)
        v.assign(v.numpy() + 0.1 * np.random.default_rng(len(v.path)).standard_normal(v.shape).astype(np.float32))
    model(np.zeros((2, 8, 8, 3), np.float32))
    model.export(str(OUT / "keras_cnn.onnx"), format="onnx", verbose=False)
    x = np.random.default_rng(0).standard_normal((3, 8, 8, 3)).astype(np.float32)
    target = np.random.default_rng(1).standard_normal((3, 5)).astype(np.float32)
    for v in model.trainable_variables:
        v.value.requires_grad_(True)
    loss = ((model(torch.tensor(x), training=False) - torch.tensor(target)) ** 2).mean()
    loss.backward()
    params = {v.path: v.numpy() for v in model.trainable_variables}
    params.update({v.path + "/oihw": v.numpy().transpose(3, 2, 0, 1) for v in model.trainable_variables if v.ndim == 4})
    grads = {v.path: v.value.grad.numpy() for v in model.trainable_variables}
    grads.update({v.path + "/oihw": v.value.grad.numpy().transpose(3, 2, 0, 1)
                  for v in model.trainable_variables if v.ndim == 4})
    _save_reference("keras_cnn", onnx.load(OUT / "keras_cnn.onnx"), x, target, float(loss), params, grads)


def jax_models() -> None:
    """flax.nnx models exported by jax2onnx; gradients by jax.grad of the mean squared error."""
    import jax
    import jax.numpy as jnp
    from flax import nnx
    from jax2onnx import to_onnx

    class MLP(nnx.Module):
        def __init__(self, rngs):
            self.l1, self.l2 = nnx.Linear(4, 8, rngs=rngs), nnx.Linear(8, 3, rngs=rngs)

        def __call__(self, x):
            return self.l2(nnx.gelu(self.l1(x)))

    class CNN(nnx.Module):
        def __init__(self, rngs):
            self.c1 = nnx.Conv(3, 4, (3, 3), rngs=rngs)
            self.bn = nnx.BatchNorm(4, rngs=rngs, use_running_average=True)
            self.l = nnx.Linear(4, 5, rngs=rngs)

        def __call__(self, x):
            return self.l(nnx.relu(self.bn(self.c1(x))).mean(axis=(1, 2)))

    for name, cls, shape in [("jax_mlp", MLP, ("B", 4)), ("jax_cnn", CNN, ("B", 6, 6, 3))]:
        model = cls(nnx.Rngs(0))
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)
        leaves, tree = jax.tree.flatten(params)   # different noise per leaf: no two biases equal
        noise = np.random.default_rng(1)
        params = jax.tree.unflatten(tree, [a + 0.1 * noise.standard_normal(a.shape).astype(np.float32) for a in leaves])
        model = nnx.merge(graphdef, params, rest)
        proto = to_onnx(model, [shape], return_mode="proto")
        onnx.save(proto, OUT / f"{name}.onnx")
        x = np.random.default_rng(0).standard_normal((3, *shape[1:])).astype(np.float32)
        target = np.random.default_rng(1).standard_normal(np.asarray(model(jnp.asarray(x))).shape).astype(np.float32)

        def loss(p, graphdef=graphdef, rest=rest, x=x, target=target):
            return jnp.mean((nnx.merge(graphdef, p, rest)(jnp.asarray(x)) - target) ** 2)

        value, grads = jax.value_and_grad(loss)(params)
        flat = lambda s: {"/".join(map(str, k)): np.asarray(v.get_value()) for k, v in nnx.to_flat_state(s)}  # noqa: E731
        p, g = flat(params), flat(grads)
        p.update({k + "/oihw": v.transpose(3, 2, 0, 1) for k, v in list(p.items()) if v.ndim == 4})
        g.update({k + "/oihw": v.transpose(3, 2, 0, 1) for k, v in list(g.items()) if v.ndim == 4})
        _save_reference(name, proto, x, target, float(value), p, g)


def paddle_model() -> None:
    """A Paddle CNN (Conv2D, BatchNorm2D in inference mode, Linear) exported by paddle.onnx.export
    (paddle2onnx); gradients by Paddle's autograd of the mean squared error."""
    import paddle

    paddle.seed(0)

    class Net(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.c, self.bn = paddle.nn.Conv2D(3, 4, 3, padding=1), paddle.nn.BatchNorm2D(4)
            self.fc = paddle.nn.Linear(4, 5)

        def forward(self, x):
            return self.fc(paddle.nn.functional.relu(self.bn(self.c(x))).mean(axis=[2, 3]))

    net = Net()
    noise = np.random.default_rng(1)
    for _, p in net.named_parameters():   # no two equal tensors (zero biases, unit scales)
        p.set_value(p.numpy() + 0.1 * noise.standard_normal(p.shape).astype(np.float32))
    net.eval()
    spec = [paddle.static.InputSpec([None, 3, None, None], "float32", "x")]
    paddle.onnx.export(net, str(OUT / "paddle_cnn"), input_spec=spec, opset_version=17)
    x = np.random.default_rng(0).standard_normal((3, 3, 8, 8)).astype(np.float32)
    target = np.random.default_rng(2).standard_normal((3, 5)).astype(np.float32)
    loss = ((net(paddle.to_tensor(x)) - paddle.to_tensor(target)) ** 2).mean()
    loss.backward()
    trained = [(n, p) for n, p in net.named_parameters() if p.grad is not None]
    params = {n: p.numpy() for n, p in trained}
    grads = {n: p.grad.numpy() for n, p in trained}
    params["c.bias/reshaped"] = params["c.bias"].reshape(1, -1, 1, 1)   # paddle2onnx's p2o.pd_op.reshape.0.0
    grads["c.bias/reshaped"] = grads["c.bias"].reshape(1, -1, 1, 1)
    _save_reference("paddle_cnn", onnx.load(OUT / "paddle_cnn.onnx"), x, target, float(loss), params, grads)


if __name__ == "__main__":
    OUT.mkdir(exist_ok=True)
    if "--paddle" in sys.argv:
        paddle_model()
    elif "--jax" in sys.argv:
        jax_models()
    else:
        sys.path.insert(0, str(ROOT))
        from tests.zoo.vision import import_torchvision

        import_torchvision()
        torch_models()
        lightgbm_models()
        keras_model()
