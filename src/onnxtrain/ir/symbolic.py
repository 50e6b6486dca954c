"""Sizes ONNX shape inference leaves unknown but that follow from the graph inputs' sizes.

ONNX inference gives a fresh symbol (``unk__N``) to every dimension it cannot compute. Where two of them meet in a
broadcasting op, a gradient cannot know whether one side was broadcast and reduces over the axes that differ at
run time (Shape, Equal, NonZero and a ReduceSum that copies the whole tensor when nothing was broadcast). Each
solver here names such dimensions from what the graph computes; :func:`onnxtrain.ir.types.infer_tensor_info`
declares the names and runs inference again, round after round.

Names are the inputs' symbols, numbers, the convolution sizes :func:`solve_windows` makes (``floor((height+1)/2)``)
and products of those (``2*batch``, ``batch*sequence``), each size spelled one way only, so that equal names mean
equal sizes and the reverse. A fresh symbol is never part of a solution: the next round may give it to another
size.
"""

from __future__ import annotations

import ast
import collections
import math
import re

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnxtrain.ir.passes import constant_values
from onnxtrain.ir.types import Dim, TensorInfo, fresh_symbol

__all__ = ["solve", "solve_reshapes", "solve_windows", "solve_computed_shapes", "input_symbols", "integer_constants",
           "without_fresh", "canonical_name", "SOLVED", "ShapeValue"]


def solve(graph: onnx.GraphProto, infos: dict[str, TensorInfo],
          constants: dict[str, ShapeValue] | None = None) -> dict[str, TensorInfo]:
    """Every solver's findings for one round of inference results ``infos`` (``constants``: the graph's
    :func:`integer_constants`, computed once for several rounds)."""
    return {**solve_computed_shapes(graph, infos, constants), **solve_windows(graph, infos, constants),
            **solve_reshapes(graph, infos)}


def input_symbols(graph: onnx.GraphProto) -> set[str]:
    """The symbols of ``graph``'s inputs: they keep their meaning from one round of inference to the next."""
    return {d.dim_param for i in graph.input if i.type.HasField("tensor_type")
            for d in i.type.tensor_type.shape.dim if d.dim_param}


def without_fresh(info: TensorInfo, given: set[str] | frozenset[str] = frozenset()) -> TensorInfo:
    """``info`` with the symbols ONNX inference made up left unknown: what the next inference keeps of it when
    declared (a declared fresh symbol would override the one inference finds)."""
    if info.shape is None:
        return info
    return TensorInfo(info.elem_type, tuple(None if fresh_symbol(d, given) else d for d in info.shape))


def canonical_name(size: str, given: set[str] | frozenset[str]) -> str:
    """``size``, an exporter's expression of a graph input's symbol, in the spelling the solvers use, so that the
    same size has one name: torch's dynamo exporter declares ``((s27//10)) - 1`` for what :func:`solve_windows`
    calls ``floor((s27-10)/10)``. Sums with integers, floor divisions by integers and parentheses are read;
    anything else (and a symbol not in ``given``) is returned as it is."""
    if size in given or not any(c in size for c in "+-/"):
        return size
    try:
        tree = ast.parse(size, mode="eval").body
    except (SyntaxError, ValueError):
        return size
    window = _window_of(tree, given)
    return size if window is None else _window_name(window)


def _window_of(tree: ast.AST, given) -> _Window | None:
    """(base, offset, stride) with ``tree`` = floor((base + offset) / stride), or None."""
    if isinstance(tree, ast.Name):
        return (tree.id, 0, 1) if tree.id in given else None
    if not isinstance(tree, ast.BinOp):
        return None
    left, right = tree.left, tree.right
    if isinstance(tree.op, ast.Add) and _is_int(left):
        left, right = right, left
    if not _is_int(right):
        return None
    inner = _window_of(left, given)
    if inner is None:
        return None
    base, offset, stride = inner
    if isinstance(tree.op, ast.FloorDiv) and right.value > 0:
        return base, offset, stride * right.value  # floor(floor(x / s) / c) = floor(x / (s c))
    if isinstance(tree.op, (ast.Add, ast.Sub)):
        step = right.value if isinstance(tree.op, ast.Add) else -right.value
        return base, offset + step * stride, stride  # floor(x / s) + k = floor((x + k s) / s)
    return None


