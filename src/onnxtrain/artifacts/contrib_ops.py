"""Rewrite onnxruntime's fused ``com.microsoft`` ops as default-domain ops, so that a model optimized for
inference trains.

``onnxruntime.transformers.optimizer.optimize_model`` fuses a transformer's elementwise chains into contrib ops
(``BiasGelu``, ``FastGelu``, ``SkipLayerNormalization``, ...), and a session's extended optimizations, saved with
``SessionOptions.optimized_model_filepath``, a convolution with its activation (``FusedConv``). A model shipped
that way has no standard-ONNX gradient, and artifacts may only hold default-domain ops. These ops are
compositions of standard ones, written here in the form torch exports them, so that onnxruntime fuses them
again when it runs the training graph (its GeluFusion, LayerNormFusion) and the backward passes recognise them
(``GeluBackward``):

- ``Gelu(x)``: ``0.5 x (1 + erf(x / sqrt 2))``; ``BiasGelu(x, b)``: the same of ``x + b``;
- ``FastGelu(x[, b])``: ``0.5 y (1 + tanh(sqrt(2 / pi) (y + 0.044715 y^3)))``, ``y = x + b``;
- ``QuickGelu(x)``: ``x sigmoid(alpha x)``;
- ``LayerNormalization`` (onnxruntime's, which its optimizer writes in the default domain below opset 17, where
  the standard has none): the standard op from opset 17, its equations before;
- ``SkipLayerNormalization(x, skip, gamma[, beta[, bias]])``: ``s = x + skip + bias``, LayerNormalization of
  ``s`` over the last axis; its optional outputs (mean, inverse standard deviation, ``s``) too;
- ``SimplifiedLayerNormalization(x, gamma)`` (RMSNorm over the last axis; in the default domain too) and
  ``SkipSimplifiedLayerNormalization(x, skip, gamma[, bias])``, when their statistics outputs are not read;
- ``FusedMatMul(a, b)``: ``alpha (a' @ b')``, the last two axes of ``a``, ``b`` swapped where ``transA``,
  ``transB`` say (not the batch-transposing variants);
- ``FusedConv`` and ``FusedGemm``, which a session's own optimizations write into a saved optimized model (a
  convolution or Gemm, plus ``Z``, then Relu, Tanh, Sigmoid, LeakyRelu, HardSigmoid or Clip).

- ``Attention`` (BERT's: packed QKV projection, scaled dot-product attention, a key-length or 0/1 key mask,
  causal masking; not past/present key-values, attention biases or rotary embeddings) and
  ``EmbedLayerNormalization`` (word + position + segment embeddings, LayerNormalization, the mask's token count
  per sequence), from opset 13 on.

Other contrib ops (``MultiHeadAttention``, ``GroupQueryAttention``, quantized ones, ...) and the cases above
left out are left as they are; ``detach_foreign_ops`` then names them, with what to do (train the model as
exported, before the optimizer fused it).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import onnx
from onnx import helper

from onnxtrain.artifacts.lowering import NodeEmitter
from onnxtrain.ir.passes import clone, declare_as_inputs, default_opset, used_names
from onnxtrain.ir.types import TensorInfo, infer_tensor_info, np_dtype

__all__ = ["lower_contrib_ops", "CONTRIB", "LOWERED"]

CONTRIB = "com.microsoft"


class _Emit(NodeEmitter):
    """The default-domain nodes that replace one contrib node; float constants take the element type of its first
    input."""

    def __init__(self, node: onnx.NodeProto, taken: set[str], opset: int, infos: dict[str, TensorInfo],
                 weights: dict[str, np.ndarray], lengths: set[str]):
        super().__init__(node, taken, opset)
        self.infos, self.weights = infos, weights
        self.lengths = lengths  # values known to be per-sequence token counts (EmbedLayerNormalization's mask_index)
        x = infos.get(node.input[0]) if node.input else None
        self.dtype = np_dtype(x.elem_type) if x is not None and x.is_float else np.dtype(np.float32)

    def scalar(self, value: float) -> str:
        return self.const(np.asarray(value, self.dtype))

    def rank(self, x: str) -> int | None:
        info = self.infos.get(x)
        return None if info is None else info.rank


def _mean_last(e: _Emit, x: str) -> str:
    """ReduceMean over the last axis, kept."""
    return e.reduce("ReduceMean", x, [-1])


def _attrs(node: onnx.NodeProto) -> dict:
    """The node's attributes, strings decoded."""
    values = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    return {k: v.decode() if isinstance(v, bytes) else v for k, v in values.items()}


