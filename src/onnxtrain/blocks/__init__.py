"""Building blocks: losses, optimizers and composable ops, in the spirit of onnxblock. Optimizers are chains of
the transforms in ``onnxtrain.blocks.transforms`` (as optax's)."""

from onnxtrain.blocks.base import Block, BuildContext, Value, context_of
from onnxtrain.blocks.losses import BCEWithLogitsLoss, CrossEntropyLoss, HuberLoss, L1Loss, MSELoss, NLLLoss
from onnxtrain.blocks.ops import (
    Abs,
    Add,
    Clip,
    Constant,
    Div,
    Exp,
    Identity,
    Log,
    Mul,
    Neg,
    Pow,
    ReduceMean,
    ReduceSum,
    Relu,
    Sigmoid,
    Sqrt,
    Sub,
    reduce,
)
from onnxtrain.blocks.optim import SGD, Adam, AdamW, Optimizer, OptimizerInputs

__all__ = [
    "Block", "BuildContext", "Value", "context_of",
    "MSELoss", "L1Loss", "HuberLoss", "BCEWithLogitsLoss", "CrossEntropyLoss", "NLLLoss",
    "Abs", "Add", "Clip", "Constant", "Div", "Exp", "Log", "Mul", "Neg", "Pow", "ReduceMean", "ReduceSum", "Relu",
    "Sigmoid", "Sqrt", "Sub", "Identity", "reduce",
    "Optimizer", "OptimizerInputs", "AdamW", "Adam", "SGD",
]