def _is_int(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int


def solve_reshapes(graph: onnx.GraphProto, infos: dict[str, TensorInfo]) -> dict[str, TensorInfo]:
    """The outputs of ``graph``'s Reshapes whose one unknown dimension follows from the element count.

    Exporters write a reshape's target with a -1 or with sizes computed at run time (transformers' attention:
    ``view(*batch_and_sequence, -1, head_size)``), and ONNX inference gives such a dimension a fresh symbol even
    when the input's symbols cancel out: (b, s, 384) -> (b, s, ?, 32) has ? = 12 at every b and s. A dimension
    left unknown that way made the heads' axis of the attention product a different symbol for its two operands,
    and their gradients reduced over it at run time (a full copy each). The same happens to the batch axis when
    the target's batch size is computed at run time: (b, 64, 128) -> (?, 64, 4, 32) has ? = b; and DeBERTa merges
    batch and heads, (b, 2, s, 8) -> (?, s, 8) with ? = 2*b, and splits them again.

    Solved: exactly one output dimension is unknown (a fresh symbol), and the element count divided by the other
    output sizes is a product of an integer and the input's symbols (:func:`_quotient`), named ``2*b`` when it is
    not one symbol or number. Sizes are taken to be nonzero, as a reshape's -1 needs.
    """
    given = input_symbols(graph)
    solved: dict[str, TensorInfo] = {}
    for node in graph.node:
        if node.op_type != "Reshape" or node.domain not in ("", "ai.onnx"):
            continue
        source, target = infos.get(node.input[0]), infos.get(node.output[0])
        if source is None or target is None or source.shape is None or target.shape is None:
            continue
        unknown = [k for k, d in enumerate(target.shape) if d is None or fresh_symbol(d, given)]
        if len(unknown) != 1:
            continue
        size = _quotient(source.shape, [d for k, d in enumerate(target.shape) if k != unknown[0]], given)
        if size is not None:
            shape = list(target.shape)
            shape[unknown[0]] = size
            solved[node.output[0]] = TensorInfo(target.elem_type, tuple(shape))
    return solved


# A size as a product: an integer times symbols (with their powers).
_Monomial = tuple[int, collections.Counter]


def _monomial(dim: Dim, given: set[str]) -> _Monomial | None:
    """``dim`` as a product, or None for an unknown size (None, or a symbol of inference's own)."""
    if isinstance(dim, int):
        return dim, collections.Counter()
    if dim is None or fresh_symbol(dim, given):
        return None
    if dim in given or "*" not in dim:
        return 1, collections.Counter([dim])
    coefficient, symbols = 1, collections.Counter()
    for part in _factors(dim):  # a product this module named, or an exporter's expression
        if part.isdigit():
            coefficient *= int(part)
        elif part and not fresh_symbol(part, given):
            symbols[part] += 1
        else:
            return None
    return coefficient, symbols


def _top_level(text: str) -> list[tuple[int, str]]:
    """The (position, character) pairs of ``text`` outside parentheses and brackets."""
    depth, outside = 0, []
    for k, c in enumerate(text):
        if c in "([":
            depth += 1
        elif c in ")]":
            depth -= 1
        elif depth == 0:
            outside.append((k, c))
    return outside


def _factors(dim: str) -> list[str]:
    """``dim``'s factors: split at the ``*`` outside parentheses, a sum or a quotient (torch.export's
    ``8*(((s53 - 1)//32)) + 8``) as one factor, the parentheses around a factor that needs them dropped."""
    if _needs_parentheses(dim) or "**" in dim:
        return [dim]
    cuts = [k for k, c in _top_level(dim) if c == "*"]
    parts = [dim[a + 1:b].strip() for a, b in zip([-1, *cuts], [*cuts, len(dim)])]
    return [p[1:-1] if p.startswith("(") and not _top_level(p) and _needs_parentheses(p[1:-1]) else p
            for p in parts]


def _needs_parentheses(factor: str) -> bool:
    """Whether ``factor`` must be parenthesized in a product (a sum or a quotient)."""
    return any(c in "+-/%" for _, c in _top_level(factor))


def _quotient(numerator, denominator, given: set[str]) -> Dim:
    """prod(numerator) / prod(denominator) as a size (a number, a symbol, or a product named ``2*b``), or None when
    a size is unknown or the quotient is not such a product."""
    top = [_monomial(d, given) for d in numerator]
    bottom = [_monomial(d, given) for d in denominator]
    if None in top or None in bottom:
        return None
    coefficient = math.prod(c for c, _ in top)
    divisor = math.prod(c for c, _ in bottom)
    symbols = sum((s for _, s in top), collections.Counter())
    below = sum((s for _, s in bottom), collections.Counter())
    if coefficient == 0 or divisor == 0 or coefficient % divisor or below - symbols:
        return None
    coefficient //= divisor
    symbols.subtract(below)
    names = sorted(symbols.elements())
    if not names:
        return coefficient
    if coefficient == 1 and len(names) == 1:
        return names[0]
    names = [f"({n})" if _needs_parentheses(n) else n for n in names]
    return "*".join([str(coefficient)] * (coefficient != 1) + names)


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


def solve_windows(graph: onnx.GraphProto, infos: dict[str, TensorInfo],
                  constants: dict[str, ShapeValue] | None = None) -> dict[str, TensorInfo]:
    """The outputs of ``graph``'s convolutions and pools (and of the broadcasting ops that join them, and of
    Slices that trim them by constants) whose spatial sizes follow from an input's symbol, named after it:
    ``floor((height+1)/2)``.

    ONNX inference gives a convolution's output a fresh symbol for each spatial axis of run-time size, even for a
    3x3 convolution with padding 1, whose output has its input's size. Two branches of a residual block then
    have different symbols, and the gradient of the Add that joins them reduced over its spatial axes at run time
    (a copy of the activation per Add and step, and the nodes that compute the axes). The size is
    floor((in + offset) / stride), and a chain of them is one such floor, so equal sizes get equal names:
    floor((floor((h + a) / s) + b) / t) = floor((h + a + b s) / (s t)). A Conv's padding mode (explicit pads,
    VALID, SAME_*) is followed; ceil_mode pools are left alone. A Slice by constants that drops ``c`` elements
    of such a size (wav2vec2's positional convolution, padded by half its even kernel, then ``[..., :-1]``) leaves
    floor((in + offset - c stride) / stride), taking the size to be above ``c``.
    """
    if not any(n.op_type in _WINDOWED for n in graph.node):
        return {}
    given = input_symbols(graph)
    constants = integer_constants(graph) if constants is None else constants
    windows: dict[str, _Window] = {symbol: (symbol, 0, 1) for symbol in given}
    solved: dict[str, TensorInfo] = {}

    def window(dim) -> _Window | None:
        if _is_padded_size(dim) and dim not in windows:
            windows[dim] = (dim, 0, 1)
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
        elif node.op_type == "Slice":
            source = infos.get(node.input[0])
            if source is None or source.shape is None or len(source.shape) != len(out):
                continue
            sizes = {}
            for axis, dropped in _trims(node, constants, len(out)):
                size = window(source.shape[axis])
                if size is not None and not isinstance(out[axis], int):
                    base, a, s = size
                    sizes[axis] = (base, a - dropped * s, s)
            settle(node.output[0], out, sizes)
        else:  # an op that keeps its input's symbols keeps their windows
            continue
    return solved


def _trims(node: onnx.NodeProto, constants: dict[str, ShapeValue], rank: int) -> list[tuple[int, int]]:
    """(axis, elements dropped) for each axis a Slice with constant bounds trims at either end by a fixed count:
    a start from 0 up and an end below 0 (``[1:-1]``) or past any size (``[2:]``)."""
    trims = []
    for start, end, axis, step in _slice_bounds(node, constants, rank) or ():
        if step != 1 or start < 0 or not isinstance(end, int):
            continue
        if end < 0:
            trims.append((axis, start - end))
        elif end >= 2**31 - 1 and start > 0:
            trims.append((axis, start))
    return trims


def _slice_bounds(node: onnx.NodeProto, values: dict[str, ShapeValue],
                  rank: int) -> list[tuple[int, Dim, int, int]] | None:
    """(start, end, axis from 0, step) per sliced axis of a Slice (opset 10 on) of rank ``rank``, from ``values``
    (integer constants, or shape values with symbols: only an end may be one), or None when a bound is not
    known."""
    bounds = [values.get(x) if x else None for x in node.input[1:5]]
    if len(bounds) < 2 or bounds[0] is None or bounds[1] is None:
        return None
    if any(x and b is None for x, b in zip(node.input[3:5], bounds[2:])):
        return None  # axes or steps computed at run time
    starts, ends = bounds[0][0], bounds[1][0]
    axes = bounds[2][0] if len(bounds) > 2 and bounds[2] is not None else tuple(range(len(starts)))
    steps = bounds[3][0] if len(bounds) > 3 and bounds[3] is not None else (1,) * len(starts)
    if not all(isinstance(v, int) for v in (*starts, *axes, *steps)) or not len(starts) == len(ends) == len(axes) \
            == len(steps) or any(not -rank <= a < rank for a in axes):
        return None
    return [(start, end, axis % rank, step) for start, end, axis, step in zip(starts, ends, axes, steps)]


# A small integer vector's entries as far as they are known: ints, symbols, None; and whether it is a scalar.
ShapeValue = tuple[tuple[Dim, ...], bool]

_FOLLOWED = frozenset({"Shape", "Gather", "Unsqueeze", "Squeeze", "Concat", "Cast", "Identity", "ConstantOfShape",
                       "Add", "Sub", "Mul", "Div", "Reshape", "Expand", "Equal", "Where", "ReduceProd", "Max", "Min"})


def integer_constants(graph: onnx.GraphProto) -> dict[str, ShapeValue]:
    """``graph``'s integer scalars and vectors of at most 64 entries (initializers and Constant nodes)."""
    return {name: (tuple(int(v) for v in array.reshape(-1)), array.ndim == 0)
            for name, array in constant_values(graph).items()
            if array.dtype.kind in "iu" and array.ndim <= 1 and array.size <= 64}


def _shape_values(graph: onnx.GraphProto, infos: dict[str, TensorInfo], constants: dict[str, ShapeValue],
                  given: set[str]) -> dict[str, ShapeValue]:
    """The values of ``graph``'s shape arithmetic, symbols included: ``Unsqueeze(Gather(Shape(ids), 1))`` is
    ("sequence",). Followed: constants, Shape, Gather, Unsqueeze, Squeeze, Concat, Cast, Identity, Reshape and
    Expand (to a vector of the same entries), ConstantOfShape, integer Add/Sub/Mul and Div of known ints, Mul of
    sizes and symbols and ReduceProd (products, named as :func:`_quotient` names them), Max/Min, and torch's
    Where(Equal(shape, -1), ..., shape)."""
    values = dict(constants)
    flags: dict[str, tuple[bool | None, ...]] = {}  # Equal nodes' outputs, where known
    matrices: dict[str, np.ndarray] = {}  # 2-D integer values (torch's pads, Reshape(-1, 2)), entries as objects
    for node in graph.node:
        if node.domain not in ("", "ai.onnx") or len(node.output) != 1:
            continue
        known = [values.get(x) for x in node.input]
        if node.op_type in _MATRIX_STEPS and node.input and (known[0] is not None or node.input[0] in matrices) \
                and _matrix_step(node, known, values, matrices):
            continue
        if node.op_type not in _FOLLOWED or (node.op_type != "Shape" and not any(known)
                                             and node.input[0] not in flags):
            _unknown_entries(node.output[0], infos, values)
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        result: ShapeValue | None = None
        if node.op_type == "Shape" and node.input[0] in infos and infos[node.input[0]].shape is not None:
            result = (infos[node.input[0]].shape[attrs.get("start", 0):attrs.get("end")], False)
        elif node.op_type == "Gather" and attrs.get("axis", 0) == 0 and None not in known and not known[0][1]:
            (entries, _), (indices, scalar) = known
            if all(isinstance(i, int) and -len(entries) <= i < len(entries) for i in indices):
                result = (tuple(entries[i] for i in indices), scalar)
        elif node.op_type == "Unsqueeze" and known and known[0] is not None and known[0][1]:
            result = (known[0][0], False)
        elif node.op_type == "Squeeze" and known and known[0] is not None and len(known[0][0]) == 1:
            result = (known[0][0], True)
        elif node.op_type == "Concat" and known and None not in known and not any(k[1] for k in known):
            result = (tuple(d for entries, _ in known for d in entries), False)
        elif node.op_type in ("Cast", "Identity") and known and known[0] is not None:
            result = known[0]
        elif node.op_type == "ConstantOfShape" and known and known[0] is not None and \
                all(isinstance(d, int) for d in known[0][0]) and len(known[0][0]) == 1 and "value" in attrs:
            fill = numpy_helper.to_array(attrs["value"]).reshape(-1)
            if fill.dtype.kind in "iu" and fill.size == 1:
                result = ((int(fill[0]),) * known[0][0][0], False)
        elif node.op_type == "Div" and len(known) == 2 and None not in known and \
                infos.get(node.output[0]) is not None and infos[node.output[0]].elem_type in _INTEGER_TYPES and \
                len(known[1][0]) == 1 and isinstance(known[1][0][0], int) and known[1][0][0] > 0 and \
                any(_named_window(d, given) for d in known[0][0]):
            # a size divided by a patch size (timm's ``H // patch``, tokens back to a grid): named as a convolution
            # of that stride names its output (solve_windows), so the two meet under one name
            divisor = known[1][0][0]
            result = (tuple(_integer_division(d, divisor) if isinstance(d, int) else _divided(d, divisor, given)
                            for d in known[0][0]), known[0][1] and known[1][1])
        elif node.op_type in _INTEGER_ARITHMETIC and len(known) == 2 and None not in known and \
                all(isinstance(d, int) for k in known for d in k[0]) and \
                (1 in (len(known[0][0]), len(known[1][0])) or len(known[0][0]) == len(known[1][0])):
            (left, left_scalar), (right, right_scalar) = known
            count = max(len(left), len(right))
            result = (tuple(_INTEGER_ARITHMETIC[node.op_type](left[k % len(left)], right[k % len(right)])
                            for k in range(count)), left_scalar and right_scalar)
        elif node.op_type in ("Max", "Min") and len(known) == 2 and None not in known and \
                len(known[0][0]) == len(known[1][0]):
            # tf2onnx's einsum: the broadcast of two operands' batch sizes, Max(shape_a, shape_b)
            pick = max if node.op_type == "Max" else min
            result = (tuple(a if a == b else pick(a, b) if isinstance(a, int) and isinstance(b, int) else None
                            for a, b in zip(known[0][0], known[1][0])), known[0][1] and known[1][1])
        elif node.op_type == "ReduceProd" and known and known[0] is not None and not known[0][1] and \
                (len(known) == 1 or known[1] is not None and set(known[1][0]) <= {0, -1}):
            # tf2onnx's einsum: the product of the batch axes' sizes, read from a shape
            keep = attrs.get("keepdims", 1)
            result = ((_quotient(known[0][0], [], given),), not keep)
        elif node.op_type == "Reshape" and None not in known and len(known[1][0]) == 1 and \
                (not known[0][1] or known[1][0][0] in (-1, 1)):
            result = (known[0][0], False)  # a vector (or a scalar: the dynamo exporter's group count) to a vector
        elif node.op_type == "Expand" and None not in known and len(known[1][0]) == 1 and \
                known[1][0][0] in (1, len(known[0][0])):
            result = (known[0][0], False)  # the dynamo exporter's Expand(Shape(weight)[:1], [1])
        elif node.op_type == "Equal" and None not in known:
            # torch writes expand(...) as Where(Equal(shape, -1), ones, shape): sizes are never negative
            (left, _), (right, _) = known
            if 1 in (len(left), len(right)) or len(left) == len(right):
                count = max(len(left), len(right))
                flags[node.output[0]] = tuple(_equal(left[k % len(left)], right[k % len(right)])
                                              for k in range(count))
        elif node.op_type == "Where" and len(node.input) == 3 and node.input[0] in flags and None not in known[1:]:
            cond, (chosen, _), (other, _) = flags[node.input[0]], known[1], known[2]
            if all(len(v) in (1, len(cond)) for v in (chosen, other)):
                result = (tuple(None if c is None else chosen[k % len(chosen)] if c else other[k % len(other)]
                                for k, c in enumerate(cond)), False)
        elif node.op_type == "Mul" and len(known) == 2 and None not in known and \
                (1 in (len(known[0][0]), len(known[1][0])) or len(known[0][0]) == len(known[1][0])):
            # a size times a size, one of them a symbol: nn.MultiheadAttention's batch * heads, named as a Reshape's
            # -1 is (:func:`_quotient`), so the Reshape back divides it again
            (left, left_scalar), (right, right_scalar) = known
            count = max(len(left), len(right))
            result = (tuple(_quotient([left[k % len(left)], right[k % len(right)]], [], given) for k in range(count)),
                      left_scalar and right_scalar)
        if result is not None:
            values[node.output[0]] = result
        else:
            _unknown_entries(node.output[0], infos, values)
    return values


_MATRIX_STEPS = frozenset({"Reshape", "Transpose", "Slice", "Cast", "Identity"})
_INTEGER_TYPES = frozenset({onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.INT16,
                            onnx.TensorProto.INT8, onnx.TensorProto.UINT64, onnx.TensorProto.UINT32,
                            onnx.TensorProto.UINT16, onnx.TensorProto.UINT8})


def _unknown_entries(name: str, infos: dict[str, TensorInfo], values: dict[str, ShapeValue]) -> None:
    """An integer scalar or short vector whose entries are not followed (a Mod, a value read from data) still
    has a known length: its entries are None, so that a Concat with known entries keeps those (torch's pads
    ``[0, w % 7, 0, h % 7]``)."""
    info = infos.get(name)
    if info is None or info.elem_type not in _INTEGER_TYPES or name in values:
        return
    shape = info.static_shape
    if shape is None or len(shape) > 1 or math.prod(shape) > 64:
        return
    values[name] = ((None,) * math.prod(shape), not shape)


def _matrix_step(node: onnx.NodeProto, known: list, values: dict[str, ShapeValue],
                 matrices: dict[str, np.ndarray]) -> bool:
    """Follow torch's pads through 2-D values (its F.pad symbolic: the pads vector, Reshape(-1, 2), Slice with step
    -1 over the rows, Transpose, Reshape(-1)); True when ``node`` was such a step."""
    op, source = node.op_type, node.input[0]
    if op == "Reshape" and known[0] is not None and not known[0][1] and known[1] is not None and \
            len(known[1][0]) == 2 and all(isinstance(d, int) for d in known[1][0]):
        entries = known[0][0]
        rows, cols = known[1][0]
        if rows == -1 and cols > 0:
            rows = len(entries) // cols
        elif cols == -1 and rows > 0:
            cols = len(entries) // rows
        if rows * cols != len(entries) or min(rows, cols) < 1:
            return False
        matrices[node.output[0]] = np.array(entries, dtype=object).reshape(rows, cols)
        return True
    if source not in matrices:
        return False
    matrix = matrices[source]
    if op == "Reshape" and known[1] is not None and known[1][0] in ((-1,), (matrix.size,)):
        values[node.output[0]] = (tuple(matrix.reshape(-1)), False)
    elif op == "Transpose":
        perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), [1, 0])
        matrices[node.output[0]] = matrix.transpose(perm)
    elif op == "Slice":
        bounds = _slice_bounds(node, values, 2)
        if bounds is None or not all(isinstance(end, int) for _, end, _, _ in bounds):
            return False
        index = [slice(None), slice(None)]
        for start, end, axis, step in bounds:
            index[axis] = slice(start, _python_end(end, step), step)
        matrices[node.output[0]] = matrix[tuple(index)]
    elif op in ("Cast", "Identity"):
        matrices[node.output[0]] = matrix
    else:
        return False
    return True


