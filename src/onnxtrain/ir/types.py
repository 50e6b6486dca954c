"""Element types and shapes of the values of a graph, from ONNX shape inference."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

__all__ = ["TensorInfo", "value_info", "infer_tensor_info", "infer_from_inputs", "redeclare", "fresh_symbol",
           "np_dtype", "onnx_dtype", "weights_as_inputs", "FLOAT_TYPES", "info_from_type"]

FLOAT_TYPES = frozenset(
    {onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}
)

Dim = int | str | None


@dataclass(frozen=True)
class TensorInfo:
    """Element type (``onnx.TensorProto`` enum) and shape (ints, symbolic names or None) of one value."""

    elem_type: int
    shape: tuple[Dim, ...] | None

    @property
    def is_float(self) -> bool:
        return self.elem_type in FLOAT_TYPES

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    @property
    def static_shape(self) -> tuple[int, ...] | None:
        """The shape if every dimension is a known integer, else None."""
        if self.shape is None or not all(isinstance(d, int) for d in self.shape):
            return None
        return tuple(self.shape)  # type: ignore[arg-type]


def np_dtype(elem_type: int) -> np.dtype:
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))


def onnx_dtype(dtype: np.dtype | type) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def info_from_type(tp: onnx.TypeProto) -> TensorInfo | None:
    """The element type and shape a TypeProto declares (None for a sequence, map or optional type)."""
    if not tp.HasField("tensor_type"):
        return None
    tt = tp.tensor_type
    shape = None
    if tt.HasField("shape"):
        shape = tuple(
            d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim
        )
    return TensorInfo(tt.elem_type, shape)


def value_info(name: str, info: TensorInfo | None) -> onnx.ValueInfoProto:
    """A graph input/output declaration for ``name``; type and shape left open when ``info`` is None."""
    if info is None:
        return helper.make_tensor_value_info(name, onnx.TensorProto.UNDEFINED, None)
    return helper.make_tensor_value_info(name, info.elem_type, info.shape)


def infer_tensor_info(model: onnx.ModelProto) -> dict[str, TensorInfo]:
    """Run ONNX shape inference (without changing ``model``) and map every typed value name to its info.

    Sizes ONNX inference leaves unknown but that follow from the inputs' (a Reshape's -1 from the element count, a
    convolution's output from its input's, a Slice to a length read from a shape) are filled in
    (:mod:`onnxtrain.ir.symbolic`), and inference runs again from there, so that what follows knows them too.
    """
    from onnxtrain.ir import symbolic  # it builds on TensorInfo: imported here, not at the top

    model = weights_as_inputs(model)
    infos = _infer_once(model)
    given, constants = symbolic.input_symbols(model.graph), symbolic.integer_constants(model.graph)
    solved: dict[str, TensorInfo] = {}
    # Each round solves the nodes whose inputs the previous one made known: a transformer layer's heads' split,
    # then their merge after the attention product, then the next layer's split (its input's batch axis comes
    # from a residual Add of the layer's input and the merge), and so on. A round that names nothing new ends it;
    # the bound only guards against solutions that would alternate.
    for _ in range(sum(n.op_type in symbolic.SOLVED for n in model.graph.node) + 1):
        found = symbolic.solve(model.graph, infos, constants)
        new = {k: v for k, v in found.items()
               if k not in solved or symbolic.without_fresh(solved[k], given) != symbolic.without_fresh(v, given)}
        if not new:
            break
        solved.update(new)
        # declared with the symbols of the inference they came from: ONNX makes its fresh symbols avoid the
        # declared ones, so none is given to another dimension
        infos = _infer_declared(model, solved)
    return infos


LARGE_WEIGHT = 1024  # elements: float initializers above this are declared as inputs for inference


def weights_as_inputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` for shape inference: a copy whose large float initializers are graph inputs of their type and
    shape, or ``model`` itself when it has none.

    Inference reads the values of integer tensors (shapes) and of small float ones (Resize's scales, Range's
    bounds), never those of weights; but every inference serializes the model to the C++ side and back, weights
    included: a 90 MB BERT took 7.4 s to infer with its weights inline against 0.3 s without (the solvers'
    rounds infer again and again). The infos are the same: an initializer's come from its dims either way.
    """
    graph = model.graph
    large = {i.name for i in graph.initializer
             if i.data_type in FLOAT_TYPES and int(np.prod(i.dims, dtype=np.int64)) > LARGE_WEIGHT}
    if not large:
        return model
    view = onnx.ModelProto(ir_version=model.ir_version)
    view.opset_import.extend(model.opset_import)
    view.functions.extend(model.functions)
    out = view.graph
    out.name = graph.name
    out.node.extend(graph.node)
    declared = {i.name for i in graph.input}   # below IR 4 an initializer may be a graph input too
    out.input.extend(graph.input)
    out.input.extend(helper.make_tensor_value_info(i.name, i.data_type, list(i.dims)) for i in graph.initializer
                     if i.name in large and i.name not in declared)
    out.initializer.extend(i for i in graph.initializer if i.name not in large)
    out.sparse_initializer.extend(graph.sparse_initializer)
    out.output.extend(graph.output)
    out.value_info.extend(graph.value_info)
    return view


