"""ChunkUpdate: the optimizer graph over slices of its flat vectors, one chain of ops per slice.

The optimizer graph updates every trainable parameter at once: a dozen elementwise ops over vectors of P
elements. At 20M parameters each op streams its inputs and its result through memory, so the update moves
about 13 x 3 x 4P bytes, and its temporaries are whole vectors. Split into chunks of a few hundred thousand
elements whose inputs and outputs are bound to slices of the same vectors, each chunk's chain runs while its
slices are in the cache and onnxruntime reuses one chunk's temporaries for the next: the update moves about the
bytes of its inputs and outputs (a fused optimizer kernel's), and its temporaries are a chunk's.

    params[a:b], gradients[a:b], exp_avg[a:b], ... --the same ops--> params.out[a:b], exp_avg.out[a:b], ...

Cases handled (anything else raises PassError naming the node; the runtime then runs the graph unsplit):
- a vector input is a graph input of shape ``[P]``; every value computed from one is a vector;
- elementwise ops (``ELEMENTWISE``) over vectors and scalars: copied once per chunk;
- full reductions of a vector (ReduceSum, ReduceSumSquare, ReduceMax, ReduceMin, ReduceL1): reduced per
  chunk, the partial results combined by one Sum / Max / Min (the gradient norm of clipping, the finiteness
  check);
- every other value (the learning rate, the step, bias corrections, constants) is shared by the chunks; a
  shared value must be a scalar (at most one element).
The chunked graph's vector inputs and outputs are ``chunk_name(name, i)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import helper

from onnxtrain.errors import PassError
from onnxtrain.ir.pass_infra import Pass, PassResult
from onnxtrain.ir.passes import clone, has_subgraphs

__all__ = ["ChunkUpdate", "chunk_name", "chunk_bounds", "chunk_slots", "ELEMENTWISE"]

ELEMENTWISE = frozenset({
    "Abs", "Add", "And", "Cast", "Ceil", "Clip", "Div", "Equal", "Exp", "Floor", "Greater", "GreaterOrEqual",
    "Identity", "IsInf", "IsNaN", "Less", "LessOrEqual", "Log", "Max", "Min", "Mul", "Neg", "Not", "Or", "Pow",
    "Reciprocal", "Relu", "Sign", "Sqrt", "Sub", "Sum", "Tanh", "Where", "Xor",
})
_COMBINE = {"ReduceSum": "Sum", "ReduceSumSquare": "Sum", "ReduceL1": "Sum", "ReduceMax": "Max",
            "ReduceMin": "Min"}


def chunk_name(name: str, i: int) -> str:
    """The chunked graph's name for chunk ``i`` of the vector ``name``."""
    return f"{name}#{i}"