def _python_end(end: int, step: int) -> int | None:
    """An ONNX Slice end as a Python slice's: ends past the first element of a backward slice mean 'through the
    first' (None), where Python would count a negative end from the back."""
    return None if step < 0 and end < -(2**31) else end


_WINDOW_NAME = re.compile(r"floor\(\(([A-Za-z_]\w*)([+-]\d+)\)/(\d+)\)"   # floor((base+offset)/stride)
                          r"|floor\(([A-Za-z_]\w*)/(\d+)\)"                # floor(base/stride)
                          r"|([A-Za-z_]\w*)([+-]\d+)?")                      # base, base+offset


def _named_window(size: Dim, given: set[str]) -> _Window | None:
    """The window a size's name spells (:func:`_window_name`'s names of a graph input's symbol), or None."""
    if not isinstance(size, str):
        return None
    match = _WINDOW_NAME.fullmatch(size)
    if match is None:
        return None
    base_offset, offset, stride, base_only, stride_only, plain, plain_offset = match.groups()
    base = base_offset or base_only or plain
    if base not in given:
        return None
    if base_offset:
        return base, int(offset), int(stride)
    if base_only:
        return base, 0, int(stride_only)
    return base, int(plain_offset or 0), 1


def _divided(size: Dim, divisor: int, given: set[str]) -> Dim:
    """floor(size / divisor) for a size named after an input's symbol: floor(floor((b + a) / s) / d) is
    floor((b + a) / (s d)); None for another size."""
    window = _named_window(size, given)
    if window is None:
        return None
    base, offset, stride = window
    return _window_name((base, offset, stride * divisor))


