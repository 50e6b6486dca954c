"""Element types and shapes of the values of a graph, from ONNX shape inference."""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

__all__ = ["TensorInfo", "value_info", "infer_tensor_info", "infer_from_inputs", "redeclare", "solve_reshapes",
           "solve_windows",
           "np_dtype", "onnx_dtype", "FLOAT_TYPES"]

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


def _info_from_type(tp: onnx.TypeProto) -> TensorInfo | None:
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

    A Reshape's output dimension that ONNX inference leaves unknown but that the element count determines is
    filled in (:func:`solve_reshapes`), and inference runs again from there, so that what follows knows it too.
    """
    infos = _infer_once(model)
    solved: dict[str, TensorInfo] = {}
    # Each round solves the Reshapes whose inputs the previous one made known: a transformer layer's heads'
    # split, then their merge after the attention product, then the next layer's split (its input's batch axis
    # comes from a residual Add of the layer's input and the merge), and so on.
    for _ in range(sum(n.op_type == "Reshape" for n in model.graph.node) + 1):
        found = {**solve_windows(model.graph, infos), **solve_reshapes(model.graph, infos)}
        new = {k: v for k, v in found.items() if solved.get(k) != v}
        if not new:
            break
        solved.update(new)
        # declared with the symbols of the inference they came from: ONNX makes its fresh symbols avoid the
        # declared ones, so none is given to another dimension
        infos = _infer_declared(model, solved)
    return infos



def solve_reshapes(graph: onnx.GraphProto, infos: dict[str, TensorInfo]) -> dict[str, TensorInfo]:
    """The outputs of ``graph``'s Reshapes whose one unknown dimension follows from the element count.

    Exporters write a reshape's target with a -1 or with sizes computed at run time (transformers' attention:
    ``view(*batch_and_sequence, -1, head_size)``), and ONNX inference gives such a dimension a fresh symbol even
    when the input's symbols cancel out: (b, s, 384) -> (b, s, ?, 32) has ? = 12 at every b and s. A dimension
    left unknown that way made the heads' axis of the attention product a different symbol for its two operands,
    and their gradients reduced over it at run time (a full copy each). The same happens to the batch axis when
    the target's batch size is computed at run time: (b, 64, 128) -> (?, 64, 4, 32) has ? = b. Solved: exactly
    one output dimension is unknown after the symbols the input and output share are cancelled, and the input
    has none left over (the size is the quotient of the known sizes) or one, with the known sizes equal (the
    size is that symbol, when it is one of the graph inputs' symbols). Symbols compare by name, which within one
    inference means equal sizes; sizes are taken to be nonzero, as a reshape's -1 needs.
    """
    # the inputs' symbols: one of inference's own (unk__N) may name another dimension in the next round
    given = {d.dim_param for i in graph.input for d in i.type.tensor_type.shape.dim if d.dim_param}
    solved: dict[str, TensorInfo] = {}
    for node in graph.node:
        if node.op_type != "Reshape" or node.domain not in ("", "ai.onnx"):
            continue
        source, target = infos.get(node.input[0]), infos.get(node.output[0])
        if source is None or target is None or source.shape is None or target.shape is None:
            continue
        if target.static_shape is not None or any(d is None for d in source.shape):
            continue
        left = collections.Counter(d for d in source.shape if isinstance(d, str))
        right = collections.Counter(d for d in target.shape if not isinstance(d, int))
        shared = left & right
        left, right = left - shared, right - shared
        if sum(left.values()) > 1 or sum(right.values()) != 1:
            continue
        unknown = next(iter(right))
        if unknown in shared:  # a symbol the input has once and the output twice: not one unknown size
            continue
        known_in = math.prod(d for d in source.shape if isinstance(d, int))
        known_out = math.prod(d for d in target.shape if isinstance(d, int))
        if known_in == 0 or known_out == 0:
            continue
        if left:  # one symbol left over: the unknown is that symbol when the known sizes match
            size = next(iter(left))
            if known_in != known_out or size not in given:
                continue
        elif known_in % known_out:
            continue
        else:
            size = known_in // known_out
        solved[node.output[0]] = TensorInfo(target.elem_type, tuple(size if d == unknown else d for d in target.shape))
    return solved


# A spatial size computed from an input's symbol by convolutions and pools: floor((base + offset) / stride).
_Window = tuple[str, int, int]

_WINDOWED = frozenset({"Conv", "MaxPool", "AveragePool", "LpPool"})
_BROADCASTING = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "Where", "PRelu"})


def _window_name(size: _Window) -> str:
    base, offset, stride = size
    if stride == 1:
        return base if offset == 0 else f"{base}{offset:+d}"
    return f"floor(({base}{offset:+d})/{stride})" if offset else f"floor({base}/{stride})"


def _window_attrs(node: onnx.NodeProto, kernel: tuple) -> list[tuple[int, int]] | None:
    """(offset, stride) per spatial axis with out = floor((in + offset) / stride), or None (a padding mode or a
    ceil mode this does not follow)."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    rank = len(kernel)
    if attrs.get("ceil_mode", 0) or any(not isinstance(k, int) for k in kernel):
        return None
    strides = list(attrs.get("strides", [1] * rank))
    dilations = list(attrs.get("dilations", [1] * rank))
    auto_pad = attrs.get("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        return [(s - 1, s) for s in strides]  # ceil(in / s)
    pads = list(attrs.get("pads", [0] * 2 * rank)) if auto_pad == "NOTSET" else [0] * 2 * rank
    if auto_pad not in ("NOTSET", "VALID") or len(pads) != 2 * rank or len(strides) != rank:
        return None
    # floor((in + pads - d (k - 1) - 1) / s) + 1
    return [(pads[i] + pads[i + rank] - dilations[i] * (kernel[i] - 1) - 1 + strides[i], strides[i])
            for i in range(rank)]


def solve_windows(graph: onnx.GraphProto, infos: dict[str, TensorInfo]) -> dict[str, TensorInfo]:
    """The outputs of ``graph``'s convolutions and pools (and of the broadcasting ops that join them) whose
    spatial sizes follow from an input's symbol, named after it: ``floor((height+1)/2)``.

    ONNX inference gives a convolution's output a fresh symbol for each spatial axis of run-time size, even for a
    3x3 convolution with padding 1, whose output has its input's size. Two branches of a residual block then
    have different symbols, and the gradient of the Add that joins them reduced over its spatial axes at run time
    (a copy of the activation per Add and step, and the nodes that compute the axes). The size is
    floor((in + offset) / stride), and a chain of them is one such floor, so equal sizes get equal names:
    floor((floor((h + a) / s) + b) / t) = floor((h + a + b s) / (s t)). A Conv's padding mode (explicit pads,
    VALID, SAME_*) is followed; ceil_mode pools are left alone.
    """
    given = {d.dim_param for i in graph.input for d in i.type.tensor_type.shape.dim if d.dim_param}
    windows: dict[str, _Window] = {symbol: (symbol, 0, 1) for symbol in given}
    solved: dict[str, TensorInfo] = {}

    def window(dim) -> _Window | None:
        return windows.get(dim) if isinstance(dim, str) else None

    def settle(name: str, shape: tuple, sizes: dict[int, _Window]) -> None:
        """Name the dimensions ``sizes`` of ``name``; the fresh symbols they replace mean the same sizes."""
        new = list(shape)
        for axis, size in sizes.items():
            if isinstance(shape[axis], str) and shape[axis] not in windows:
                windows[shape[axis]] = size
            new[axis] = _window_name(size)
            windows[new[axis]] = size
        if tuple(new) != tuple(shape):
            solved[name] = TensorInfo(infos[name].elem_type, tuple(new))

    for node in graph.node:
        if node.domain not in ("", "ai.onnx") or not node.output or node.output[0] not in infos:
            continue
        out = infos[node.output[0]].shape
        if out is None:
            continue
        if node.op_type in _WINDOWED:
            source = infos.get(node.input[0])
            if source is None or source.shape is None or len(source.shape) != len(out) or len(out) < 3:
                continue
            kernel = None
            for a in node.attribute:
                if a.name == "kernel_shape":
                    kernel = tuple(a.ints)
            if kernel is None and node.op_type == "Conv" and len(node.input) > 1 and node.input[1] in infos:
                weight = infos[node.input[1]].shape
                kernel = tuple(weight[2:]) if weight is not None else None
            steps = _window_attrs(node, kernel) if kernel is not None and len(kernel) == len(out) - 2 else None
            if steps is None:
                continue
            sizes = {}
            for axis, (offset, stride) in enumerate(steps, start=2):
                size = window(source.shape[axis])
                if size is not None and not isinstance(out[axis], int):
                    base, a, s = size
                    sizes[axis] = (base, a + offset * s, s * stride)
            settle(node.output[0], out, sizes)
        elif node.op_type in _BROADCASTING:
            shapes = [infos[i].shape for i in node.input if i and i in infos]
            if len(shapes) != len([i for i in node.input if i]) or any(sh is None for sh in shapes):
                continue
            sizes = {}
            for axis in range(len(out)):
                if isinstance(out[axis], int):
                    continue
                back = len(out) - axis
                dims = [sh[len(sh) - back] for sh in shapes if len(sh) >= back]
                dims = [d for d in dims if d != 1]
                found = {window(d) for d in dims}
                if len(found) == 1 and None not in found and dims:
                    sizes[axis] = found.pop()
            settle(node.output[0], out, sizes)
        else:  # an op that keeps its input's symbols keeps their windows
            continue
    return solved


def _infer_declared(model: onnx.ModelProto, declared: dict[str, TensorInfo]) -> dict[str, TensorInfo]:
    """Inference with ``declared`` as the value infos of those values (in place of the model's own, which are
    put back after)."""
    graph = model.graph
    saved = [vi.SerializeToString() for vi in graph.value_info]
    kept = [onnx.ValueInfoProto.FromString(b) for b in saved]
    del graph.value_info[:]
    graph.value_info.extend(vi for vi in kept if vi.name not in declared)
    graph.value_info.extend(value_info(name, info) for name, info in declared.items())
    try:
        return _infer_once(model)
    finally:
        del graph.value_info[:]
        graph.value_info.extend(onnx.ValueInfoProto.FromString(b) for b in saved)


def _infer_once(model: onnx.ModelProto) -> dict[str, TensorInfo]:
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    g = inferred.graph
    infos: dict[str, TensorInfo] = {}
    for init in g.initializer:
        infos[init.name] = TensorInfo(init.data_type, tuple(init.dims))
    for vi in [*g.input, *g.value_info, *g.output]:
        info = _info_from_type(vi.type)
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
    (or another size) and the declaration has a static size, the inferred dimension wins. Where inference finds
    nothing (a dimension it cannot compute), the declaration is kept; if inference from the inputs alone leaves
    the rank of a node's output unknown, it runs again with the (corrected) declarations, which it then builds
    on, as ``infer_tensor_info`` does.
    """
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
    declares = [vi for vi in [*graph.value_info, *graph.output]
                if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape")]
    symbols = {d.dim_param for i in graph.input if i.type.HasField("tensor_type")
               for d in i.type.tensor_type.shape.dim if d.dim_param}
    infos, corrected = dict(inferred), {}
    for vi in declares:
        declared = _info_from_type(vi.type)
        if declared is None:
            continue
        merged, contradicted = _merge(inferred.get(vi.name), declared, symbols)
        infos[vi.name] = merged
        if contradicted:
            corrected[vi.name] = merged
    if all(o in infos and infos[o].rank is not None for n in graph.node for o in n.output if o):
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


def _merge(derived: TensorInfo | None, declared: TensorInfo, symbols: set[str]) -> tuple[TensorInfo, bool]:
    """(the info of one value from its derived and declared infos, whether the declaration is contradicted)."""
    if derived is None or derived.shape is None:
        return declared, False
    elem_type = derived.elem_type or declared.elem_type
    if declared.shape is None:
        return TensorInfo(elem_type, derived.shape), False
    if len(declared.shape) != len(derived.shape):
        return TensorInfo(elem_type, derived.shape), True
    dims, contradicted = [], False
    for found, said in zip(derived.shape, declared.shape):
        if isinstance(found, int) or (isinstance(found, str) and found in symbols):
            contradicted |= isinstance(said, int) and said != found
            dims.append(found)
        else:  # inference could not tell (None, or a symbol it made up): the declaration's
            dims.append(said if said is not None else found)
    return TensorInfo(elem_type, tuple(dims)), contradicted
