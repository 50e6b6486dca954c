"""``save_checkpoint((trainable, frozen), path)`` and ``load_checkpoint_to_model``, as the peer's onnxblock."""

from __future__ import annotations

import os
from collections.abc import Sequence

import onnx
from onnx import numpy_helper

from onnxtrain import checkpoint

__all__ = ["save_checkpoint", "load_checkpoint_to_model"]


def save_checkpoint(parameters: tuple[Sequence[onnx.TensorProto], Sequence[onnx.TensorProto]],
                    path_to_checkpoint: str | os.PathLike, nominal_checkpoint: bool = False) -> None:
    """Write (trainable, frozen) parameters, as ``TrainingBlock.parameters()`` returns them, to a checkpoint
    that ``CheckpointState.load_checkpoint`` reads (``nominal_checkpoint``: shapes and dtypes only)."""
    trainable, frozen = parameters
    data = checkpoint.CheckpointData(trainable={t.name: numpy_helper.to_array(t) for t in trainable},
                                     frozen={t.name: numpy_helper.to_array(t) for t in frozen})
    checkpoint.save_checkpoint(data.nominal_copy() if nominal_checkpoint else data, path_to_checkpoint)


def load_checkpoint_to_model(path_to_checkpoint: str | os.PathLike, model: onnx.ModelProto) -> None:
    """Overwrite, in place, the initializers of ``model`` that the checkpoint holds (parameters and buffers)."""
    data = checkpoint.load_checkpoint(path_to_checkpoint)
    if data.nominal:
        raise ValueError(f"{os.fspath(path_to_checkpoint)} is a nominal checkpoint: it has no values to load")
    values = {**data.trainable, **data.frozen, **data.buffers}
    for init in model.graph.initializer:
        if init.name in values:
            init.CopyFrom(numpy_helper.from_array(values[init.name], init.name))