def _integer_division(a: int, b: int) -> int | None:
    """ONNX's integer Div: the quotient truncated toward zero (torch's ``x.shape[-1] // 2`` in rotate_half, traced
    by the TorchScript exporter); None for a division by zero."""
    if b == 0:
        return None
    quotient = abs(a) // abs(b)
    return quotient if (a < 0) == (b < 0) else -quotient


_INTEGER_ARITHMETIC = {"Add": lambda a, b: a + b, "Sub": lambda a, b: a - b, "Mul": lambda a, b: a * b,
                       "Div": _integer_division}


def _equal(a: Dim, b: Dim) -> bool | None:
    """Whether the shape entries ``a`` and ``b`` are equal at every run, differ at every run (a symbol is a size:
    never negative), or None (not known)."""
    if a is None or b is None:
        return None
    if isinstance(a, int) and isinstance(b, int) or a == b:
        return a == b
    other = a if isinstance(a, int) else b
    return False if isinstance(other, int) and other < 0 else None


def solve_computed_shapes(graph: onnx.GraphProto, infos: dict[str, TensorInfo],
                          constants: dict[str, ShapeValue] | None = None) -> dict[str, TensorInfo]:
    """The outputs of ``graph``'s Slice, Expand, Range, Reshape, Flatten and Tile nodes whose bounds or shapes are
    computed from a shape (or, for Flatten, whose product ONNX does not name). ONNX reads such inputs only when
    they are constants and otherwise gives every axis a fresh symbol, the axes a Slice does not touch included.

    transformers takes BERT's position ids as ``position_ids[:, :sequence_length]`` and its token types as
    ``token_type_ids[:, :sequence_length].expand(batch, sequence_length)``, the sizes read from the input ids'
    shape. From the first Add on, the whole network's batch and sequence axes were fresh symbols, and every
    broadcast against the attention mask reduced at run time. Solved, with the shape arithmetic followed
    symbolically (Shape, Gather, Unsqueeze, Concat, ...):

    - Slice: the axes not sliced keep the input's sizes; a sliced axis from 0 with step 1 to a graph input's
      symbol has that size when its own size is that symbol or a fixed size above 1 (larger than the symbol, or
      the broadcasts after it would fail), to the end (an end past any size) keeps its size, and between
      constants on a fixed size it is computed; other sliced axes keep their fresh symbols.
    - Expand: each axis is the broadcast of the input's size and the shape's entry where one is 1 or both are
      equal.
    - Range from 0 by 1 to a graph input's symbol has that size.
    - Reshape to a shape of known entries (0 copies the input's size; a -1 is the element count divided by the
      other sizes) and Flatten: products of the input's sizes, named ``batch*sequence``.
    - Tile by known repeats: an axis repeated once keeps its size, a fixed size is multiplied.
    - Pad by pads computed at run time (timm's windows padded to a multiple of the window size, Funnel's
      shifted attention): an axis whose two pads are known keeps its size when they add up to 0, a fixed size
      is padded; ONNX inference gives every axis a fresh symbol, the batch included.
    - Resize to sizes read from a shape (``interpolate(size=x.shape[2:])``) has those sizes; by constant scales,
      an axis scaled by 1 keeps its size and one scaled by an integer ``k`` is ``k*size`` (ONNX gives the batch
      axis a fresh symbol there too).
    """
    given = input_symbols(graph)
    values: dict[str, ShapeValue] | None = None
    solved: dict[str, TensorInfo] = {}
    for node in graph.node:
        if node.op_type not in _COMPUTED or node.domain not in ("", "ai.onnx"):
            continue
        out = infos.get(node.output[0])
        if out is None or out.shape is None or out.static_shape is not None:
            continue
        if values is None:
            values = _shape_values(graph, infos, integer_constants(graph) if constants is None else constants, given)
            values.update(_float_vectors(graph) if any(n.op_type == "Resize" for n in graph.node) else {})
        shape = _COMPUTED[node.op_type](node, infos, values, given)
        if shape is not None and len(shape) == len(out.shape):
            shape = tuple(out.shape[a] if d is None or fresh_symbol(d, given) else d for a, d in enumerate(shape))
            if shape != tuple(out.shape):
                solved[node.output[0]] = TensorInfo(out.elem_type, shape)
    return solved


