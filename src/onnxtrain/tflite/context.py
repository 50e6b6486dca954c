"""The state of one import: ONNX names of the TFLite tensors in either layout, and the node builder.

TFLite images are NHWC, ONNX's Conv and pooling want NCHW. A 4-D tensor can have an ONNX value in each layout;
the other one is made by one Transpose when an op first asks for it, and reused. Ops that do not care
(elementwise, activations) keep the layout their inputs come in, so a chain of convolutions, pooling and
activations carries NCHW from the first Transpose after the graph input to the first op that needs NHWC
(a Reshape that flattens, the graph output); a flatten of an [N, 1, 1, C] tensor needs no Transpose at all.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from onnxtrain.ir.builder import GraphBuilder
from onnxtrain.tflite.reader import FlatModel, FlatOperator, FlatTensor

__all__ = ["ImportContext", "UnsupportedModelError", "NHWC_TO_NCHW", "NCHW_TO_NHWC"]

NHWC_TO_NCHW = (0, 3, 1, 2)
NCHW_TO_NHWC = (0, 2, 3, 1)


class UnsupportedModelError(ValueError):
    """A model the importer cannot convert; the message names the operator or tensor and what was expected."""


@dataclass
class ImportContext:
    model: FlatModel
    builder: GraphBuilder
    weights: dict[int, str] = field(default_factory=dict)      # tensor index -> initializer name
    _values: dict[tuple[int, str], str] = field(default_factory=dict)  # (tensor index, "nhwc"|"nchw") -> name

    def tensor(self, index: int) -> FlatTensor:
        return self.model.tensors[index]

    def rank(self, index: int) -> int:
        return len(self.tensor(index).signature)

    def fail(self, op: FlatOperator, message: str) -> UnsupportedModelError:
        return UnsupportedModelError(f"operator {op.index} ({op.code}): {message}")

    # values ---------------------------------------------------------------------------------------------------
    def define(self, index: int, name: str, layout: str = "nhwc") -> None:
        self._values[(index, layout)] = name

    def output(self, op: FlatOperator, k: int = 0, layout: str = "nhwc") -> str:
        """A fresh ONNX name for the op's k-th output in ``layout``, recorded as that tensor's value."""
        index = op.outputs[k]
        name = self.builder.unique(self.tensor(index).name or f"t{index}")
        self.define(index, name, layout)
        return name

    def has(self, index: int, layout: str) -> bool:
        return (index, layout) in self._values

    def value(self, index: int) -> tuple[str, str]:
        """The tensor's value in the layout it was made in: (name, layout); NHWC if both exist."""
        for layout in ("nhwc", "nchw"):
            if (index, layout) in self._values:
                return self._values[(index, layout)], layout
        return self._constant(index), "nhwc"

    def nhwc(self, index: int) -> str:
        """The tensor in TFLite's own layout."""
        if (index, "nhwc") not in self._values:
            name, _ = self.value(index)
            if (index, "nhwc") not in self._values:
                self._values[(index, "nhwc")] = self.builder.op.Transpose(name, perm=list(NCHW_TO_NHWC))
        return self._values[(index, "nhwc")]

    def nchw(self, index: int) -> str:
        """A 4-D tensor as NCHW (one Transpose the first time it is asked for, if it was made as NHWC)."""
        if self.rank(index) != 4:
            raise ValueError(f"tensor {self.tensor(index).name!r} has rank {self.rank(index)}, not 4")
        if (index, "nchw") not in self._values:
            self._values[(index, "nchw")] = self.builder.op.Transpose(self.nhwc(index), perm=list(NHWC_TO_NCHW))
        return self._values[(index, "nchw")]

    def nchw_operand(self, index: int) -> str:
        """An elementwise operand of a 4-D NCHW tensor: rank-4 tensors as NCHW, lower ranks (NHWC broadcasting,
        e.g. a per-channel [C] constant) unsqueezed to rank 4 and transposed, so they broadcast the same way."""
        rank = self.rank(index)
        if rank == 4:
            return self.nchw(index)
        t = self.tensor(index)
        if rank == 0 or int(np.prod(t.shape)) == 1:
            return self.nhwc(index)
        x = self.builder.unsqueeze(self.nhwc(index), list(range(4 - rank)))
        return self.builder.op.Transpose(x, perm=list(NHWC_TO_NCHW))

    def _constant(self, index: int) -> str:
        """A constant tensor: float ones become initializers named as the tensor (the weights to train),
        others (shapes, axes, indices) plain constants."""
        t = self.tensor(index)
        if t.data is None:
            raise UnsupportedModelError(f"tensor {index} ({t.name!r}) is read before any operator writes it and is "
                                        f"not a constant or a graph input")
        if index in self.weights:
            name = self.weights[index]
        else:
            name = self.builder.const(t.data)
        self._values[(index, "nhwc")] = name
        return name

    def constant_value(self, op: FlatOperator, k: int, what: str) -> np.ndarray:
        """The value of the op's k-th input, which must be a constant (axes, paddings, shapes)."""
        t = self.tensor(op.inputs[k])
        if t.data is None:
            raise self.fail(op, f"{what} (input {k}, tensor {t.name!r}) must be a constant; it is computed at run "
                                f"time")
        return t.data
