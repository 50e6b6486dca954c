"""A Keras MNIST classifier converted with tf2onnx, made trainable with onnxblock: a ``TrainingBlock`` that returns
the loss and the logits, every initializer whose name holds "const" frozen and the others trained, an
``onnxblock.optim.AdamW`` optimizer model, then the usual training and test loops.

Source: a public GitHub script found through the code index (stored file id 14128240748: ``class
MNISTTrainingBlock(onnxblock.TrainingBlock)``, ``create_training_model``, ``train``, ``test``).
Adapted: the imports; tensorflow/tf2onnx are not installed, so the converted model is written with onnx.helper as
tf2onnx names it (opset 15, ``sequential/dense/MatMul/ReadVariableOp:0`` weights, a ``const_fold_opt__`` int64
reshape shape, a symbolic batch ``unk__6``); random weights; sklearn's digits (zero-padded to 28x28) instead of
tensorflow_datasets' MNIST; 3 batches of 64; ``evaluate.load('accuracy')`` is a numpy mean; the loops return their
losses.
"""

import logging

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import onnxtrain.onnxblock as onnxblock  # was: import onnxruntime.training.onnxblock as onnxblock
from onnxtrain.api import CheckpointState, Module, Optimizer  # was: from onnxruntime.training.api import ...
from tests.api_compat._data import digits


def _tf2onnx_mnist(rng) -> onnx.ModelProto:
    dense, dense_1 = "sequential/dense", "sequential/dense_1"
    inits = [numpy_helper.from_array(np.array([-1, 784], np.int64), "const_fold_opt__7"),
             numpy_helper.from_array((rng.standard_normal((784, 32)) * 0.05).astype(np.float32),
                                     f"{dense}/MatMul/ReadVariableOp:0"),
             numpy_helper.from_array(np.zeros(32, np.float32), f"{dense}/BiasAdd/ReadVariableOp:0"),
             numpy_helper.from_array((rng.standard_normal((32, 10)) * 0.1).astype(np.float32),
                                     f"{dense_1}/MatMul/ReadVariableOp:0"),
             numpy_helper.from_array(np.zeros(10, np.float32), f"{dense_1}/BiasAdd/ReadVariableOp:0")]
    nodes = [helper.make_node("Reshape", ["input_1", "const_fold_opt__7"], [f"{dense}/flatten"]),
             helper.make_node("MatMul", [f"{dense}/flatten", f"{dense}/MatMul/ReadVariableOp:0"], [f"{dense}/MatMul"]),
             helper.make_node("Add", [f"{dense}/MatMul", f"{dense}/BiasAdd/ReadVariableOp:0"], [f"{dense}/BiasAdd"]),
             helper.make_node("Relu", [f"{dense}/BiasAdd"], [f"{dense}/Relu"]),
             helper.make_node("MatMul", [f"{dense}/Relu", f"{dense_1}/MatMul/ReadVariableOp:0"],
                              [f"{dense_1}/MatMul"]),
             helper.make_node("Add", [f"{dense_1}/MatMul", f"{dense_1}/BiasAdd/ReadVariableOp:0"], ["dense_1"])]
    graph = helper.make_graph(nodes, "tf2onnx", [helper.make_tensor_value_info("input_1", TensorProto.FLOAT,
                                                                               ["unk__6", 28, 28])],
                              [helper.make_tensor_value_info("dense_1", TensorProto.FLOAT, ["unk__7", 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)], producer_name="tf2onnx")
    model.ir_version = 8
    return model


# -- the user's code (paths parametrised, otherwise unchanged but for the dataset) ----------------------------------
class MNISTTrainingBlock(onnxblock.TrainingBlock):
    def __init__(self):
        super(MNISTTrainingBlock, self).__init__()
        self.loss = onnxblock.loss.CrossEntropyLoss()

    def build(self, output_name):
        return self.loss(output_name), output_name


def create_training_model(untrained_onnx_model, out):
    # Create onnx model with loss
    training_block = MNISTTrainingBlock()
    for param in untrained_onnx_model.graph.initializer:
        if ("const" in param.name):
            training_block.requires_grad(param.name, False)
        else:
            training_block.requires_grad(param.name, True)

    # Create training graph and eval graph
    model_params = None
    with onnxblock.base(untrained_onnx_model):
        _ = training_block(*[output.name for output in untrained_onnx_model.graph.output])
        training_model, eval_model = training_block.to_model_proto()
        model_params = training_block.parameters()

    # Create optimizer graph
    optimizer_block = onnxblock.optim.AdamW()
    with onnxblock.empty_base() as accessor:
        _ = optimizer_block(model_params)
        optimizer_model = optimizer_block.to_model_proto()

    onnxblock.save_checkpoint(training_block.parameters(), f"{out}/checkpoint")
    onnx.save(training_model, f"{out}/training_model.onnx")
    onnx.save(optimizer_model, f"{out}/optimizer_model.onnx")
    onnx.save(eval_model, f"{out}/eval_model.onnx")

    # Create checkpoint state.
    state = CheckpointState.load_checkpoint(f"{out}/checkpoint")

    # Create module.
    training_model = Module(f"{out}/training_model.onnx", state, f"{out}/eval_model.onnx")

    # Create optimizer.
    optimizer = Optimizer(f"{out}/optimizer_model.onnx", training_model)

    return training_model, optimizer


def train(model, optimizer, ds_train):
    model.train()
    losses = []
    for data, label in ds_train:
        data = np.reshape(data, (data.shape[0], data.shape[1], data.shape[2])).astype(np.float32)
        label = np.array(label).astype(np.int64)
        forward_inputs = [data, label]

        train_loss, _ = model(*forward_inputs)
        optimizer.step()
        model.lazy_reset_grad()
        losses.append(train_loss)
    return losses


def test(model, ds_test):
    model.eval()
    losses, accuracies = [], []
    for data, label in ds_test:
        data = np.reshape(data, (data.shape[0], data.shape[1], data.shape[2])).astype(np.float32)
        label = np.array(label).astype(np.int64)
        forward_inputs = [data, label]

        test_loss, logits = model(*forward_inputs)
        accuracies.append(np.mean(np.argmax(logits, axis=1) == label))
        losses.append(test_loss)
    return losses, accuracies


test.__test__ = False  # the script's evaluation loop, not a pytest test
# ------------------------------------------------------------------------------------------------------------------


def _mnist_like(n):
    x, y = digits(n, features=64)
    images = np.zeros((n, 28, 28), np.float32)
    images[:, 10:18, 10:18] = x.reshape(n, 8, 8)
    return images, y


def test_tf2onnx_mnist_training_block(tmp_path, caplog):
    rng = np.random.default_rng(0)
    x, y = _mnist_like(192)
    ds = [(x[i:i + 64], y[i:i + 64]) for i in range(0, 192, 64)]
    with caplog.at_level(logging.WARNING, logger="onnxtrain"):
        model, optimizer = create_training_model(_tf2onnx_mnist(rng), tmp_path)
        before, _ = test(model, ds)
        losses = train(model, optimizer, ds)
        after, accuracies = test(model, ds)
    # The optimizer model onnxblock wrote (opset 17 here) runs as the same update in the training model's opset 15,
    # so the runtime fuses the two graphs without a warning about running them separately.
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], [r.getMessage() for r in caplog.records]
    assert all(np.isfinite(loss) for loss in losses)
    assert np.mean(after) < np.mean(before)
    trained = {n for n, p in model._state.parameters if p.requires_grad}
    assert trained == {i.name for i in _tf2onnx_mnist(rng).graph.initializer if "const" not in i.name}
