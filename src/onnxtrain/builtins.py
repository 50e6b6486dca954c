"""The one table of built-in losses and optimizers (``LossType``, ``OptimType``, as onnxruntime-training names them).

Generation builds their blocks from it, the command line derives its names from it. Importing this module loads
nothing else (the command line's ``--help`` stays fast); the block classes are imported when asked for.
"""

from __future__ import annotations

import enum
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from onnxtrain.blocks.base import Block
    from onnxtrain.blocks.optim import Optimizer

__all__ = ["LossType", "OptimType"]


class LossType(enum.Enum):
    """Built-in losses (the names of onnxruntime.training.artifacts.LossType, plus more).

    This enum is the one table of built-in losses: each member names its block class in
    :mod:`onnxtrain.blocks.losses`, and the command line's names derive from it (:attr:`cli_name`)."""

    MSELoss = 1
    CrossEntropyLoss = 2
    BCEWithLogitsLoss = 3
    L1Loss = 4
    HuberLoss = 5
    NLLLoss = 6

    @property
    def block_class(self) -> type[Block]:
        from onnxtrain.blocks import losses

        return getattr(losses, self.name)

    @property
    def cli_name(self) -> str:
        """``cross-entropy``, ``bce-with-logits``, ``mse``, ... (the class name in kebab case, without "Loss")."""
        return _kebab(self.name.removesuffix("Loss"))


class OptimType(enum.Enum):
    """Built-in optimizers with their default hyper-parameters; the one table of them, as :class:`LossType`."""

    AdamW = 1
    SGD = 2
    Adam = 3

    @property
    def block_class(self) -> type[Optimizer]:
        from onnxtrain.blocks import optim

        return getattr(optim, self.name)

    @property
    def cli_name(self) -> str:
        return self.name.lower()


def _kebab(camel: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "-", camel).lower()
