"""``base(model)`` and ``empty_base()``: the model that onnxblock blocks build on (as the peer's model_accessor).

Inside ``with onnxblock.base(model) as accessor:`` every block call adds its nodes to a copy of ``model``;
``accessor.model`` is that copy, including everything built so far. Users may edit it (add graph inputs,
opset imports) between and during block calls; blocks see the edits.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator, Sequence

import onnx
from onnx import helper

from onnxtrain.blocks.base import BuildContext
from onnxtrain.ir.builder import GraphBuilder
from onnxtrain.ir.passes import default_opset, used_names
from onnxtrain.ir.types import TensorInfo, infer_tensor_info

__all__ = ["ModelAccessor", "base", "empty_base", "current_accessor"]

_ACCESSORS: list[ModelAccessor] = []


class _AccessorContext(BuildContext):
    """A build context whose value types follow the accessor's model, which users may edit at any time."""

    def require_input(self, name: str, elem_type: int, shape: Sequence | None) -> str:
        if name not in self.infos and self.reinfer is not None:  # an input the user added, a value a node made
            self.infos.update(self.reinfer(self))
        return super().require_input(name, elem_type, shape)


class ModelAccessor:
    """Holds the model being built; ``model`` returns it with every node built so far."""

    def __init__(self, model: onnx.ModelProto):
        self._model = model
        opset = default_opset(model)
        if opset is None:
            raise ValueError("the base model imports no default-domain (ai.onnx) opset; add one with "
                             "model.opset_import.append(onnx.helper.make_opsetid('', 17))")
        self._flushed = (0, 0, 0)
        builder = GraphBuilder(opset, taken=used_names(model.graph))
        self.context = _AccessorContext(builder, {}, reinfer=lambda _ctx: self._infer())
        self.context.infos = self._infer()

    @property
    def model(self) -> onnx.ModelProto:
        """The model with every node, constant and input the blocks have created so far."""
        ctx, (n, i, v) = self.context, self._flushed
        graph = self._model.graph
        graph.node.extend(ctx.builder.nodes[n:])
        graph.initializer.extend(ctx.builder.initializers[i:])
        graph.input.extend(ctx.new_inputs[v:])
        self._flushed = (len(ctx.builder.nodes), len(ctx.builder.initializers), len(ctx.new_inputs))
        return self._model

    def _infer(self) -> dict[str, TensorInfo]:
        """Value types of the model built so far; names the user added since (graph inputs) become taken."""
        model = self.model
        self.context.builder.take(used_names(model.graph))
        return infer_tensor_info(model)

    def value_info(self, name: str) -> onnx.ValueInfoProto:
        """The type of ``name`` (tensor or sequence) from ONNX shape inference over the model built so far."""
        model = self.model
        for vi in model.graph.output:
            if vi.name == name:
                return copy.deepcopy(vi)
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
        for vi in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
            if vi.name == name:
                return copy.deepcopy(vi)
        for init in model.graph.initializer:
            if init.name == name:
                return helper.make_tensor_value_info(name, init.data_type, list(init.dims))
        raise LookupError(f"The provided name {name} is not a graph value info or a graph output.")


def current_accessor() -> ModelAccessor:
    """The accessor of the innermost ``base``/``empty_base`` block; fails outside of one."""
    if not _ACCESSORS:
        raise RuntimeError("onnxblock blocks can only be built inside `with onnxblock.base(model):` or "
                           "`with onnxblock.empty_base():`")
    return _ACCESSORS[-1]


@contextlib.contextmanager
def base(model: onnx.ModelProto) -> Iterator[ModelAccessor]:
    """Build blocks on top of a copy of ``model`` (the caller's model is left untouched)."""
    accessor = ModelAccessor(copy.deepcopy(model))
    _ACCESSORS.append(accessor)
    try:
        yield accessor
    finally:
        _ACCESSORS.pop()


@contextlib.contextmanager
def empty_base(opset_version: int | None = None) -> Iterator[ModelAccessor]:
    """Build blocks on an empty model (an optimizer graph, or a model written from scratch)."""
    model = helper.make_model(helper.make_graph([], "onnxblock", [], []), producer_name="onnxtrain",
                              opset_imports=[helper.make_opsetid("", opset_version or onnx.defs.onnx_opset_version())])
    with base(model) as accessor:
        yield accessor