def _sliced(node, infos, values, given) -> list[Dim] | None:
    data = infos.get(node.input[0])
    if data is None or data.shape is None:
        return None
    bounds = _slice_bounds(node, values, len(data.shape))
    if bounds is None:
        return None
    shape = list(data.shape)
    for start, end, axis, step in bounds:
        shape[axis] = _sliced_size(data.shape[axis], start, end, step, given)
    return shape


def _expanded(node, infos, values, given) -> list[Dim] | None:
    data, target = infos.get(node.input[0]), values.get(node.input[1])
    if data is None or data.shape is None or target is None:
        return None
    entries = target[0]
    rank = max(len(data.shape), len(entries))
    padded = (1,) * (rank - len(data.shape)) + tuple(data.shape)
    entries = (1,) * (rank - len(entries)) + tuple(entries)
    shape: list[Dim] = []
    for size, entry in zip(padded, entries):
        if entry == 1 or entry == size:
            shape.append(size)
        elif size == 1 and (isinstance(entry, int) or entry in given):
            shape.append(entry)
        else:
            shape.append(None)
    return shape


def _range(node, infos, values, given) -> list[Dim] | None:
    start, limit, delta = (values.get(x) for x in node.input[:3])
    if start is None or limit is None or delta is None or start[0] != (0,) or delta[0] != (1,):
        return None
    return [limit[0][0]] if len(limit[0]) == 1 and limit[0][0] in given else None


