"""``base(model)`` and ``empty_base()``: the model that onnxblock blocks build on (as the peer's model_accessor),
and ``building_on(model)``, in which ``generate_artifacts`` builds the loss on the forward model itself.

Inside ``with onnxblock.base(model) as accessor:`` every block call adds its nodes to a copy of ``model``;
``accessor.model`` is that copy, including everything built so far. Users may edit it (add graph inputs,
opset imports) between and during block calls; blocks see the edits.
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import os
from collections.abc import Callable, Iterator, Sequence

import onnx
from onnx import helper

from onnxtrain.blocks.base import BuildContext
from onnxtrain.ir.builder import GraphBuilder
from onnxtrain.ir.passes import default_opset, used_names
from onnxtrain.ir.types import TensorInfo, infer_tensor_info, weights_as_inputs

__all__ = ["ModelAccessor", "base", "empty_base", "current_accessor", "innermost_accessor", "calling",
           "custom_op_library", "building_on", "undefined_reads"]

_ACCESSORS: list[ModelAccessor] = []
_BLOCKS: list[object] = []  # the onnxblock blocks being called, innermost last (named in errors)


def undefined_reads(graph: onnx.GraphProto, start: int = 0) -> list[tuple[onnx.NodeProto, str]]:
    """(node, name) for each value a node of ``graph.node[start:]`` reads that no graph input, initializer or
    earlier node defines: a graph ONNX's checker rejects, and whose shape inference may crash the process."""
    defined = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    defined.update(t.values.name for t in graph.sparse_initializer)
    missing = []
    for k, node in enumerate(graph.node):
        if k >= start:
            missing += [(node, x) for x in node.input if x and x not in defined]
        defined.update(node.output)
    return missing


def _existing_values(graph: onnx.GraphProto) -> list[str]:
    return list(dict.fromkeys([*(v.name for v in graph.input), *(t.name for t in graph.initializer),
                               *(o for n in graph.node for o in n.output if o)]))


def check_defined(graph: onnx.GraphProto, who: str, start: int = 0) -> None:
    """ValueError naming ``who``, the value and the values that exist, if a node of ``graph.node[start:]`` reads
    a value the graph does not define (before it)."""
    missing = undefined_reads(graph, start)
    if not missing:
        return
    node, name = missing[0]
    existing = _existing_values(graph)
    close = difflib.get_close_matches(name, existing, n=3)
    later = any(name in n.output for n in graph.node)
    why = ("is computed only by a later node (the nodes must be in topological order)" if later else
           "is not a value of the model: no graph input, initializer or node output has that name")
    hint = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
    inputs = [v.name for v in graph.input]
    outputs = [v.name for v in graph.output]
    raise ValueError(f"{who} reads {name!r} (an input of its {node.op_type} node {node.name!r}), which {why}{hint}. "
                     f"The model's inputs are {inputs}, its outputs {outputs}; it has {len(existing)} values in all "
                     f"(e.g. {existing[-8:]}). Declare a new input first (model.graph.input.append(...), or a "
                     f"loss's target_name / labels_name, which the loss declares) or fix the name")


def _who() -> str:
    """The block being built, for errors: the innermost onnxblock block called, else the accessor's owner."""
    if _BLOCKS:
        return f"block {type(_BLOCKS[-1]).__name__}"
    accessor = _ACCESSORS[-1] if _ACCESSORS else None
    return accessor.owner if accessor is not None else "the model"


class _AccessorContext(BuildContext):
    """A build context whose value types follow the accessor's model, which users may edit at any time.
    ``defines(name)``: whether the model has that value (a graph input the user added, a node's output)."""

    defines: Callable[[str], bool] = staticmethod(lambda name: False)

    def require_input(self, name: str, elem_type: int, shape: Sequence | None) -> str:
        # only a value the model has needs its type inferred (a whole-model inference: 14 ms on a small
        # transformer); a fresh label name is declared as it is
        if name not in self.infos and self.reinfer is not None and self.defines(name):
            self.infos.update(self.reinfer(self))
        return super().require_input(name, elem_type, shape)


class ModelAccessor:
    """Holds the model being built; ``model`` returns it with every node built so far."""

    def __init__(self, model: onnx.ModelProto, model_path: str | os.PathLike | None = None,
                 infos: dict[str, TensorInfo] | None = None, owner: str = "the model"):
        self._model = model
        self._path = None if model_path is None else os.fspath(model_path)
        self.owner = owner
        opset = default_opset(model)
        if opset is None:
            raise ValueError("the base model imports no default-domain (ai.onnx) opset; add one with "
                             "model.opset_import.append(onnx.helper.make_opsetid('', 17))")
        self._flushed = (0, 0, 0)
        builder = GraphBuilder(opset, taken=used_names(model.graph))
        self.context = _AccessorContext(builder, {}, reinfer=lambda _ctx: self._infer())
        self.context.defines = self._defines
        self.context.infos = dict(infos) if infos is not None else self._infer()

    @property
    def path(self) -> str:
        """The path of the base model, as given to ``base(model, model_path)``."""
        if self._path is None:
            raise RuntimeError("The path to the onnx model was not set: pass it as onnxblock.base(model, model_path)")
        return self._path

    @property
    def has_path(self) -> bool:
        return self._path is not None

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

    def _defines(self, name: str) -> bool:
        graph = self.model.graph
        return (any(v.name == name for v in graph.input) or any(t.name == name for t in graph.initializer)
                or any(name in n.output for n in graph.node))

    def _infer(self) -> dict[str, TensorInfo]:
        """Value types of the model built so far; names the user added since (graph inputs) become taken."""
        model = self.model
        check_defined(model.graph, _who())  # ONNX's shape inference may crash the process on such a graph
        self.context.builder.take(used_names(model.graph))
        return infer_tensor_info(model)

    def check_block(self, block: object, start: int) -> None:
        """ValueError if a node the call of ``block`` added (from node ``start`` on) reads an undefined value."""
        check_defined(self.model.graph, f"block {type(block).__name__}", start)

    def infer_shapes(self) -> onnx.ModelProto:
        """ONNX shape inference over the model built so far (checked first: see :func:`check_defined`)."""
        model = self.model
        check_defined(model.graph, _who())
        return onnx.shape_inference.infer_shapes(model)

    def value_info(self, name: str) -> onnx.ValueInfoProto:
        """The type of ``name`` (tensor or sequence) from ONNX shape inference over the model built so far."""
        model = self.model
        for vi in model.graph.output:
            if vi.name == name:
                return copy.deepcopy(vi)
        check_defined(model.graph, _who())
        inferred = onnx.shape_inference.infer_shapes(weights_as_inputs(model), strict_mode=False)
        for vi in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
            if vi.name == name:
                return copy.deepcopy(vi)
        for init in model.graph.initializer:
            if init.name == name:
                return helper.make_tensor_value_info(name, init.data_type, list(init.dims))
        raise LookupError(f"The provided name {name} is not a graph value info or a graph output.")


