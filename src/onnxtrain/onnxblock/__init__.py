"""``onnxtrain.onnxblock``: the names and behaviour of ``onnxruntime.training.onnxblock``, on onnxtrain.

    import onnxtrain.onnxblock as onnxblock      # was: import onnxruntime.training.onnxblock as onnxblock

    class Model(onnxblock.TrainingBlock):
        def __init__(self):
            super().__init__()
            self.loss = onnxblock.loss.CrossEntropyLoss()

        def build(self, output_name):
            return self.loss(output_name)

    block = Model()
    with onnxblock.base(forward_model):
        block(forward_model.graph.output[0].name)
    training_model, eval_model = block.to_model_proto()
    onnxblock.save_checkpoint(block.parameters(), "checkpoint")

This is offline-phase code; the blocks are :mod:`onnxtrain.blocks` under the peer's names and arguments.
"""

from onnxtrain.onnxblock import blocks, loss, optim
from onnxtrain.onnxblock.blocks import Block
from onnxtrain.onnxblock.checkpoint_utils import load_checkpoint_to_model, save_checkpoint
from onnxtrain.onnxblock.model_accessor import base, custom_op_library, empty_base
from onnxtrain.onnxblock.onnxblock import ForwardBlock, TrainingBlock

__all__ = ["Block", "ForwardBlock", "TrainingBlock", "base", "empty_base", "custom_op_library", "blocks", "loss",
           "optim", "save_checkpoint", "load_checkpoint_to_model"]


_RENAMED = {  # onnxruntime-training before 1.15 -> 1.15 to 1.19.2
    "TrainingModel": "onnxblock.TrainingBlock (build the models inside `with onnxblock.base(model):`, then "
                     "block.to_model_proto() returns (training_model, eval_model))",
    "onnx_model": "onnxblock.base(model) for a forward model and onnxblock.empty_base() for an optimizer (the "
                  "built models come from block.to_model_proto(), not from the accessor)",
}


def __getattr__(name: str):
    if name in _RENAMED:
        raise AttributeError(f"onnxblock.{name} is the API of onnxruntime-training before 1.15, which onnxtrain "
                             f"follows at 1.19.2: use {_RENAMED[name]}")
    raise AttributeError(f"module 'onnxtrain.onnxblock' has no attribute {name!r}")