def _reshaped(node, infos, values, given) -> list[Dim] | None:
    data, target = infos.get(node.input[0]), values.get(node.input[1])
    if data is None or data.shape is None or target is None:
        return None
    keep_zero = any(a.name == "allowzero" and a.i for a in node.attribute)
    dims = [data.shape[k] if e == 0 and not keep_zero and k < len(data.shape) else e for k, e in enumerate(target[0])]
    if dims.count(-1) == 1:
        k = dims.index(-1)
        dims[k] = _quotient(data.shape, dims[:k] + dims[k + 1:], given)
    return dims


def _flattened(node, infos, values, given) -> list[Dim] | None:
    data = infos.get(node.input[0])
    if data is None or data.shape is None:
        return None
    axis = next((a.i for a in node.attribute if a.name == "axis"), 1) % (len(data.shape) + 1)
    return [_quotient(data.shape[:axis], [], given), _quotient(data.shape[axis:], [], given)]


def _tiled(node, infos, values, given) -> list[Dim] | None:
    """An axis repeated once keeps its size, fixed sizes multiply; ONNX gives even ``sequence`` x 1 a fresh
    symbol (GPT-J's rotary sin/cos tiled over pairs by constant repeats (1, 1, 1, 1, 2), TorchScript export)."""
    data, repeats = infos.get(node.input[0]), values.get(node.input[1])
    if data is None or data.shape is None or repeats is None or len(repeats[0]) != len(data.shape):
        return None
    return [size if count == 1 else size * count if isinstance(size, int) and isinstance(count, int) else None
            for size, count in zip(data.shape, repeats[0])]


