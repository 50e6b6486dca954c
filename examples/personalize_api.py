"""Personalization with the Python API: the demo's device phase in about 40 lines.

    python examples/personalize_api.py

The same calls as onnxruntime.training.api (CheckpointState, Module, Optimizer), plus the epoch loop of
onnxtrain.runtime.loop that the command line, the demo and the federated client share.
"""

import tempfile

from onnxtrain.api import CheckpointState, Module, Optimizer
from onnxtrain.artifacts import LossType, OptimType, generate_artifacts
from onnxtrain.demo.digits import load_demo_data
from onnxtrain.demo.model import build_cnn
from onnxtrain.runtime.loop import batches, evaluate, train_epoch

data = load_demo_data(seed=0)
folder = tempfile.mkdtemp()


def artifacts(model, name, **options):
    """Generate artifacts; return the CheckpointState, a Module and an Optimizer on them."""
    generate_artifacts(model, loss=LossType.CrossEntropyLoss, optimizer=OptimType.AdamW,
                       artifact_directory=f"{folder}/{name}", additional_output_names=["logits"], **options)
    state = CheckpointState.load_checkpoint(f"{folder}/{name}/checkpoint")
    module = Module(f"{folder}/{name}/training_model.onnx", state, f"{folder}/{name}/eval_model.onnx")
    optimizer = Optimizer(f"{folder}/{name}/optimizer_model.onnx", module)
    optimizer.set_learning_rate(3e-3)
    return state, module, optimizer


def accuracy(module, ds):
    return evaluate(module, batches(ds.x, ds.y, 256), metrics=["accuracy"]).metrics["accuracy"]


# "Server": pre-train every layer on the global digits, then export the inference model.
_, module, optimizer = artifacts(build_cnn(seed=0), "server")
for epoch in range(10):
    train_epoch(module, optimizer, batches(data.global_train.x, data.global_train.y, 32, shuffle=True, epoch=epoch))
module.export_model_for_inferencing(f"{folder}/pretrained.onnx", ["logits"])

# "Device": only the classifier head (the last 3 ops) trains, on the user's own digits.
state, module, optimizer = artifacts(f"{folder}/pretrained.onnx", "device", trainable_ops=3)
before = accuracy(module, data.user_test)
for epoch in range(25):
    result = train_epoch(module, optimizer, batches(data.user_train.x, data.user_train.y, 16, shuffle=True,
                                                    epoch=epoch), metrics=["accuracy"])
after = accuracy(module, data.user_test)
print(f"user's accuracy: {100 * before:.1f}% -> {100 * after:.1f}% "
      f"(last epoch: loss {result.loss:.3f} on {result.num_examples} examples)")
CheckpointState.save_checkpoint(state, f"{folder}/personalized.ckpt", include_optimizer_state=True)
module.export_model_for_inferencing(f"{folder}/personalized.onnx", ["logits"])
print(f"checkpoint: {folder}/personalized.ckpt; inference model: {folder}/personalized.onnx")