def _infer_declared(model: onnx.ModelProto, declared: dict[str, TensorInfo]) -> dict[str, TensorInfo]:
    """Inference with ``declared`` as the value infos of those values (in place of the model's own, which are
    put back after)."""
    graph = model.graph
    saved = [vi.SerializeToString() for vi in graph.value_info]
    kept = [onnx.ValueInfoProto.FromString(b) for b in saved]
    own = {vi.name: info_from_type(vi.type) for vi in kept if vi.name in declared}
    del graph.value_info[:]
    graph.value_info.extend(vi for vi in kept if vi.name not in declared)
    graph.value_info.extend(value_info(name, _over(info, own.get(name))) for name, info in declared.items())
    try:
        return _infer_once(model)
    finally:
        del graph.value_info[:]
        graph.value_info.extend(onnx.ValueInfoProto.FromString(b) for b in saved)


def fresh_symbol(dim: Dim, given: set[str] | frozenset[str] = frozenset()) -> bool:
    """Whether ``dim`` is a symbol ONNX inference made up (``unk__N``, not one of ``given``, the graph inputs'):
    it names a size only within one inference, and the next may give it to another size."""
    return isinstance(dim, str) and dim.startswith("unk__") and dim not in given


def _over(solution: TensorInfo, own: TensorInfo | None) -> TensorInfo:
    """A solver's ``solution`` laid over the model's ``own`` declaration of the same value: where the solution
    has only inference's fresh symbol (or nothing), the model's size stays (an exporter's name for a size the
    solvers could not derive is better than none)."""
    if own is None or own.shape is None or solution.shape is None or len(own.shape) != len(solution.shape):
        return solution
    unknown = lambda d: d is None or fresh_symbol(d)  # noqa: E731
    return TensorInfo(solution.elem_type, tuple(o if unknown(d) and not unknown(o) else d
                                                for d, o in zip(solution.shape, own.shape)))


# Ops ONNX inference gives no output type (their schemas have no inference function, as of onnx 1.23), whose
# output has the type and shape of input 0. Without this, every value after one (a GroupNormalization-18/21
# before a Conv) would be untyped and no gradient rule could read it.
SHAPE_OF_INPUT = frozenset({"GroupNormalization", "MeanVarianceNormalization"})


def _infer_once(model: onnx.ModelProto) -> dict[str, TensorInfo]:
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    for _ in range(sum(n.op_type in SHAPE_OF_INPUT for n in model.graph.node)):
        if not _declare_shape_of_input(inferred.graph):
            break
        inferred = onnx.shape_inference.infer_shapes(inferred, strict_mode=False, data_prop=True)
    return _infos(inferred.graph)


def _declare_shape_of_input(graph: onnx.GraphProto) -> bool:
    """Declare (a value info) each untyped output of a SHAPE_OF_INPUT node with its typed input 0's type;
    whether any was."""
    outputs = {o.name for o in graph.output}
    typed = {vi.name: vi.type for vi in [*graph.input, *graph.value_info, *graph.output]
             if (info := info_from_type(vi.type)) is not None and (info.shape is not None or vi.name in outputs)}
    typed.update({t.name: onnx.helper.make_tensor_type_proto(t.data_type, list(t.dims)) for t in graph.initializer})
    declared = False
    for node in graph.node:
        if (node.op_type in SHAPE_OF_INPUT and node.domain in ("", "ai.onnx") and node.input
                and node.input[0] in typed and node.output and node.output[0] not in typed):
            graph.value_info.append(onnx.helper.make_value_info(node.output[0], typed[node.input[0]]))
            typed[node.output[0]] = typed[node.input[0]]
            declared = True
    return declared


def _infos(g: onnx.GraphProto) -> dict[str, TensorInfo]:
    infos: dict[str, TensorInfo] = {}
    for init in g.initializer:
        infos[init.name] = TensorInfo(init.data_type, tuple(init.dims))
    for vi in [*g.input, *g.value_info, *g.output]:
        info = info_from_type(vi.type)
        if info is not None and (vi.name not in infos or infos[vi.name].shape is None):
            infos[vi.name] = info
    return infos