def _padded(node, infos, values, given) -> list[Dim] | None:
    """A Pad (opset 11 on) whose pads, and axes if given, are known entries: each axis's size plus its pads."""
    data = infos.get(node.input[0])
    pads = values.get(node.input[1]) if len(node.input) > 1 else None
    if data is None or data.shape is None or pads is None:
        return None
    rank = len(data.shape)
    axes = tuple(range(rank))
    if len(node.input) > 3 and node.input[3]:
        known_axes = values.get(node.input[3])
        if known_axes is None or not all(isinstance(a, int) and -rank <= a < rank for a in known_axes[0]):
            return None
        axes = tuple(a % rank for a in known_axes[0])
    if len(pads[0]) != 2 * len(axes):
        return None
    shape = list(data.shape)
    for k, axis in enumerate(axes):
        begin, end = pads[0][k], pads[0][k + len(axes)]
        if isinstance(begin, int) and isinstance(end, int) and isinstance(shape[axis], int):
            shape[axis] = shape[axis] + begin + end
        elif not (isinstance(begin, int) and isinstance(end, int) and begin + end == 0):
            # padded by a size computed at run time (to a multiple of a window): a size of its own, named after
            # the value, which the convolutions and broadcasts after it can name theirs from
            shape[axis] = padded_size(node.output[0], axis) if shape[axis] is not None and \
                not fresh_symbol(shape[axis], given) else None
    return shape