def _outputs(node: onnx.NodeProto) -> list[str]:
    return [*node.output, "", "", "", ""][:4]


def _optional(node: onnx.NodeProto, i: int) -> str:
    return node.input[i] if len(node.input) > i else ""


def _gelu_of(e: _Emit, x: str, out: str) -> None:
    """0.5 x (1 + erf(x / sqrt 2)), as torch exports the erf GELU."""
    f = e.op("Add", e.op("Erf", e.op("Div", x, e.scalar(math.sqrt(2.0)))), e.scalar(1.0))
    e.op("Mul", e.op("Mul", x, f), e.scalar(0.5), out=out)


def _gelu(e: _Emit, node: onnx.NodeProto) -> bool:
    _gelu_of(e, node.input[0], node.output[0])
    return True


def _bias_gelu(e: _Emit, node: onnx.NodeProto) -> bool:
    _gelu_of(e, e.op("Add", node.input[0], node.input[1]), node.output[0])
    return True


def _fast_gelu(e: _Emit, node: onnx.NodeProto) -> bool:
    y = node.input[0]
    if _optional(node, 1):
        y = e.op("Add", y, node.input[1])
    cube = e.op("Mul", e.op("Mul", y, y), y)
    inner = e.op("Mul", e.op("Add", y, e.op("Mul", cube, e.scalar(0.044715))), e.scalar(math.sqrt(2.0 / math.pi)))
    half = e.op("Mul", y, e.scalar(0.5))
    e.op("Mul", half, e.op("Add", e.op("Tanh", inner), e.scalar(1.0)), out=node.output[0])
    return True


def _quick_gelu(e: _Emit, node: onnx.NodeProto) -> bool:
    alpha = float(_attrs(node).get("alpha", 1.702))
    x = node.input[0]
    e.op("Mul", x, e.op("Sigmoid", e.op("Mul", x, e.scalar(alpha))), out=node.output[0])
    return True


def _layer_norm_of(e: _Emit, s: str, gamma: str, beta: str, epsilon: float, outs: list[str]) -> None:
    """LayerNormalization of ``s`` over its last axis into ``outs`` (Y, Mean, InvStdDev; "" where not wanted)."""
    if e.opset >= 17:
        inputs = [s, gamma] + ([beta] if beta else [])
        while outs and not outs[-1]:
            outs = outs[:-1]
        e.nodes.append(helper.make_node("LayerNormalization", inputs, outs, name=e.name("LayerNormalization"),
                                        axis=-1, epsilon=epsilon))
        return
    mean = _mean_last(e, s)
    d = e.op("Sub", s, mean)
    inv_std = e.op("Reciprocal", e.op("Sqrt", e.op("Add", _mean_last(e, e.op("Mul", d, d)), e.scalar(epsilon))))
    y = e.op("Mul", e.op("Mul", d, inv_std), gamma, out=None if beta else outs[0])
    if beta:
        e.op("Add", y, beta, out=outs[0])
    for out, value in zip(outs[1:3], (mean, inv_std)):
        if out:
            e.op("Identity", value, out=out)


def _layer_norm(e: _Emit, node: onnx.NodeProto) -> bool:
    a = _attrs(node)
    rank = e.rank(node.input[0])
    axis = int(a.get("axis", -1))
    if axis != -1 and (rank is None or axis != rank - 1):
        return False
    _layer_norm_of(e, node.input[0], node.input[1], _optional(node, 2), float(a.get("epsilon", 1e-5)),
                   _outputs(node)[:3])
    return True


def _skip_sum(e: _Emit, node: onnx.NodeProto, bias_index: int, out: str) -> str:
    s = e.op("Add", node.input[0], node.input[1], out=None if _optional(node, bias_index) else (out or None))
    if _optional(node, bias_index):
        s = e.op("Add", s, node.input[bias_index], out=out or None)
    return s


def _skip_layer_norm(e: _Emit, node: onnx.NodeProto) -> bool:
    y, mean, inv_std, total = _outputs(node)
    s = _skip_sum(e, node, 4, total)
    _layer_norm_of(e, s, node.input[2], _optional(node, 3), float(_attrs(node).get("epsilon", 1e-12)),
                   [y, mean, inv_std])
    return True


