"""``onnxblock.blocks``: the peer's building blocks, built on :mod:`onnxtrain.blocks`.

Each block adds nodes to the model of the enclosing ``onnxblock.base(...)`` and returns its output name(s).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import onnx

from onnxtrain.blocks import base as _base
from onnxtrain.blocks import ops as _ops
from onnxtrain.ir.types import np_dtype
from onnxtrain.onnxblock.model_accessor import _ACCESSORS, current_accessor

__all__ = ["Block", "Add", "Sub", "Mul", "Div", "Pow", "Neg", "Abs", "Exp", "Log", "Sqrt", "Sigmoid", "Relu",
           "ReduceMean", "ReduceSum", "Clip", "Constant", "Cast", "Linear", "LabelEncoder"]


_BUILDING: list[_base.BuildContext] = []  # graphs onnxblock blocks are building into, innermost last


def _accessors_active() -> bool:
    return bool(_ACCESSORS)


class Block(_base.Block):
    """Base class of every onnxblock block: implement ``build(*input_names)`` and return output name(s).

    ``self.base`` is the model being built (``onnx.ModelProto``), with every node built so far.
    """

    @property
    def base(self) -> onnx.ModelProto:
        return current_accessor().model

    def _enclosing_context(self) -> _base.BuildContext:
        # The peer's blocks take plain names and build into the enclosing `with onnxblock.base(model):`; a block
        # called with no graph value (Constant()) inside a custom loss that generate_artifacts builds (no `base`)
        # builds into the graph of that loss.
        if not _accessors_active() and _BUILDING:
            return _BUILDING[-1]
        return current_accessor().context

    @contextlib.contextmanager
    def _building_into(self, ctx: _base.BuildContext) -> Iterator[None]:
        _BUILDING.append(ctx)
        try:
            with super()._building_into(ctx):
                yield
        finally:
            _BUILDING.pop()


class Add(Block, _ops.Add):
    """``a + b``."""


class Sub(Block, _ops.Sub):
    """``a - b``."""


class Mul(Block, _ops.Mul):
    """``a * b``."""


class Div(Block, _ops.Div):
    """``a / b``."""


class Pow(Block, _ops.Pow):
    """``a ** b``."""


class Neg(Block, _ops.Neg):
    """``-x``."""


class Abs(Block, _ops.Abs):
    """``|x|``."""


class Exp(Block, _ops.Exp):
    """``exp(x)``."""


class Log(Block, _ops.Log):
    """``log(x)``."""


class Sqrt(Block, _ops.Sqrt):
    """``sqrt(x)``."""


class Sigmoid(Block, _ops.Sigmoid):
    """``1 / (1 + exp(-x))``."""


class Relu(Block, _ops.Relu):
    """``max(x, 0)``."""


class ReduceMean(Block, _ops.ReduceMean):
    """Mean over ``axes`` (all axes by default)."""


class ReduceSum(Block, _ops.ReduceSum):
    """Sum over ``axes`` (all axes by default)."""


class Clip(Block, _ops.Clip):
    """``min(max(x, low), high)``."""


class Constant(Block, _ops.Constant):
    """A constant tensor; a Python float is float32 as in the peer (pass ``dtype`` for another type)."""

    def __init__(self, value, dtype=None):
        if dtype is None and isinstance(value, float):
            dtype = np.float32
        super().__init__(value, dtype)


class Cast(Block):
    """``Cast(x, to=to)`` (``to`` is an ``onnx.TensorProto`` element type)."""

    def __init__(self, to: int):
        super().__init__()
        self.to = to

    def build(self, x: str) -> str:
        return self.op.Cast(x, to=self.to)


class Linear(Block):
    """``x @ W.T + b`` with new parameters ``linear.weight`` [out, in] and ``linear.bias`` [out], initialised
    as torch.nn.Linear (uniform in +-1/sqrt(in_features)).

    Args:
        in_features, out_features: the weight's shape is (out_features, in_features).
        bias: add a bias parameter.
        alpha, beta: Gemm's scales of the product and of the bias.
        seed: seed of the initialisation (None: fresh random values).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, alpha: float = 1.0,
                 beta: float = 1.0, seed: int | None = None):
        super().__init__()
        self.in_features, self.out_features, self.bias = in_features, out_features, bias
        self.alpha, self.beta, self.seed = alpha, beta, seed

    def build(self, x: str) -> str:
        dtype = np_dtype(self.context.info(x).elem_type)
        rng = np.random.default_rng(self.seed)
        bound = 1.0 / np.sqrt(self.in_features)
        weight = rng.uniform(-bound, bound, (self.out_features, self.in_features)).astype(dtype)
        w = self.builder.const(weight, name="linear.weight")
        b = None
        if self.bias:
            b = self.builder.const(rng.uniform(-bound, bound, self.out_features).astype(dtype), name="linear.bias")
        return self.op.Gemm(x, w, b, alpha=self.alpha, beta=self.beta, transB=1)


class LabelEncoder(Block):
    """``ai.onnx.ml.LabelEncoder``: maps keys to values (e.g. ``keys_int64s=[0, 1]``, ``values_int64s=[7, 8]``,
    ``default_int64=-1``). The keyword arguments are the operator's attributes."""

    def __init__(self, **attributes):
        super().__init__()
        if not attributes:
            raise TypeError("LabelEncoder needs its keys_*, values_* and default_* attributes, e.g. "
                            "LabelEncoder(keys_int64s=[0, 1], values_int64s=[7, 8], default_int64=-1)")
        self.attributes = attributes

    def build(self, x: str) -> str:
        model = self.base
        if not any(op.domain == "ai.onnx.ml" for op in model.opset_import):
            model.opset_import.append(onnx.helper.make_opsetid("ai.onnx.ml", 2))
        return self.op.LabelEncoder(x, domain="ai.onnx.ml", **self.attributes)