def innermost_accessor() -> ModelAccessor | None:
    """The accessor of the innermost ``base``/``empty_base``/``building_on`` block, None outside of one."""
    return _ACCESSORS[-1] if _ACCESSORS else None


@contextlib.contextmanager
def calling(block: object) -> Iterator[None]:
    """``block`` is being built inside the ``with`` (the innermost one is named in errors)."""
    _BLOCKS.append(block)
    try:
        yield
    finally:
        _BLOCKS.pop()


def current_accessor() -> ModelAccessor:
    """The accessor of the innermost ``base``/``empty_base`` block; fails outside of one."""
    if not _ACCESSORS:
        raise RuntimeError("onnxblock blocks can only be built inside `with onnxblock.base(model):` or "
                           "`with onnxblock.empty_base():`")
    return _ACCESSORS[-1]


@contextlib.contextmanager
def base(model: onnx.ModelProto, model_path: str | os.PathLike | None = None) -> Iterator[ModelAccessor]:
    """Build blocks on top of a copy of ``model`` (the caller's model is left untouched).

    ``model_path``: the file ``model`` was loaded from (the peer's route for models over 2 GB, whose blocks
    checked the model through the file); recorded as ``accessor.path``. onnxtrain checks the model in memory.
    """
    if model is None:
        raise RuntimeError("Base onnx model cannot be None. Please use onnxblock.empty_base if you would like to "
                           "build a model from scratch.")
    if not isinstance(model, onnx.ModelProto):
        raise TypeError(f"onnxblock.base takes an onnx.ModelProto, got {type(model).__name__} (load a file with "
                        "onnx.load(path) and pass the path as model_path)")
    with building_on(copy.deepcopy(model), model_path=model_path) as accessor:
        yield accessor


@contextlib.contextmanager
def building_on(model: onnx.ModelProto, model_path: str | os.PathLike | None = None,
                infos: dict[str, TensorInfo] | None = None, owner: str = "the model") -> Iterator[ModelAccessor]:
    """Blocks build on ``model`` itself (not a copy) inside the ``with``: ``generate_artifacts`` builds its loss
    so, on the forward graph, so that an onnxblock loss reads and edits ``self.base`` as under the peer's
    ``onnxblock.base`` (``infos``: the types of the model's values, when known; ``owner``: named in errors)."""
    accessor = ModelAccessor(model, model_path, infos=infos, owner=owner)
    _ACCESSORS.append(accessor)
    try:
        yield accessor
    finally:
        _ACCESSORS.pop()


@contextlib.contextmanager
def custom_op_library(custom_op_library_path: str | os.PathLike) -> Iterator[None]:
    """The peer's registration of a custom-op library for the blocks inside the ``with``: refused, since onnxtrain's
    artifacts hold default-domain ONNX ops only and run on a stock onnxruntime, which has no such library."""
    if not os.path.exists(custom_op_library_path):
        raise RuntimeError(f"Custom op library path {custom_op_library_path} does not exist.")
    raise ValueError(f"onnxblock.custom_op_library({os.fspath(custom_op_library_path)!r}) is not supported: onnxtrain "
                     "artifacts use the default ONNX domain only, so that they run on any stock onnxruntime without a "
                     "custom-op library; write the loss with default-domain ops (onnxblock.blocks, onnxtrain.blocks)")
    yield  # pragma: no cover - never reached


OLDEST_RUNTIME_OPSET = 20  # onnxruntime 1.17, pyproject.toml's floor


@contextlib.contextmanager
def empty_base(opset_version: int | None = None) -> Iterator[ModelAccessor]:
    """Build blocks on an empty model (an optimizer graph, or a model written from scratch).

    ``opset_version`` None: the newest opset both the installed onnx package and the oldest supported onnxruntime
    know, with the lowest IR version that carries it, so that the artifacts load on any supported onnxruntime (the
    onnx package's own newest, opset 21 at IR 10 in onnx 1.16, fails to load on onnxruntime 1.17)."""
    opset = opset_version or min(onnx.defs.onnx_opset_version(), OLDEST_RUNTIME_OPSET)
    opsets = [helper.make_opsetid("", opset)]
    model = helper.make_model(helper.make_graph([], "onnxblock", [], []), producer_name="onnxtrain",
                              opset_imports=opsets, ir_version=helper.find_min_ir_version_for(opsets))
    with base(model) as accessor:
        yield accessor