def _rms_norm_of(e: _Emit, x: str, gamma: str, epsilon: float, out: str) -> None:
    rms = e.op("Sqrt", e.op("Add", _mean_last(e, e.op("Mul", x, x)), e.scalar(epsilon)))
    e.op("Mul", e.op("Div", x, rms), gamma, out=out)


def _simplified_layer_norm(e: _Emit, node: onnx.NodeProto) -> bool:
    a = _attrs(node)
    rank = e.rank(node.input[0])
    axis = int(a.get("axis", -1))
    if any(_outputs(node)[1:]) or (axis != -1 and (rank is None or axis != rank - 1)):
        return False
    _rms_norm_of(e, node.input[0], node.input[1], float(a.get("epsilon", 1e-5)), node.output[0])
    return True


def _skip_simplified_layer_norm(e: _Emit, node: onnx.NodeProto) -> bool:
    y, mean, inv_std, total = _outputs(node)
    if mean or inv_std:
        return False
    s = _skip_sum(e, node, 3, total)
    _rms_norm_of(e, s, node.input[2], float(_attrs(node).get("epsilon", 1e-12)), y)
    return True


def _fused_matmul(e: _Emit, node: onnx.NodeProto) -> bool:
    a = _attrs(node)
    if a.get("transBatchA", 0) or a.get("transBatchB", 0):
        return False
    operands = []
    for x, flag in ((node.input[0], a.get("transA", 0)), (node.input[1], a.get("transB", 0))):
        if flag:
            rank = e.rank(x)
            if rank is None or rank < 2:
                return False
            x = e.op("Transpose", x, perm=[*range(rank - 2), rank - 1, rank - 2])
        operands.append(x)
    alpha = float(a.get("alpha", 1.0))
    if alpha == 1.0:
        e.op("MatMul", *operands, out=node.output[0])
    else:
        e.op("Mul", e.op("MatMul", *operands), e.scalar(alpha), out=node.output[0])
    return True


def _activation(e: _Emit, kind: str, params: list[float], x: str, out: str) -> bool:
    """onnxruntime's fused activation ``kind`` (MLAS's set) of ``x`` into ``out``; False for an unknown one."""
    if kind in ("Relu", "Tanh", "Sigmoid"):
        e.op(kind, x, out=out)
    elif kind == "LeakyRelu":
        e.op("LeakyRelu", x, out=out, alpha=params[0] if params else 0.01)
    elif kind == "HardSigmoid":
        alpha, beta = (params + [0.2, 0.5][len(params):])[:2]
        e.op("HardSigmoid", x, out=out, alpha=alpha, beta=beta)
    elif kind == "Clip" and len(params) == 2:
        e.op("Clip", x, e.scalar(params[0]), e.scalar(params[1]), out=out)
    else:
        return False
    return True


_FUSED_ACTIVATIONS = ("Relu", "Tanh", "Sigmoid", "LeakyRelu", "HardSigmoid", "Clip")


def _fused_conv(e: _Emit, node: onnx.NodeProto) -> bool:
    """onnxruntime's Conv (+ Z) + activation."""
    a = _attrs(node)
    kind = a.pop("activation", "")
    params = [float(v) for v in a.pop("activation_params", [])]
    if kind not in _FUSED_ACTIVATIONS or (kind == "Clip" and len(params) != 2):
        return False
    y = e.op("Conv", *node.input[:3], **a)
    if _optional(node, 3):
        y = e.op("Add", y, node.input[3])
    return _activation(e, kind, params, y, node.output[0])


def _fused_gemm(e: _Emit, node: onnx.NodeProto) -> bool:
    """onnxruntime's Gemm + activation."""
    a = _attrs(node)
    kind = a.get("activation", "")
    params = [float(a[k]) for k in ("activation_alpha", "activation_beta") if k in a]
    if kind not in _FUSED_ACTIVATIONS or kind == "Clip":
        return False
    gemm = {k: a[k] for k in ("alpha", "beta", "transA", "transB") if k in a}
    return _activation(e, kind, params, e.op("Gemm", *node.input, **gemm), node.output[0])


def _unsqueeze(e: _Emit, x: str, axes: list[int]) -> str:
    return e.op("Unsqueeze", x, e.ints(axes))   # opset 13 on (the callers require it)