def infer_from_inputs(model: onnx.ModelProto) -> tuple[dict[str, TensorInfo], dict[str, TensorInfo]]:
    """Shape inference from the graph's inputs and initializers, the model's declared shapes (value infos and
    outputs) filling in only what it cannot tell; returns the infos and the declarations it contradicts, corrected
    (``model`` is left as it was).

    A declaration is not evidence: torch's dynamo exporter declares some values with the sizes of its example
    inputs (a recurrent layer's output over a dynamic sequence, for one), an export given dynamic axes for its
    inputs only may declare static outputs, and a gradient rule that took such a size for static would silently
    compute the wrong gradient at any other size. Where inference finds one of the inputs' dynamic dimensions
    (or another size, or a size :mod:`onnxtrain.ir.symbolic` named) and the declaration has a static size or
    another name (the dynamo exporter's ``Min(32, s27)`` for a slice to the sequence), the inferred dimension
    wins. Where inference finds nothing (a dimension it cannot compute), the declaration is kept; if a declaration
    filled in such a dimension, or inference from the inputs alone leaves the rank of a node's output unknown, it
    runs again with the (corrected) declarations, which it then builds on, as ``infer_tensor_info`` does.
    """
    model = weights_as_inputs(model)
    graph = model.graph
    if not graph.value_info and not any(o.type.tensor_type.HasField("shape") for o in graph.output
                                        if o.type.HasField("tensor_type")):
        return infer_tensor_info(model), {}
    # the declarations are taken out of ``model`` for the inference and put back after it (a copy of the model
    # would copy its constant weights too)
    saved = [vi.SerializeToString() for vi in graph.value_info]
    shaped = {k: o.type.tensor_type.shape.SerializeToString() for k, o in enumerate(graph.output)
              if o.type.HasField("tensor_type") and o.type.tensor_type.HasField("shape")}
    del graph.value_info[:]
    for k in shaped:
        graph.output[k].type.tensor_type.ClearField("shape")
    try:
        inferred = infer_tensor_info(model)
    finally:
        graph.value_info.extend(onnx.ValueInfoProto.FromString(b) for b in saved)
        for k, shape in shaped.items():
            graph.output[k].type.tensor_type.shape.ParseFromString(shape)  # a scalar's empty shape too
    outputs = {o.name for o in graph.output}
    declares = [vi for vi in [*graph.value_info, *graph.output]
                if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape")]
    symbols = {d.dim_param for i in graph.input if i.type.HasField("tensor_type")
               for d in i.type.tensor_type.shape.dim if d.dim_param}
    infos, corrected, filled = dict(inferred), {}, False
    for vi in declares:
        declared = info_from_type(vi.type)
        if declared is None:
            continue
        # the graph's outputs keep the names their exporter gave them (the artifacts' outputs show them)
        merged, contradicted = _merge(inferred.get(vi.name), declared, symbols, names=vi.name not in outputs)
        infos[vi.name] = merged
        filled |= merged != inferred.get(vi.name)
        if contradicted:
            corrected[vi.name] = merged
    # a declaration that told inference something new is told to the values computed from it too (the dynamo
    # exporter declares a causal mask's Expand, not the Where that reads it)
    if not filled and all(o in infos and infos[o].rank is not None for n in graph.node for o in n.output if o):
        return infos, corrected
    if not corrected:  # the declarations as they are
        return infer_tensor_info(model), corrected
    declared = onnx.ModelProto()
    declared.CopyFrom(model)
    redeclare(declared.graph, corrected)
    return infer_tensor_info(declared), corrected


def redeclare(graph: onnx.GraphProto, infos: dict[str, TensorInfo]) -> None:
    """Give the value infos and outputs of ``graph`` named in ``infos`` their shapes, in place (the rest of each
    declaration, its exporter's metadata included, is kept)."""
    for vi in [*graph.value_info, *graph.output]:
        info = infos.get(vi.name)
        if info is None or info.shape is None:
            continue
        shape = vi.type.tensor_type.shape
        del shape.dim[:]
        for size in info.shape:
            dim = shape.dim.add()
            if isinstance(size, int):
                dim.dim_value = size
            elif size is not None:
                dim.dim_param = size


def _merge(derived: TensorInfo | None, declared: TensorInfo, symbols: set[str],
           names: bool = True) -> tuple[TensorInfo, bool]:
    """(the info of one value from its derived and declared infos, whether the declaration is contradicted: by a
    static size, or with ``names`` by another name too)."""
    if derived is None or derived.shape is None:
        return declared, False
    elem_type = derived.elem_type or declared.elem_type
    if declared.shape is None:
        return TensorInfo(elem_type, derived.shape), False
    if len(declared.shape) != len(derived.shape):
        return TensorInfo(elem_type, derived.shape), True
    # a symbol of the exporter's own on two axes says they are equal, which nothing checks (the TorchScript
    # exporter, given dynamic axes for the inputs only, declared a Conv1d's [batch, C, time] output as
    # ['Convout_dim_0', 8, 'Convout_dim_0']): those axes stay unknown
    # (an expression of the inputs' sizes, dynamo's square attention mask '((s27//10)) - 1' twice, is kept)
    repeated = {d for d in declared.shape if isinstance(d, str) and d.isidentifier() and d not in symbols
                and declared.shape.count(d) > 1}
    dims, contradicted = [], False
    for found, said in zip(derived.shape, declared.shape):
        if said in repeated:
            dims.append(None if fresh_symbol(found, symbols) else found)
            contradicted = True
            continue
        # an input's symbol, or a size the solvers named from them (ir.symbolic), is as good as a number
        if found is not None and not fresh_symbol(found, symbols):
            # a static size, or another name for the size (dynamo's ``Min(32, s27)`` for a slice to ``s27``)
            contradicted |= said is not None and said != found and (names or isinstance(said, int))
            dims.append(found)
        else:  # inference could not tell (None, or a symbol it made up): the declaration's
            dims.append(said if said is not None else found)
    return TensorInfo(elem_type, tuple(dims)), contradicted