def padded_size(value: str, axis: int) -> str:
    """The name of axis ``axis`` of ``value``, a Pad's output padded by a size computed at run time."""
    return f"{value}.shape[{axis}]"


def _is_padded_size(dim: Dim) -> bool:
    return isinstance(dim, str) and dim.endswith("]") and ".shape[" in dim


def _resized(node, infos, values, given) -> list[Dim] | None:
    """A Resize (opset 11 on) to known sizes, or by constant scales of 1 or an integer (see solve_computed_shapes)."""
    data = infos.get(node.input[0])
    if data is None or data.shape is None or len(node.input) < 3:
        return None
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    policy = attrs.get("keep_aspect_ratio_policy", b"stretch")
    if (policy.decode() if isinstance(policy, bytes) else policy) != "stretch":
        return None
    rank = len(data.shape)
    axes = [a % rank for a in attrs.get("axes", range(rank))]
    shape: list[Dim] = list(data.shape)
    sizes = values.get(node.input[3]) if len(node.input) > 3 and node.input[3] else None
    scales = values.get(node.input[2]) if node.input[2] else None
    if sizes is not None and len(sizes[0]) == len(axes):
        for axis, size in zip(axes, sizes[0]):
            shape[axis] = size if isinstance(size, int) or size in given or _monomial(size, given) else None
        return shape
    if scales is None or len(scales[0]) != len(axes) or not all(isinstance(f, float) for f in scales[0]):
        return None
    for axis, scale in zip(axes, scales[0]):
        if scale != int(scale) or scale < 1:
            shape[axis] = None
        elif scale != 1:
            shape[axis] = _quotient([int(scale), shape[axis]], [], given)
    return shape


def _float_vectors(graph: onnx.GraphProto) -> dict[str, ShapeValue]:
    """``graph``'s constant float vectors of at most 8 entries (Resize scales), as entries of floats, and the
    Concats of such vectors (TorchScript writes a Resize's scales as Concat([1, 1], [2, 2]))."""
    vectors = {name: (tuple(float(v) for v in array.reshape(-1)), False)
               for name, array in constant_values(graph).items()
               if array.dtype.kind == "f" and array.ndim == 1 and array.size <= 8}
    for node in graph.node:
        if node.op_type == "Concat" and node.input and all(x in vectors for x in node.input):
            vectors[node.output[0]] = (tuple(v for x in node.input for v in vectors[x][0]), False)
    return vectors


_COMPUTED = {"Pad": _padded, "Resize": _resized, "Slice": _sliced, "Expand": _expanded, "Range": _range,
             "Reshape": _reshaped, "Flatten": _flattened,
             "Tile": _tiled}
SOLVED = frozenset({*_COMPUTED, *_WINDOWED})  # the op types whose outputs the solvers name


def _sliced_size(size: Dim, start: int, end: Dim, step: int, given: set[str]) -> Dim:
    """The size of ``size`` sliced from ``start`` to ``end`` by ``step`` where it is known (see
    solve_computed_shapes)."""
    if step != 1:
        return None
    if isinstance(end, int) and isinstance(size, int):
        begin = min(max(start + size if start < 0 else start, 0), size)
        stop = min(max(end + size if end < 0 else end, 0), size)
        return max(stop - begin, 0)
    if start == 0 and isinstance(end, int) and end >= 2**31 - 1:
        return size
    if start == 0 and isinstance(end, str) and (end == size or (end in given and isinstance(size, int) and size > 1)):
        return end
    return None