def chunk_bounds(sizes: Sequence[int], target: int) -> list[tuple[int, int]]:
    """(start, stop) of chunks of about ``target`` elements over vectors laid out as ``sizes``.

    Chunks start and end on slot boundaries where they can: consecutive small slots share a chunk, and a slot
    larger than ``target`` is split into equal pieces (multiples of 16 elements) of at most ``target``.
    """
    if target < 16:
        raise ValueError(f"chunk target must be at least 16 elements, got {target}")
    bounds, start, offset = [], 0, 0
    for size in sizes:
        if offset > start and offset - start + size > target:
            bounds.append((start, offset))
            start = offset
        if size > target:
            pieces = -(-size // target)
            step = -(-size // pieces // 16) * 16
            cuts = [*range(offset, offset + size, step), offset + size]
            bounds.extend(zip(cuts[:-1], cuts[1:]))
            start = offset + size
        offset += size
    if offset > start:
        bounds.append((start, offset))
    return bounds


def chunk_slots(sizes: Sequence[int], bounds: Sequence[tuple[int, int]]) -> list[list[int]]:
    """For each chunk ``(start, stop)`` of vectors laid out as ``sizes``, the indices of the slots it overlaps."""
    offsets = np.cumsum([0, *sizes]).tolist()
    return [[k for k in range(len(sizes)) if max(a, offsets[k]) < min(b, offsets[k + 1])] for a, b in bounds]


class ChunkUpdate(Pass):
    """Split an optimizer graph over flat vectors into one chain per chunk.

    Args:
        bounds: (start, stop) of each chunk, covering ``[0, P)`` in order (``chunk_bounds``).
    """

    def __init__(self, bounds: Sequence[tuple[int, int]]):
        self.bounds = list(bounds)

    def call(self, model: onnx.ModelProto) -> PassResult:
        g = model.graph
        size = self.bounds[-1][1] if self.bounds else 0
        if [b for pair in self.bounds for b in pair][1:-1:2] != [b for pair in self.bounds for b in pair][2::2] \
                or not self.bounds or self.bounds[0][0] != 0:
            raise PassError(f"the chunks {self.bounds[:3]}... do not cover the vectors contiguously from 0")
        vectors = {i.name for i in g.input if _dims(i) == [size]}
        if not vectors:
            raise PassError(f"the optimizer graph has no input of shape [{size}] to split")
        scalars = _scalar_names(model)
        n = len(self.bounds)
        # Stages: a value computed from a combined reduction comes one stage after the reduction's inputs. Per
        # stage: the shared nodes, then each chunk's whole chain (so its slices stay in the cache), then the
        # combining nodes.
        stage_of: dict[str, int] = {}
        stages: dict[int, tuple[list, list[list], list]] = {}

        def stage(k: int) -> tuple[list, list[list], list]:
            return stages.setdefault(k, ([], [[] for _ in range(n)], []))

        for node in g.node:
            if has_subgraphs(node):
                raise PassError(f"the optimizer graph's node {node.name or node.op_type} has subgraphs")
            k = max((stage_of.get(x, 0) for x in node.input if x), default=0)
            if not any(x in vectors for x in node.input):
                stage(k)[0].append(node)
                stage_of.update((o, k) for o in node.output)
                if _computes_scalars(node, scalars):  # from a combined reduction (the gradient norm)
                    scalars.update(o for o in node.output if o)
                continue
            where = f"{node.op_type} node {node.name or node.output[0]!r}"
            others = [x for x in node.input if x and x not in vectors and x not in scalars]
            if others:
                scalars |= _inferred_scalars(model)
                others = [x for x in others if x not in scalars]
            if others:
                raise PassError(f"the optimizer graph's {where} combines a vector with {others[0]!r}, which is "
                                "neither a vector nor a scalar")
            if node.op_type in _COMBINE:
                partials = [f"{node.output[0]}/chunk{i}" for i in range(n)]
                for i in range(n):
                    stage(k)[1][i].append(_copy(node, vectors, i, outputs=[partials[i]]))
                stage(k)[2].append(helper.make_node(_COMBINE[node.op_type], partials, [node.output[0]],
                                                    name=f"{node.name or node.output[0]}/combine"))
                scalars.add(node.output[0])
                stage_of[node.output[0]] = k + 1
            elif node.op_type in ELEMENTWISE:
                for i in range(n):
                    stage(k)[1][i].append(_copy(node, vectors, i))
                vectors.update(o for o in node.output if o)
                stage_of.update((o, k) for o in node.output)
            else:
                raise PassError(f"the optimizer graph applies {where} to a flat vector; only elementwise ops "
                                f"({', '.join(sorted(ELEMENTWISE))}) and full reductions can be split into chunks")
        nodes = []
        for k in sorted(stages):
            shared, chains, combines = stages[k]
            nodes += shared + [node for chain in chains for node in chain] + combines

        inputs, outputs = [], []
        for vi in g.input:
            inputs.extend(_chunked_values(vi, self.bounds) if vi.name in vectors else [vi])
        for vi in g.output:
            if vi.name in {i.name for i in g.input}:
                raise PassError(f"the optimizer graph's output {vi.name!r} is one of its inputs")
            outputs.extend(_chunked_values(vi, self.bounds) if vi.name in vectors else [vi])
        graph = helper.make_graph(nodes, g.name, inputs, outputs, initializer=list(g.initializer))
        chunked = clone(model)
        chunked.graph.CopyFrom(graph)
        return PassResult(chunked, True)


def _dims(vi: onnx.ValueInfoProto) -> list[int | str] | None:
    t = vi.type.tensor_type
    if not t.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else d.dim_param for d in t.shape.dim]


_KEEP_SIZE = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten"})  # a one-element input gives one element


def _scalar_names(model: onnx.ModelProto) -> set[str]:
    """Values known to hold at most one element: scalar inputs, initializers and Constants, and what elementwise
    ops (and reshapes) compute from them alone.

    Not onnx's shape inference, unless this finds too little: its operator schemas cost 7.5 MB of resident
    memory on first use, on the device (``_inferred_scalars``).
    """
    g = model.graph
    scalars = {i.name for i in g.initializer if int(np.prod(i.dims)) <= 1}
    for vi in g.input:
        dims = _dims(vi)
        if dims is not None and all(isinstance(d, int) for d in dims) and int(np.prod(dims)) <= 1:
            scalars.add(vi.name)
    for node in g.node:
        if node.op_type == "Constant":
            value = next((a for a in node.attribute if a.name.startswith("value")), None)
            if value is not None and (value.type != onnx.AttributeProto.TENSOR or int(np.prod(value.t.dims)) <= 1):
                scalars.add(node.output[0])
        elif _computes_scalars(node, scalars):
            scalars.update(o for o in node.output if o)
    return scalars


def _computes_scalars(node: onnx.NodeProto, scalars: set[str]) -> bool:
    """Whether the node's outputs have one element because its inputs do."""
    if node.op_type in _KEEP_SIZE:
        return bool(node.input) and node.input[0] in scalars
    return node.op_type in ELEMENTWISE and bool(node.input) and all(x in scalars for x in node.input if x)


def _inferred_scalars(model: onnx.ModelProto) -> set[str]:
    """Values shape inference finds to hold at most one element."""
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False).graph
    scalars = {i.name for i in model.graph.initializer if int(np.prod(i.dims)) <= 1}
    for vi in [*inferred.input, *inferred.value_info, *inferred.output]:
        dims = _dims(vi)
        if dims is not None and all(isinstance(d, int) for d in dims) and int(np.prod(dims)) <= 1:
            scalars.add(vi.name)
    return scalars


def _copy(node: onnx.NodeProto, vectors: set[str], i: int, outputs: list[str] | None = None) -> onnx.NodeProto:
    copy = clone(node)
    copy.name = chunk_name(node.name or node.output[0], i)
    for k, x in enumerate(copy.input):
        if x in vectors:
            copy.input[k] = chunk_name(x, i)
    del copy.output[:]
    copy.output.extend(outputs if outputs is not None else [chunk_name(o, i) if o else o for o in node.output])
    return copy


def _chunked_values(vi: onnx.ValueInfoProto, bounds: Sequence[tuple[int, int]]) -> list[onnx.ValueInfoProto]:
    elem = vi.type.tensor_type.elem_type
    return [helper.make_tensor_value_info(chunk_name(vi.name, i), elem, [b - a]) for i, (a, b) in enumerate(bounds)]