def _length(e: _Emit, x: str, axis: int) -> str:
    """The size of ``x`` along ``axis``, as an int64 scalar."""
    return e.op("Squeeze", e.op("Gather", e.op("Shape", x), e.ints([axis]), axis=0), e.ints([0]))


def _attention(e: _Emit, node: onnx.NodeProto) -> bool:
    """onnxruntime's BERT Attention: packed QKV projection, scaled dot-product attention over num_heads heads with
    an optional key mask (key lengths (batch,), or a raw 0/1 mask (batch, keys)) and causal masking. Not: past and
    present key/values, an attention bias, rotary embeddings."""
    a = _attrs(node)
    inputs = [*node.input, "", "", "", "", "", "", ""]
    if (e.opset < 13 or any(inputs[4:7]) or any(node.output[1:]) or a.get("do_rotary", 0)
            or a.get("past_present_share_buffer", 0)):
        return False
    x, weights, bias, mask = inputs[:4]
    heads = int(a["num_heads"])
    w = e.weights.get(weights)
    if w is None or w.ndim != 2:
        return False
    sizes = [int(v) for v in a.get("qkv_hidden_sizes", [])] or [w.shape[1] // 3] * 3
    if len(sizes) != 3 or sum(sizes) != w.shape[1] or sizes[0] != sizes[1] or any(v % heads for v in sizes):
        return False
    mask_rank = e.rank(mask) if mask else 0
    lengths = mask_rank == 1 and (mask in e.lengths or _same_size(e, mask, 0, x, 0))
    if mask and not (lengths or mask_rank == 2):
        return False   # (2 * batch,) start and end positions, 3-D and 4-D masks: not rewritten
    qkv = e.op("MatMul", x, weights)
    if bias:
        qkv = e.op("Add", qkv, bias)
    q, k, v = (e.name(part) for part in ("q", "k", "v"))
    e.nodes.append(helper.make_node("Split", [qkv, e.ints(sizes)], [q, k, v], name=e.name("Split"), axis=-1))
    q, k, v = (e.op("Reshape", t, e.ints([0, 0, heads, -1])) for t in (q, k, v))
    scale = float(a.get("scale", 0.0)) or 1.0 / math.sqrt(sizes[0] // heads)
    scores = e.op("Mul", e.op("MatMul", e.op("Transpose", q, perm=[0, 2, 1, 3]),
                              e.op("Transpose", k, perm=[0, 2, 3, 1])), e.scalar(scale))
    fill = e.scalar(float(a.get("mask_filter_value", -10000.0)))
    zero = e.scalar(0.0)
    if mask:
        if lengths:          # keys at positions from the length on are masked
            keys = e.op("Range", e.ints(0), _length(e, x, 1), e.ints(1))
            kept = e.op("Less", _unsqueeze(e, keys, [0]), _unsqueeze(e, e.op("Cast", mask, to=onnx.TensorProto.INT64),
                                                                    [1]))
            bias_keys = e.op("Where", kept, zero, fill)
        else:                # 1 keeps a key, 0 masks it
            bias_keys = e.op("Mul", e.op("Sub", e.scalar(1.0), e.op("Cast", mask, to=_elem(e))), fill)
        scores = e.op("Add", scores, _unsqueeze(e, bias_keys, [1, 2]))
    if a.get("unidirectional", 0):
        positions = e.op("Range", e.ints(0), _length(e, x, 1), e.ints(1))
        future = e.op("Greater", _unsqueeze(e, positions, [0]), _unsqueeze(e, positions, [1]))
        scores = e.op("Add", scores, e.op("Where", future, fill, zero))
    probs = e.op("Softmax", scores, axis=-1)
    context = e.op("Transpose", e.op("MatMul", probs, e.op("Transpose", v, perm=[0, 2, 1, 3])), perm=[0, 2, 1, 3])
    e.op("Reshape", context, e.ints([0, 0, -1]), out=node.output[0])
    return True


def _embed_layer_norm(e: _Emit, node: onnx.NodeProto) -> bool:
    """onnxruntime's EmbedLayerNormalization: word + position (+ segment) embeddings, LayerNormalization, and the
    mask's token count per sequence (mask_index, which its Attention reads)."""
    inputs = [*node.input, "", "", "", "", "", "", "", "", ""]
    ids, segments, word, position, segment, gamma, beta, mask, position_ids = inputs[:9]
    outs = _outputs(node)
    if e.opset < 13 or (outs[1] and not mask):
        return False
    emb = e.op("Gather", word, ids, axis=0)
    if position_ids:
        emb = e.op("Add", emb, e.op("Gather", position, position_ids, axis=0))
    else:
        positions = e.op("Range", e.ints(0), _length(e, ids, 1), e.ints(1))
        emb = e.op("Add", emb, e.op("Gather", position, positions, axis=0))
    if segments and segment:
        emb = e.op("Add", emb, e.op("Gather", segment, segments, axis=0))
    if outs[2]:
        emb = e.op("Identity", emb, out=outs[2])
    _layer_norm_of(e, emb, gamma, beta, float(_attrs(node).get("epsilon", 1e-12)), [outs[0], "", ""])
    if outs[1]:
        count = e.op("ReduceSum", e.op("Cast", mask, to=onnx.TensorProto.INT64), e.ints([1]), keepdims=0)
        e.op("Cast", count, out=outs[1], to=onnx.TensorProto.INT32)
    return True


def _same_size(e: _Emit, a: str, i: int, b: str, j: int) -> bool:
    """Whether axis i of ``a`` and axis j of ``b`` are known to have the same size."""
    sa, sb = e.infos.get(a), e.infos.get(b)
    if sa is None or sb is None or sa.shape is None or sb.shape is None:
        return False
    da, db = sa.shape[i], sb.shape[j]
    return da is not None and da == db


def _elem(e: _Emit) -> int:
    return helper.np_dtype_to_tensor_dtype(e.dtype)


_LOWERINGS: dict[str, Callable[[_Emit, onnx.NodeProto], bool]] = {
    "Attention": _attention, "EmbedLayerNormalization": _embed_layer_norm,
    "FusedConv": _fused_conv, "FusedGemm": _fused_gemm,
    "Gelu": _gelu, "BiasGelu": _bias_gelu, "FastGelu": _fast_gelu, "QuickGelu": _quick_gelu,
    "LayerNormalization": _layer_norm, "SkipLayerNormalization": _skip_layer_norm,
    "SimplifiedLayerNormalization": _simplified_layer_norm,
    "SkipSimplifiedLayerNormalization": _skip_simplified_layer_norm, "FusedMatMul": _fused_matmul,
}
LOWERED = tuple(_LOWERINGS)


def lower_contrib_ops(model: onnx.ModelProto, weights: dict[str, np.ndarray]) -> list[str]:
    """Replace, in place, the onnxruntime-only nodes above (cases in the module docstring) by default-domain
    nodes; returns the op types replaced."""
    graph = model.graph
    opset = default_opset(model) or 17
    lowered: list[str] = []
    lengths = {n.output[1] for n in graph.node if n.domain == CONTRIB and n.op_type == "EmbedLayerNormalization"
               and len(n.output) > 1 and n.output[1]}
    # ONNX inference stops at contrib ops it has no schema for: a rank a rewrite needs (FusedMatMul's transpose)
    # may be known only once the ops before it are rewritten, so rewrite in rounds
    for _ in range(_ROUNDS):
        if not any(_lowerable(n, opset) for n in graph.node):
            break
        view = clone(model)
        declare_as_inputs(view, weights)
        infos = infer_tensor_info(view)  # element types (constants) and ranks (transposes)
        taken = used_names(graph) | set(weights)
        nodes, before = [], len(lowered)
        for node in graph.node:
            emit = _Emit(node, taken, opset, infos, weights, lengths) if _lowerable(node, opset) else None
            if emit is not None and _LOWERINGS[node.op_type](emit, node):
                nodes += emit.nodes
                lowered.append(node.op_type)
            else:
                nodes.append(node)
        del graph.node[:]
        graph.node.extend(nodes)
        if len(lowered) == before:
            break
    return lowered


_ROUNDS = 3

# onnxruntime registers these two in the default domain, where the ONNX standard has no such op (LayerNormalization
# before opset 17): its optimizer writes them there for a model of an older opset
_DEFAULT_DOMAIN = {"LayerNormalization": 17, "SimplifiedLayerNormalization": 10**6}


def _lowerable(node: onnx.NodeProto, opset: int) -> bool:
    if node.domain == CONTRIB:
        return node.op_type in _LOWERINGS
    return node.domain in ("", "ai.onnx") and opset < _DEFAULT_DOMAIN.get(node.op_type, 0)
