"""Blocks: small callables that add ONNX nodes to the graph being built (as onnxblock's ``Block``).

A block's ``build(*inputs)`` emits nodes through ``self.op`` and returns its output name(s). Inputs and outputs
are :class:`Value` s: names that carry the :class:`BuildContext` of the graph they belong to, so a block finds the
graph it builds into from its inputs, explicitly, with no global state. Blocks compose by calling each other, so a
custom loss is a few lines::

    class WeightedSum(Block):
        def __init__(self):
            super().__init__()
            self.mse, self.l1 = MSELoss(), L1Loss()

        def build(self, output, target="target"):
            return Add()(self.mse(output, target), Mul(0.1)(self.l1(output, target)))
"""

from __future__ import annotations

import contextlib
import difflib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import onnx
from onnx import helper

from onnxtrain.ir.builder import GraphBuilder
from onnxtrain.ir.types import TensorInfo

__all__ = ["Block", "BuildContext", "Value", "context_of", "UnknownValueError"]


class UnknownValueError(ValueError):
    """A block read a value name the graph being built does not have; ``block``: the block that read it."""

    block: str | None = None


@dataclass
class BuildContext:
    """The graph a block adds to: its node builder, known value types, and the inputs blocks create."""

    builder: GraphBuilder
    infos: dict[str, TensorInfo]
    new_inputs: list[onnx.ValueInfoProto] = field(default_factory=list)
    # Re-runs shape inference over the graph plus the nodes built so far (types of block-made values).
    reinfer: Callable[[BuildContext], dict[str, TensorInfo]] | None = None

    def value(self, name: str) -> Value:
        """``name`` as a value of this graph, to pass to a block."""
        return Value(name, self)

    def wrap(self, outputs):
        """A block's or an op's output name(s) as values of this graph (None and non-names pass through)."""
        if isinstance(outputs, str):
            return outputs if isinstance(outputs, Value) and outputs.context is self else Value(outputs, self)
        if isinstance(outputs, (tuple, list)):
            return type(outputs)(self.wrap(o) for o in outputs)
        return outputs

    @property
    def op(self) -> _ValueOps:
        """Node emitter whose results are values of this graph: ``ctx.op.Mul(a, b)``."""
        return _ValueOps(self)

    def require_input(self, name: str, elem_type: int, shape: Sequence | None) -> Value:
        """Return ``name``; declare it as a new graph input (labels, targets) unless the graph has it."""
        if name in self.infos or any(i.name == name for i in self.new_inputs):
            return self.value(name)
        self.builder.reserve(name)
        self.new_inputs.append(helper.make_tensor_value_info(name, elem_type, shape))
        self.infos[name] = TensorInfo(elem_type, None if shape is None else tuple(shape))
        return self.value(name)

    def info(self, name: str) -> TensorInfo:
        info = self.infos.get(name)
        if info is None and self.reinfer is not None:
            self.infos.update(self.reinfer(self))
            info = self.infos.get(name)
        if info is None:
            close = difflib.get_close_matches(name, list(self.infos), n=3)
            hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
            raise UnknownValueError(f"unknown value {name!r}: it is neither a value of the model nor one a block "
                                    f"created{hint}")
        return info


class Value(str):
    """The name of a value in a graph being built, with the :class:`BuildContext` of that graph."""

    context: BuildContext

    def __new__(cls, name: str, context: BuildContext) -> Value:
        value = super().__new__(cls, name)
        value.context = context
        return value


class _ValueOps:
    """``ctx.op.<OpType>(...)``: the builder's node emitter, its outputs wrapped as values of ``ctx``."""

    def __init__(self, context: BuildContext):
        self._context = context

    def __getattr__(self, op_type: str) -> Callable:
        emit = getattr(self._context.builder.op, op_type)
        return lambda *args, **attrs: self._context.wrap(emit(*args, **attrs))


def context_of(*values) -> BuildContext | None:
    """The one graph the :class:`Value` s among ``values`` belong to (None if there are none)."""
    contexts = {id(v.context): v.context for v in values if isinstance(v, Value)}
    if len(contexts) > 1:
        raise ValueError(f"the inputs {[v for v in values if isinstance(v, Value)]} belong to different graphs")
    return next(iter(contexts.values()), None)


class Block:
    """Base class of every building block; subclasses implement ``build(*input_names)``."""

    _context: BuildContext | None = None
    #: How the block's output combines a batch's examples when it is the loss: "mean", "sum", or "" when unknown
    #: (a training loop weights batch means by their size and adds batch sums).
    batch_reduction: str = ""

    def __init__(self) -> None:
        pass

    def build(self, *args, **kwargs):  # pragma: no cover - abstract
        raise NotImplementedError(f"{type(self).__name__} must implement build()")

    def __call__(self, *args, **kwargs):
        """Build into the graph the inputs belong to; returns the output(s) as values of that graph."""
        ctx = context_of(*args, *kwargs.values()) or self._enclosing_context()
        if ctx is None:
            raise TypeError(f"{type(self).__name__}: none of its inputs {list(args)} is a value of a graph being "
                            "built; call blocks on the values generate_artifacts passes to the loss (or on the "
                            "outputs of other blocks), or on ctx.value(name) for a BuildContext ctx")
        with self._building_into(ctx):
            try:
                return ctx.wrap(self.build(*args, **kwargs))
            except UnknownValueError as exc:
                if exc.block is None:   # named after the innermost block, the one that read the value
                    exc.block = type(self).__name__
                    exc.args = (f"block {exc.block}: {exc.args[0]}",)
                raise

    @contextlib.contextmanager
    def _building_into(self, ctx: BuildContext) -> Iterator[None]:
        """``self.op`` / ``self.builder`` / ``self.context`` emit into ``ctx`` inside the ``with``."""
        previous, self._context = self._context, ctx
        try:
            yield
        finally:
            self._context = previous

    def _enclosing_context(self) -> BuildContext | None:
        """The graph to build into when no input names one (onnxblock's blocks: the enclosing ``base``)."""
        return None

    @property
    def context(self) -> BuildContext:
        """The graph this block is building into; only while it is being called."""
        if self._context is None:
            raise RuntimeError(f"{type(self).__name__}: a block's graph is known only while the block is called "
                               "(block(*inputs)), not outside of it")
        return self._context

    @property
    def op(self) -> _ValueOps:
        """The node emitter of the graph being built (``self.op.Mul(a, b)``)."""
        return self.context.op

    @property
    def builder(self) -> GraphBuilder:
        return self.context.builder
