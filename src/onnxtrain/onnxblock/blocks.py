"""``onnxblock.blocks``: the peer's building blocks, built on :mod:`onnxtrain.blocks`.

Each block adds nodes to the model of the enclosing ``onnxblock.base(...)`` (or, for a loss given to
``generate_artifacts``, to the forward model the loss is built on) and returns its output name(s). The
constructors take the peer's arguments, with its defaults (``ReduceMean()`` keeps the reduced axes, as the
peer's). After each call the nodes it added are checked: one that reads a name the model does not define is a
``ValueError`` naming the block and the value (the peer's ONNX check raised; ONNX's shape inference could crash
the process on such a graph). Every block writes default-domain ONNX ops only: the peer's ``LabelEncoder``
(``ai.onnx.ml``) and ``ReduceAllL2`` (``com.microsoft``) are written as compositions of standard ops.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import os
from collections.abc import Iterator, Sequence

import numpy as np
import onnx

from onnxtrain.blocks import base as _base
from onnxtrain.blocks import ops as _ops
from onnxtrain.blocks.model_accessor import calling, current_accessor, innermost_accessor
from onnxtrain.ir.types import np_dtype

__all__ = ["Block", "Add", "Sub", "Mul", "Div", "Pow", "Neg", "Abs", "Exp", "Log", "Sqrt", "Sigmoid", "Relu",
           "ReduceMean", "ReduceSum", "Clip", "Constant", "Cast", "Linear", "LabelEncoder", "PassThrough",
           "InputLike", "SequenceConstruct", "ReduceAllL2"]


_BUILDING: list[_base.BuildContext] = []  # graphs onnxblock blocks are building into, innermost last


def _accessors_active() -> bool:
    return innermost_accessor() is not None


class Block(_base.Block):
    """Base class of every onnxblock block: implement ``build(*input_names)`` and return output name(s).

    ``self.base`` is the model being built (``onnx.ModelProto``), with every node built so far; edits to it
    (new inputs, initializers, nodes) are part of the model.

    ``temp_file_name``: the peer's scratch file for models over 2 GB (checked there through a file); onnxtrain
    checks models in memory and writes no such file, but takes the argument (a relative path) as the peer.
    """

    def __init__(self, temp_file_name: str = "temp.onnx") -> None:
        if os.path.isabs(temp_file_name):
            raise RuntimeError("Please pass in a relative path for the temp_file_name.")
        _base.Block.__init__(self)  # not super(): the onnxtrain block a wrapper also derives from takes other arguments
        self.temp_onnx_file_path = os.path.join(os.getcwd(), temp_file_name)
        self.temp_external_data_file_name = temp_file_name + ".data"

    @property
    def base(self) -> onnx.ModelProto:
        return current_accessor().model

    def infer_shapes_on_base(self) -> onnx.ModelProto:
        """The model built so far with ONNX shape inference's value infos (a copy; as the peer's)."""
        return current_accessor().infer_shapes()

    def __call__(self, *args, **kwargs):
        _check_arguments(self, args, kwargs)
        accessor = innermost_accessor()
        start = len(accessor.model.graph.node) if accessor is not None else 0
        with calling(self):
            output = super().__call__(*args, **kwargs)
        if accessor is not None:
            accessor.check_block(self, start)
        return output

    def _enclosing_context(self) -> _base.BuildContext:
        # The peer's blocks take plain names and build into the enclosing `with onnxblock.base(model):` (or the
        # model generate_artifacts builds its loss on); a block called with no graph value (Constant()) inside
        # an onnxtrain.blocks loss built on a BuildContext of its own builds into the graph of that loss.
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


def _check_arguments(block: Block, args: tuple, kwargs: dict, as_loss: bool = True) -> None:
    """A call whose inputs ``build`` cannot take is a TypeError naming the block and the inputs it was given (a
    custom loss given to generate_artifacts gets every model output, or ``loss_input_names``, as the peer's)."""
    try:
        inspect.signature(block.build).bind(*args, **kwargs)
    except TypeError as exc:
        given = [str(a) if isinstance(a, str) else type(a).__name__ for a in args]
        named = f" and {sorted(kwargs)}" if kwargs else ""
        users = as_loss and not type(block).__module__.startswith("onnxtrain.")
        hint = (" (a custom loss given to generate_artifacts gets every output of the model, or the values named in "
                "loss_input_names)") if users else ""
        raise TypeError(f"{type(block).__name__} was called with {len(args)} input(s) {given}{named}, which its "
                        f"build{inspect.signature(block.build)} does not take: {exc}{hint}") from None
    except ValueError:  # no signature to check (a builtin): build() itself will say
        pass


class Add(Block, _ops.Add):
    """``a + b`` (``Add(constant)``: ``a + constant``)."""

    def __init__(self, constant: float | None = None):
        Block.__init__(self)
        self.constant = constant


class Sub(Block, _ops.Sub):
    """``a - b`` (``Sub(constant)``: ``a - constant``)."""

    def __init__(self, constant: float | None = None):
        Block.__init__(self)
        self.constant = constant


class Mul(Block, _ops.Mul):
    """``a * b`` (``Mul(constant)``: ``a * constant``)."""

    def __init__(self, constant: float | None = None):
        Block.__init__(self)
        self.constant = constant


class Div(Block, _ops.Div):
    """``a / b`` (``Div(constant)``: ``a / constant``)."""

    def __init__(self, constant: float | None = None):
        Block.__init__(self)
        self.constant = constant


class Pow(Block, _ops.Pow):
    """``x ** exponent``, as the peer's ``Pow(exponent)(x)`` (without ``exponent``: ``Pow()(x, y)``)."""

    def __init__(self, exponent: float | None = None):
        Block.__init__(self)
        self.constant = exponent


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
    """Mean over ``axes`` (all axes by default); ``keepdims=True`` keeps them as size 1, as the peer's
    (``ReduceMean()`` of a [batch, n] value is [1, 1]; ``keepdims=False`` gives a scalar)."""

    def __init__(self, keepdims: bool = True, axes: Sequence[int] | None = None):
        Block.__init__(self)
        self.axes, self.keepdims = axes, keepdims


class ReduceSum(Block, _ops.ReduceSum):
    """Sum over ``axes`` (all axes by default); ``keepdims=True`` keeps them as size 1, as the peer's."""

    def __init__(self, keepdims: bool = True, axes: Sequence[int] | None = None):
        Block.__init__(self)
        self.axes, self.keepdims = axes, keepdims


class Clip(Block, _ops.Clip):
    """``min(max(x, clip_min), clip_max)``; a bound left None is not applied."""

    def __init__(self, clip_min: float | None = None, clip_max: float | None = None):
        Block.__init__(self)
        self.low, self.high = clip_min, clip_max


class Constant(Block, _ops.Constant):
    """A constant: the peer's ``Constant(value_float)()`` is a float32 tensor of shape [1] holding the number.
    An array keeps its shape (and its dtype, or ``dtype``)."""

    def __init__(self, value_float, dtype=None):
        Block.__init__(self)
        if isinstance(value_float, (int, float)) and not isinstance(value_float, bool) and dtype is None:
            value_float, dtype = [value_float], np.float32
        self.value, self.dtype = value_float, dtype


class PassThrough(Block):
    """Returns its inputs (a tuple of their names) and adds nothing: ``generate_artifacts(loss=None)`` is a
    PassThrough, the first name being the loss and the others outputs after it."""

    def build(self, *input_names: str) -> tuple[str, ...]:
        return tuple(input_names)


class InputLike(Block):
    """A new graph input with the type and shape of the graph input or output ``like``:
    ``InputLike("output")("target")`` declares ``target`` shaped as ``output`` (the peer's MSELoss declares its
    target so); without a name, a fresh one. Returns the input's name."""

    def __init__(self, like: str):
        super().__init__()
        self._like = like

    def build(self, input_name: str | None = None) -> str:
        graph = self.base.graph
        source = next((v for v in [*graph.input, *graph.output] if v.name == self._like), None)
        if source is None:
            raise LookupError(f"Could not find input or output with name {self._like}: InputLike copies the type of "
                              f"a graph input or output; the model's inputs are {[v.name for v in graph.input]}, its "
                              f"outputs {[v.name for v in graph.output]}")
        ctx = self.context
        name = input_name or ctx.builder.unique("input")
        if input_name is not None:
            if any(v.name == name for v in [*graph.input, *graph.initializer]):
                raise ValueError(f"InputLike: the model already has an input named {name!r}")
            ctx.builder.reserve(name)
        cloned = copy.deepcopy(source)
        cloned.name = name
        ctx.new_inputs.append(cloned)
        return name


class SequenceConstruct(Block):
    """A tensor sequence of its inputs (ONNX ``SequenceConstruct``)."""

    def build(self, *sequence_input_names: str) -> str:
        return self.op.SequenceConstruct(*sequence_input_names)


class ReduceAllL2(Block):
    """The L2 norm of all its inputs together, ``sqrt(sum_i sum(x_i ** 2))``, one number (0-d), in the first
    input's type. The peer emits onnxruntime's ``com.microsoft.ReduceAllL2``; here it is one ReduceSumSquare
    per input, their Sum and a Sqrt (default-domain ops only)."""

    def build(self, *reduce_node_input_names: str) -> str:
        if not reduce_node_input_names:
            raise TypeError("ReduceAllL2 needs at least one input")
        squares = [self.builder.reduce("ReduceSumSquare", x, None, keepdims=False) for x in reduce_node_input_names]
        total = squares[0] if len(squares) == 1 else self.op.Sum(*squares)
        return self.op.Sqrt(total)


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


_LABEL_TYPES = {"int64s": np.int64, "floats": np.float32, "strings": object}
_STRING_EQUAL_SINCE = 19  # Equal takes strings from opset 19 on


class LabelEncoder(Block):
    """Maps each key to its value, anything else to the default, as ``ai.onnx.ml.LabelEncoder`` (the peer's
    block), e.g. raw labels to class indices: ``LabelEncoder(keys_int64s=[10, 11], values_int64s=[0, 1])``.

    Written with default-domain ops, so that the artifacts hold no ``ai.onnx.ml`` node: the position of ``x`` among
    the keys is ``ArgMax`` of ``x == keys`` (the first equal key, as the ML op keeps the first of repeated keys),
    and ``y = Where(keys[i] == x, values[i], default)``. The input is data (labels), not a value with a gradient.
    String keys need ``Equal`` on strings, opset 19 or later.
    """

    def __init__(self, default_float: float = 0.0, default_int64: int = -1, default_string: str = "_Unused",
                 keys_floats: Sequence[float] | None = None, keys_int64s: Sequence[int] | None = None,
                 keys_strings: Sequence[str] | None = None, values_floats: Sequence[float] | None = None,
                 values_int64s: Sequence[int] | None = None, values_strings: Sequence[str] | None = None):
        super().__init__()
        keys = {k: v for k, v in (("floats", keys_floats), ("int64s", keys_int64s), ("strings", keys_strings))
                if v is not None}
        values = {k: v for k, v in (("floats", values_floats), ("int64s", values_int64s),
                                    ("strings", values_strings)) if v is not None}
        if len(keys) != 1 or len(values) != 1:
            raise ValueError(f"LabelEncoder takes one of keys_floats, keys_int64s, keys_strings and one of "
                             f"values_floats, values_int64s, values_strings; got keys_{list(keys) or ['(none)']} and "
                             f"values_{list(values) or ['(none)']}")
        (self.key_kind, key_list), (self.value_kind, value_list) = *keys.items(), *values.items()
        if len(key_list) != len(value_list) or not key_list:
            raise ValueError(f"LabelEncoder needs as many values as keys, at least one: got {len(key_list)} keys and "
                             f"{len(value_list)} values")
        self.keys = np.array(list(key_list), dtype=_LABEL_TYPES[self.key_kind])
        self.values = np.array(list(value_list), dtype=_LABEL_TYPES[self.value_kind])
        default = {"floats": default_float, "int64s": default_int64, "strings": default_string}[self.value_kind]
        self.default = np.array(default, dtype=_LABEL_TYPES[self.value_kind])

    def build(self, x: str) -> str:
        b, op = self.builder, self.op
        if self.key_kind == "strings" and b.opset < _STRING_EQUAL_SINCE:
            raise ValueError(f"LabelEncoder with keys_strings: onnxtrain writes it with Equal on strings, which ONNX "
                             f"has from opset {_STRING_EQUAL_SINCE}, and the model is opset {b.opset} (the artifacts "
                             "hold default-domain ops only, not ai.onnx.ml's LabelEncoder); map the string labels "
                             "to integers before feeding them, or convert the model to opset 19 "
                             "(onnx.version_converter.convert_version)")
        keys = b.const(self.keys, name="label_encoder.keys")
        values = b.const(self.values, name="label_encoder.values")
        default = b.const(self.default, name="label_encoder.default")
        column = (op.Unsqueeze(x, b.ints([-1])) if b.opset >= 13 else op.Unsqueeze(x, axes=[-1]))
        matches = op.Cast(op.Equal(column, keys), to=onnx.TensorProto.FLOAT)
        index = op.ArgMax(matches, axis=-1, keepdims=0)   # the first equal key; 0 when none is
        found = op.Equal(op.Gather(keys, index), x)
        return op.Where(found, op.Gather(values, index), default)
