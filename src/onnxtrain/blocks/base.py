"""Blocks: small callables that add ONNX nodes to the graph being built (as onnxblock's ``Block``).

A block's ``build(*input_names)`` emits nodes through :func:`current` and returns its output name(s).
Blocks compose by calling each other, so a custom loss is a few lines::

    class WeightedSum(Block):
        def __init__(self):
            super().__init__()
            self.mse, self.l1 = MSELoss(), L1Loss()

        def build(self, output, target="target"):
            return Add()(self.mse(output, target), Mul(0.1)(self.l1(output, target)))
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import onnx
from onnx import helper

from onnxtrain.ir.builder import GraphBuilder
from onnxtrain.ir.types import TensorInfo

__all__ = ["Block", "BuildContext", "current", "building"]


@dataclass
class BuildContext:
    """The graph a block adds to: its node builder, known value types, and the inputs blocks create."""

    builder: GraphBuilder
    infos: dict[str, TensorInfo]
    new_inputs: list[onnx.ValueInfoProto] = field(default_factory=list)
    # Re-runs shape inference over the graph plus the nodes built so far (types of block-made values).
    reinfer: Callable[[BuildContext], dict[str, TensorInfo]] | None = None

    def require_input(self, name: str, elem_type: int, shape: Sequence | None) -> str:
        """Return ``name``; declare it as a new graph input (labels, targets) unless the graph has it."""
        if name in self.infos or any(i.name == name for i in self.new_inputs):
            return name
        self.builder.reserve(name)
        self.new_inputs.append(helper.make_tensor_value_info(name, elem_type, shape))
        self.infos[name] = TensorInfo(elem_type, None if shape is None else tuple(shape))
        return name

    def info(self, name: str) -> TensorInfo:
        info = self.infos.get(name)
        if info is None and self.reinfer is not None:
            self.infos.update(self.reinfer(self))
            info = self.infos.get(name)
        if info is None:
            raise ValueError(f"unknown value {name!r}: it is neither an output of the model nor a value a block "
                             f"created (known outputs include {sorted(self.infos)[:8]}...)")
        return info


_STACK: list[BuildContext] = []


def current() -> BuildContext:
    """The context blocks are being built into; fails outside :func:`building`."""
    if not _STACK:
        raise RuntimeError("a Block can only be called while artifacts are generated "
                           "(inside onnxtrain.blocks.building(...), e.g. by generate_artifacts)")
    return _STACK[-1]


@contextlib.contextmanager
def building(ctx: BuildContext) -> Iterator[BuildContext]:
    """Make ``ctx`` the target of block calls for the duration of the ``with`` statement."""
    _STACK.append(ctx)
    try:
        yield ctx
    finally:
        _STACK.pop()


class Block:
    """Base class of every building block; subclasses implement ``build(*input_names)``."""

    def __init__(self) -> None:
        pass

    def build(self, *args, **kwargs):  # pragma: no cover - abstract
        raise NotImplementedError(f"{type(self).__name__} must implement build()")

    def __call__(self, *args, **kwargs):
        return self.build(*args, **kwargs)

    @property
    def op(self):
        """The node emitter of the graph being built (``self.op.Mul(a, b)``)."""
        return current().builder.op

    @property
    def builder(self) -> GraphBuilder:
        return current().builder
