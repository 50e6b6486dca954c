"""Checkpoints: a model's parameters, buffers and optimizer state in one safetensors file.

    data = CheckpointData(trainable={"w": w}, optimizer={"w": {"exp_avg": m}}, step=10, properties={"lr": 1e-3})
    save_checkpoint(data, "model.ckpt")          # atomic: never leaves a half-written file
    data = load_checkpoint("model.ckpt")         # validated: any defect is a CheckpointError

The file opens with any safetensors reader; tensors are named ``trainable/<name>``, ``frozen/<name>``,
``buffer/<name>`` and ``optimizer/<param>/<state>``. A checkpoint written by onnxruntime-training is read by
:func:`read_peer_checkpoint`, and :func:`import_peer_checkpoint` carries its values into onnxtrain's.
"""

from onnxtrain.checkpoint.data import KINDS, CheckpointData, TensorSpec, split_tensor_key, tensor_key
from onnxtrain.checkpoint.format import CHECKPOINT_FORMAT_VERSION, load_checkpoint, save_checkpoint
from onnxtrain.checkpoint.peer import import_peer_checkpoint, read_peer_checkpoint

__all__ = [
    "CheckpointData",
    "TensorSpec",
    "save_checkpoint",
    "load_checkpoint",
    "read_peer_checkpoint",
    "import_peer_checkpoint",
    "CHECKPOINT_FORMAT_VERSION",
    "tensor_key",
    "split_tensor_key",
    "KINDS",
]
