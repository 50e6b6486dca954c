"""Convolution kernels in isolation: onnxruntime (standard ONNX formulations) against torch (oneDNN), per layer.

    python bench/conv_kernels.py --workload resnet18            # every distinct Conv2d layer of the workload
    python bench/conv_kernels.py --workload resnet18 --torch-profile 5   # torch.profiler over 5 training steps
    options: --rounds 3 --runs 7 --threads 2 --kernels fwd,dx,dw --only SUBSTRING --json OUT.jsonl

For each distinct Conv2d of the workload (shapes captured with forward hooks on the torch model, at the
benchmark's batch), times the forward convolution, the input gradient (dX) and the weight gradient (dW):
torch through ``aten.convolution`` / ``aten.convolution_backward`` (what autograd calls), and onnxruntime
running one small graph per formulation: ``rule`` is exactly what onnxtrain's gradient rule emits (built by
``onnxtrain.autodiff``), the others are alternatives written here. Every formulation's result is checked
against torch's before it is timed. Times are the lowest of --runs runs, each variant in turn within a round
(interleaved), the lowest over --rounds rounds; GFLOP/s counts 2 x MACs. The last table weights each kernel
by the layer's count in the network: the per-step time of the convolutions alone, by kernel and variant.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402


@dataclass(frozen=True)
class Layer:
    """One Conv2d: input (N, C, H, W), weight (Co, C // groups, kh, kw)."""

    n: int
    c: int
    h: int
    w: int
    co: int
    k: tuple
    stride: tuple
    pad: tuple
    dilation: tuple
    groups: int

    @property
    def out_hw(self):
        return tuple((s + 2 * p - d * (k - 1) - 1) // st + 1
                     for s, p, d, k, st in zip((self.h, self.w), self.pad, self.dilation, self.k, self.stride))

    @property
    def x_shape(self):
        return (self.n, self.c, self.h, self.w)

    @property
    def w_shape(self):
        return (self.co, self.c // self.groups, *self.k)

    @property
    def y_shape(self):
        return (self.n, self.co, *self.out_hw)

    @property
    def macs(self):
        return int(np.prod(self.y_shape)) * (self.c // self.groups) * int(np.prod(self.k))

    def __str__(self):
        kind = "dw" if self.groups == self.c == self.co else (f"g{self.groups}" if self.groups > 1 else "")
        return (f"{self.c}->{self.co} {self.k[0]}x{self.k[1]}/s{self.stride[0]} {kind} "
                f"@{self.h}x{self.w} n{self.n}").replace("  ", " ")

    @property
    def attrs(self):
        return dict(strides=list(self.stride), pads=[*self.pad, *self.pad], dilations=list(self.dilation),
                    group=self.groups)


def workload_layers(name: str) -> list[tuple[Layer, int]]:
    """The distinct Conv2d layers of a benchmark workload at its batch size, with how often each occurs."""
    import torch

    import workloads
    from common import make_batch

    model = workloads.build(name)
    found = []

    def hook(m, inp, out):
        x = inp[0]
        found.append(Layer(x.shape[0], x.shape[1], x.shape[2], x.shape[3], m.out_channels, tuple(m.kernel_size),
                           tuple(m.stride), tuple(m.padding), tuple(m.dilation), m.groups))

    for m in model.modules():
        if isinstance(m, torch.nn.Conv2d):
            m.register_forward_hook(hook)
    with torch.no_grad():
        model(torch.from_numpy(make_batch(name)[0]))
    return list(collections.Counter(found).items())


# -- onnxruntime formulations ----------------------------------------------------------------------------------

def _model(nodes, inputs: dict, output: str, out_shape, initializers=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "kernel", [helper.make_tensor_value_info(k, TensorProto.FLOAT, s)
                                                for k, s in inputs.items()],
                              [helper.make_tensor_value_info(output, TensorProto.FLOAT, out_shape)],
                              initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return model


def forward_model(layer: Layer) -> onnx.ModelProto:
    node = helper.make_node("Conv", ["x", "w"], ["y"], **layer.attrs)
    return _model([node], {"x": layer.x_shape, "w": layer.w_shape}, "y", layer.y_shape)


def rule_model(layer: Layer, wrt: str) -> onnx.ModelProto:
    """What onnxtrain's Conv gradient rule emits for d``wrt`` (x or w), fed dY as the input ``dy``."""
    from onnxtrain.autodiff import build_gradients
    from onnxtrain.ir.builder import GraphBuilder
    from onnxtrain.ir.passes import prune_nodes
    from onnxtrain.ir.types import infer_tensor_info

    fwd = forward_model(layer)
    fwd.graph.input.append(helper.make_tensor_value_info("dy", TensorProto.FLOAT, layer.y_shape))
    infos = infer_tensor_info(fwd)
    b = GraphBuilder(18, taken={"x", "w", "y", "dy"}, prefix="grad/")
    grads = build_gradients(list(fwd.graph.node), "y", [wrt], b, infos, seed="dy")
    b.node("Identity", [grads[wrt]], ["out"])
    nodes = prune_nodes([*fwd.graph.node, *b.nodes], ["out"])
    used = {i for n in nodes for i in n.input}
    inputs = {k: s for k, s in (("x", layer.x_shape), ("w", layer.w_shape), ("dy", layer.y_shape)) if k in used}
    inits = [t for t in b.initializers if t.name in used]
    return _model(nodes, inputs, "out", layer.x_shape if wrt == "x" else layer.w_shape, inits)


VARIANTS: dict[str, dict] = {"fwd": {}, "dx": {}, "dw": {}}


def variant(kernel: str, name: str):
    def register(fn):
        VARIANTS[kernel][name] = fn
        return fn
    return register


@variant("fwd", "Conv")
def _fwd_conv(layer):
    return forward_model(layer)


@variant("dx", "rule")
def _dx_rule(layer):
    return rule_model(layer, "x")


@variant("dw", "rule")
def _dw_rule(layer):
    return rule_model(layer, "w")


@variant("dx", "ConvTranspose")
def _dx_conv_transpose(layer):
    ho, wo = layer.out_hw
    op = [layer.h + 2 * p - ((o - 1) * s + (k - 1) * d + 1) for p, o, s, k, d in
          zip(layer.pad, (ho, wo), layer.stride, layer.k, layer.dilation)]
    node = helper.make_node("ConvTranspose", ["dy", "w"], ["out"], **layer.attrs,
                            **({"output_padding": op} if any(op) else {}))
    return _model([node], {"dy": layer.y_shape, "w": layer.w_shape}, "out", layer.x_shape)


def built(layer: Layer, inputs: tuple, out_shape, emit) -> onnx.ModelProto:
    """A model from ``emit(op, b, layer) -> output name``, written with onnxtrain's GraphBuilder."""
    from onnxtrain.ir.builder import GraphBuilder

    shapes = {"x": layer.x_shape, "w": layer.w_shape, "dy": layer.y_shape}
    b = GraphBuilder(18, taken=set(shapes), prefix="v/")
    b.node("Identity", [emit(b.op, b, layer)], ["out"])
    return _model(b.nodes, {k: shapes[k] for k in inputs}, "out", out_shape, b.initializers)


def _depthwise(layer: Layer) -> bool:
    return layer.groups == layer.c == layer.co


def _one_hot_patches(op, b, layer: Layer, x: str) -> str:
    """(N, C*K, Ho, Wo): the K window elements of every output position, one channel each (depthwise Conv)."""
    window = int(np.prod(layer.k))
    one_hot = np.tile(np.eye(window, dtype=np.float32), (layer.c, 1)).reshape(layer.c * window, 1, *layer.k)
    return op.Conv(x, b.const(one_hot), strides=list(layer.stride), pads=[*layer.pad, *layer.pad],
                   dilations=list(layer.dilation), group=layer.c)


@variant("dw", "dw_slices")
def _dw_slices(layer):
    """Depthwise dW: for each kernel offset, a strided Slice of padded X times dY, summed over N and positions."""
    if not _depthwise(layer):
        return None

    def emit(op, b, la):
        ph, pw = la.pad
        xp = op.Pad("x", b.ints([0, 0, ph, pw, 0, 0, ph, pw])) if ph or pw else "x"
        ho, wo = la.out_hw
        sums = []
        for i in range(la.k[0]):
            for j in range(la.k[1]):
                start = [i * la.dilation[0], j * la.dilation[1]]
                end = [start[0] + (ho - 1) * la.stride[0] + 1, start[1] + (wo - 1) * la.stride[1] + 1]
                window = op.Slice(xp, b.ints(start), b.ints(end), b.ints([2, 3]), b.ints(list(la.stride)))
                sums.append(b.reduce("ReduceSum", op.Mul(window, "dy"), [0, 2, 3], keepdims=True))
        return op.Reshape(op.Concat(*sums, axis=2), b.ints(list(la.w_shape)))    # (1, C, K, 1)
    return built(layer, ("x", "dy"), layer.w_shape, emit)


@variant("dw", "dw_patches_mul")
def _dw_patches_mul(layer):
    """Depthwise dW: one-hot patches (N, C, K, P) times dY (N, C, 1, P), summed over N and P."""
    if not _depthwise(layer):
        return None

    def emit(op, b, la):
        k = int(np.prod(la.k))
        patches = op.Reshape(_one_hot_patches(op, b, la, "x"), b.ints([0, la.c, k, -1]))
        prod = op.Mul(patches, op.Reshape("dy", b.ints([0, la.c, 1, -1])))
        return op.Reshape(b.reduce("ReduceSum", prod, [0, 3], keepdims=False), b.ints(list(la.w_shape)))
    return built(layer, ("x", "dy"), layer.w_shape, emit)


@variant("dw", "dw_patches_matmul")
def _dw_patches_matmul(layer):
    """Depthwise dW: one-hot patches (N, C, K, P) @ dY (N, C, P, 1), summed over N."""
    if not _depthwise(layer):
        return None

    def emit(op, b, la):
        k = int(np.prod(la.k))
        patches = op.Reshape(_one_hot_patches(op, b, la, "x"), b.ints([0, la.c, k, -1]))
        prod = op.MatMul(patches, op.Reshape("dy", b.ints([0, la.c, -1, 1])))
        return op.Reshape(b.reduce("ReduceSum", prod, [0], keepdims=False), b.ints(list(la.w_shape)))
    return built(layer, ("x", "dy"), layer.w_shape, emit)


def _flat_windows(op, b, la: Layer):
    """Padded X flattened per (n, c) to (N, C, Hp*Wp) and dY padded to Wp columns, flattened to (N, C, Ho*Wp):
    with stride 1, window offset (i, j) of X is then the contiguous run starting at i*Wp + j."""
    (ph, pw), (ho, wo) = la.pad, la.out_hw
    wp = la.w + 2 * pw
    # one more row at the bottom: the last windows run past the last row by up to (k - 1) d elements
    xp = op.Pad("x", b.ints([0, 0, ph, pw, 0, 0, ph + 1, pw]))
    dyp = op.Pad("dy", b.ints([0, 0, 0, 0, 0, 0, 0, wp - wo])) if wp != wo else "dy"
    return (op.Reshape(xp, b.ints([0, 0, -1])), op.Reshape(dyp, b.ints([0, 0, -1])), wp, ho * wp)


def _stride1_depthwise(layer: Layer) -> bool:
    return _depthwise(layer) and layer.stride == (1, 1)


@variant("dw", "dw_flat_slices")
def _dw_flat_slices(layer):
    """Depthwise dW, stride 1: 9 contiguous slices of flattened padded X, each times dY, summed."""
    if not _stride1_depthwise(layer):
        return None

    def emit(op, b, la):
        xf, df, wp, q = _flat_windows(op, b, la)
        sums = []
        for i in range(la.k[0]):
            for j in range(la.k[1]):
                t = i * la.dilation[0] * wp + j * la.dilation[1]
                window = op.Slice(xf, b.ints([t]), b.ints([t + q]), b.ints([2]))
                sums.append(b.reduce("ReduceSum", op.Mul(window, df), [0, 2], keepdims=True))   # (1, C, 1)
        return op.Reshape(op.Concat(*sums, axis=2), b.ints(list(la.w_shape)))
    return built(layer, ("x", "dy"), layer.w_shape, emit)


@variant("dw", "dw_flat_gather")
def _dw_flat_gather(layer):
    """Depthwise dW, stride 1: one Gather of the 9 windows of flattened padded X, (N, C, 9, Q) @ dY (N, C, Q, 1)."""
    if not _stride1_depthwise(layer):
        return None

    def emit(op, b, la):
        xf, df, wp, q = _flat_windows(op, b, la)
        offsets = [i * la.dilation[0] * wp + j * la.dilation[1] for i in range(la.k[0]) for j in range(la.k[1])]
        index = np.asarray(offsets, np.int64)[:, None] + np.arange(q, dtype=np.int64)[None, :]
        windows = op.Gather(xf, b.const(index), axis=2)                          # (N, C, 9, Q)
        prod = op.MatMul(windows, op.Unsqueeze(df, b.ints([3])))                 # (N, C, 9, 1)
        return op.Reshape(b.reduce("ReduceSum", prod, [0], keepdims=False), b.ints(list(la.w_shape)))
    return built(layer, ("x", "dy"), layer.w_shape, emit)


def _phase_windows(op, b, la: Layer, matmul: bool):
    """Depthwise dW for any stride: X (padded) split into stride phases, each flattened per (n, c); window
    (i, j) is then a contiguous run of one phase, dotted with dY padded to the phase's row width."""
    (ph, pw), (ho, wo), (sh, sw), (dh, dw) = la.pad, la.out_hw, la.stride, la.dilation
    hq = max(-(-(la.h + 2 * ph) // sh), ho + (la.k[0] - 1) * dh // sh) + 1
    wq = max(-(-(la.w + 2 * pw) // sw), wo + (la.k[1] - 1) * dw // sw)
    xp = op.Pad("x", b.ints([0, 0, ph, pw, 0, 0, hq * sh - la.h - ph, wq * sw - la.w - pw]))
    phases = {}
    for a in range(sh):
        for c in range(sw):
            part = xp if sh == sw == 1 else op.Slice(xp, b.ints([a, c]), b.ints([hq * sh, wq * sw]), b.ints([2, 3]),
                                                     b.ints([sh, sw]))
            phases[a, c] = op.Reshape(part, b.ints([0, 0, -1]))                      # (N, C, hq*wq)
    dyf = op.Reshape(op.Pad("dy", b.ints([0, 0, 0, 0, 0, 0, 0, wq - wo])) if wq != wo else "dy", b.ints([0, 0, -1]))
    q = ho * wq
    if matmul:
        dyf = op.Unsqueeze(dyf, b.ints([3]))
    sums = []
    for i in range(la.k[0]):
        for j in range(la.k[1]):
            (a, oi), (c, oj) = divmod(i * dh, sh)[::-1], divmod(j * dw, sw)[::-1]
            t = oi * wq + oj
            window = op.Slice(phases[a, c], b.ints([t]), b.ints([t + q]), b.ints([2]))
            if matmul:
                sums.append(b.reduce("ReduceSum", op.MatMul(op.Unsqueeze(window, b.ints([2])), dyf), [0],
                                     keepdims=True))                                  # (1, C, 1, 1)
            else:
                sums.append(b.reduce("ReduceSum", op.Mul(window, dyf), [0, 2], keepdims=True))
    return op.Reshape(op.Concat(*sums, axis=2), b.ints(list(la.w_shape)))


@variant("dw", "dw_phase_slices")
def _dw_phase_slices(layer):
    if not _depthwise(layer):
        return None
    return built(layer, ("x", "dy"), layer.w_shape, lambda op, b, la: _phase_windows(op, b, la, False))


@variant("dw", "dw_phase_mm")
def _dw_phase_mm(layer):
    if not _depthwise(layer):
        return None
    return built(layer, ("x", "dy"), layer.w_shape, lambda op, b, la: _phase_windows(op, b, la, True))


@variant("dx", "dx_dw_windowed")
def _dx_dw_windowed(layer):
    """Depthwise dX: each kernel element's dY * w[c, k] placed (Pad) at its offset on X's padded stride-phase
    grid and summed; the phases interleaved back, the padding cut."""
    if not _depthwise(layer):
        return None

    def emit(op, b, la):
        (ph, pw), (ho, wo), (sh, sw), (dh, dw) = la.pad, la.out_hw, la.stride, la.dilation
        hq = max(-(-(la.h + 2 * ph) // sh), ho + (la.k[0] - 1) * dh // sh) + 1
        wq = max(-(-(la.w + 2 * pw) // sw), wo + (la.k[1] - 1) * dw // sw)
        dyf = op.Reshape(op.Pad("dy", b.ints([0, 0, 0, 0, 0, 0, 0, wq - wo])) if wq != wo else "dy",
                         b.ints([0, 0, -1]))
        q, total = ho * wq, hq * wq
        wk = op.Reshape("w", b.ints([1, la.c, -1]))
        parts = collections.defaultdict(list)
        for i in range(la.k[0]):
            for j in range(la.k[1]):
                (a, oi), (c, oj) = divmod(i * dh, sh)[::-1], divmod(j * dw, sw)[::-1]
                t = oi * wq + oj
                kk = i * la.k[1] + j
                prod = op.Mul(dyf, op.Slice(wk, b.ints([kk]), b.ints([kk + 1]), b.ints([2])))
                parts[a, c].append(op.Pad(prod, b.ints([0, 0, t, 0, 0, total - t - q])))
        phases = [op.Sum(*parts[a, c]) if len(parts[a, c]) > 1 else parts[a, c][0]
                  for a in range(sh) for c in range(sw)]
        if sh == sw == 1:
            grid = op.Reshape(phases[0], b.ints([0, 0, hq, wq]))
        else:
            stacked = op.Reshape(op.Concat(*phases, axis=2), b.ints([0, 0, sh, sw, hq, wq]))
            grid = op.Reshape(op.Transpose(stacked, perm=[0, 1, 4, 2, 5, 3]), b.ints([0, 0, hq * sh, wq * sw]))
        return op.Slice(grid, b.ints([ph, pw]), b.ints([ph + la.h, pw + la.w]), b.ints([2, 3]))
    return built(layer, ("w", "dy"), layer.x_shape, emit)


def _block_diagonal(op, b, la: Layer, block: int, flip: bool) -> str:
    """Depthwise weights (C, 1, kh, kw) as block-diagonal grouped weights (C, block, kh, kw) for C / block groups."""
    mask = (np.arange(la.c)[:, None] % block == np.arange(block)[None, :]).astype(np.float32)
    w = op.Mul("w", b.const(mask.reshape(la.c, block, 1, 1)))
    if flip:
        w = op.Slice(w, b.ints([-1, -1]), b.ints([-(2**62), -(2**62)]), b.ints([2, 3]), b.ints([-1, -1]))
    return w


for _block in (8, 16, 32):
    def _dx_dw_blockdiag(layer, block=_block):
        """Depthwise dX as a grouped Conv (stride 1) / ConvTranspose over blocks of channels, block-diagonal weights."""
        if not _depthwise(layer) or layer.c % block:
            return None

        def emit(op, b, la):
            if la.stride == (1, 1):
                pads = [(k - 1) * d - p for k, d, p in zip(la.k, la.dilation, la.pad)]
                return op.Conv("dy", _block_diagonal(op, b, la, block, True), pads=pads * 2,
                               dilations=list(la.dilation), group=la.c // block)
            ho, wo = la.out_hw
            outpad = [s_ + 2 * p - ((o - 1) * st + (k - 1) * d + 1) for s_, p, o, st, k, d in
                      zip((la.h, la.w), la.pad, (ho, wo), la.stride, la.k, la.dilation)]
            return op.ConvTranspose("dy", _block_diagonal(op, b, la, block, False), strides=list(la.stride),
                                    pads=[*la.pad, *la.pad], dilations=list(la.dilation), group=la.c // block,
                                    output_padding=outpad)
        return built(layer, ("w", "dy"), layer.x_shape, emit)
    variant("dx", f"dx_dw_block{_block}")(_dx_dw_blockdiag)


@variant("dx", "dx_flip_matmul")
def _dx_flip_matmul(layer):
    """Stride-1 dX as a Conv with W's channel axes swapped (Transpose) and its window flipped by a MatMul with
    the exchange matrix, instead of a Slice with step -1."""
    if layer.stride != (1, 1) or layer.groups != 1 or layer.k == (1, 1):
        return None

    def emit(op, b, la):
        k = int(np.prod(la.k))
        wt = op.Transpose(op.Reshape("w", b.ints([la.co, la.c, k])), perm=[1, 0, 2])           # (Ci, Co, K)
        flipped = op.MatMul(wt, b.const(np.eye(k, dtype=np.float32)[::-1].copy()))
        pads = [(kk - 1) * d - p for kk, d, p in zip(la.k, la.dilation, la.pad)]
        return op.Conv("dy", op.Reshape(flipped, b.ints([la.c, la.co, *la.k])), pads=pads * 2,
                       dilations=list(la.dilation))
    return built(layer, ("w", "dy"), layer.x_shape, emit)


@variant("dx", "dx_flip_first")
def _dx_flip_first(layer):
    """As the rule, but the window flipped (MatMul with the exchange matrix) before the channel Transpose."""
    if layer.stride != (1, 1) or layer.groups != 1 or layer.k == (1, 1):
        return None

    def emit(op, b, la):
        k = int(np.prod(la.k))
        flipped = op.MatMul(op.Reshape("w", b.ints([la.co, la.c, k])),
                            b.const(np.eye(k, dtype=np.float32)[::-1].copy()))
        wt = op.Transpose(flipped, perm=[1, 0, 2])
        pads = [(kk - 1) * d - p for kk, d, p in zip(la.k, la.dilation, la.pad)]
        return op.Conv("dy", op.Reshape(wt, b.ints([la.c, la.co, *la.k])), pads=pads * 2,
                       dilations=list(la.dilation))
    return built(layer, ("w", "dy"), layer.x_shape, emit)


@variant("dx", "dx_gemm_col2im")
def _dx_gemm_col2im(layer):
    """dX = Col2Im(W^T dY): one GEMM over the whole batch ((Ci K, Co) x (Co, N P)), the columns moved back to
    (N, Ci K, P), then Col2Im sums the overlapping windows (any stride, pads, dilations)."""
    if layer.groups != 1:
        return None

    def emit(op, b, la):
        k = int(np.prod(la.k))
        p = int(np.prod(la.out_hw))
        dyt = op.Reshape(op.Transpose(op.Reshape("dy", b.ints([la.n, la.co, p])), perm=[1, 0, 2]),
                         b.ints([la.co, la.n * p]))
        cols = op.Gemm(op.Reshape("w", b.ints([la.co, la.c * k])), dyt, transA=1)          # (Ci K, N P)
        cols = op.Transpose(op.Reshape(cols, b.ints([la.c * k, la.n, p])), perm=[1, 0, 2])
        return op.Col2Im(cols, b.ints([la.h, la.w]), b.ints(list(la.k)), dilations=list(la.dilation),
                         pads=[*la.pad, *la.pad], strides=list(la.stride))
    return built(layer, ("w", "dy"), layer.x_shape, emit)


@variant("dx", "dx_bmm_col2im")
def _dx_bmm_col2im(layer):
    """dX = Col2Im(W^T dY) with the product per sample ((Ci K, Co) x (N, Co, P)): no transposes."""
    if layer.groups != 1:
        return None

    def emit(op, b, la):
        k = int(np.prod(la.k))
        cols = op.MatMul(op.Transpose(op.Reshape("w", b.ints([la.co, la.c * k])), perm=[1, 0]),
                         op.Reshape("dy", b.ints([0, la.co, -1])))                        # (N, Ci K, P)
        return op.Col2Im(cols, b.ints([la.h, la.w]), b.ints(list(la.k)), dilations=list(la.dilation),
                         pads=[*la.pad, *la.pad], strides=list(la.stride))
    return built(layer, ("w", "dy"), layer.x_shape, emit)


def _shift_gemm(op, b, la: Layer, batched: bool) -> str:
    """Dense dW one kernel element at a time: dW[:, :, k] = dY (Co, N P) x window_k(X)^T (N P, Ci), with the
    windows contiguous runs of X's flattened stride phases (as the depthwise windowed form)."""
    (ph, pw), (ho, wo), (sh, sw), (dh, dw) = la.pad, la.out_hw, la.stride, la.dilation
    hq = max(-(-(la.h + 2 * ph) // sh), ho + (la.k[0] - 1) * dh // sh) + 1
    wq = max(-(-(la.w + 2 * pw) // sw), wo + (la.k[1] - 1) * dw // sw)
    x = "x" if batched else op.Transpose("x", perm=[1, 0, 2, 3])                      # (Ci, N, H, W)
    xp = op.Pad(x, b.ints([0, 0, ph, pw, 0, 0, hq * sh - la.h - ph, wq * sw - la.w - pw]))
    phases = {}
    for a in range(sh):
        for c in range(sw):
            part = xp if sh == sw == 1 else op.Slice(xp, b.ints([a, c]), b.ints([hq * sh, wq * sw]), b.ints([2, 3]),
                                                     b.ints([sh, sw]))
            phases[a, c] = op.Reshape(part, b.ints([0, 0, -1]))
    q = ho * wq
    dyp = op.Pad("dy", b.ints([0, 0, 0, 0, 0, 0, 0, wq - wo])) if wq != wo else "dy"
    if batched:
        dyf = op.Reshape(dyp, b.ints([0, 0, -1]))                                    # (N, Co, Q)
    else:
        dyf = op.Reshape(op.Transpose(dyp, perm=[1, 0, 2, 3]), b.ints([la.co, -1]))   # (Co, N Q)
    cols = []
    for i in range(la.k[0]):
        for j in range(la.k[1]):
            (a, oi), (c, oj) = divmod(i * dh, sh)[::-1], divmod(j * dw, sw)[::-1]
            t = oi * wq + oj
            win = op.Slice(phases[a, c], b.ints([t]), b.ints([t + q]), b.ints([2]))
            if batched:
                g = b.reduce("ReduceSum", op.MatMul(dyf, op.Transpose(win, perm=[0, 2, 1])), [0], keepdims=False)
            else:
                g = op.Gemm(dyf, op.Reshape(win, b.ints([la.c, -1])), transB=1)
            cols.append(op.Unsqueeze(g, b.ints([2])))
    return op.Reshape(op.Concat(*cols, axis=2), b.ints(list(la.w_shape)))


@variant("dw", "dw_shift_bmm")
def _dw_shift_bmm(layer):
    if layer.groups != 1:
        return None
    return built(layer, ("x", "dy"), layer.w_shape, lambda op, b, la: _shift_gemm(op, b, la, True))


@variant("dw", "dw_shift_gemm")
def _dw_shift_gemm(layer):
    if layer.groups != 1:
        return None
    return built(layer, ("x", "dy"), layer.w_shape, lambda op, b, la: _shift_gemm(op, b, la, False))


@variant("dw", "dw_swapped_conv")
def _dw_swapped_conv(layer):
    """dW as one Conv of X with dY as the kernel, batch and channels swapped: no patches in memory."""
    if layer.groups != 1:
        return None

    def emit(op, b, la):
        xs = op.Transpose("x", perm=[1, 0, 2, 3])                                    # (Ci, N, H, W)
        ks = op.Transpose("dy", perm=[1, 0, 2, 3])                                   # (Co, N, Ho, Wo)
        out = op.Conv(xs, ks, strides=list(la.dilation), dilations=list(la.stride), pads=[*la.pad, *la.pad])
        out = op.Slice(out, b.ints([0, 0]), b.ints(list(la.k)), b.ints([2, 3]))       # (Ci, Co, kh, kw)
        return op.Transpose(out, perm=[1, 0, 2, 3])

    return built(layer, ("x", "dy"), layer.w_shape, emit)


@variant("dw", "dw_patch_rows")
def _dw_patch_rows(layer):
    """The rule's patches, one kernel row at a time: each row's patches (1/kh of them) are consumed at once."""
    if layer.groups != 1 or layer.k[0] == 1:
        return None

    def emit(op, b, la):
        kh, kw = la.k
        dyf = op.Reshape("dy", b.ints([0, la.co, -1]))                                # (N, Co, P)
        rows = []
        for i in range(kh):
            one_hot = np.zeros((la.c * kw, 1, kh, kw), np.float32)
            for c in range(la.c):
                for j in range(kw):
                    one_hot[c * kw + j, 0, i, j] = 1
            patches = op.Conv("x", b.const(one_hot), strides=list(la.stride), pads=[*la.pad, *la.pad],
                              dilations=list(la.dilation), group=la.c)               # (N, Ci*kw, Ho, Wo)
            flat = op.Reshape(patches, b.ints([0, la.c * kw, -1]))
            g = b.reduce("ReduceSum", op.MatMul(dyf, op.Transpose(flat, perm=[0, 2, 1])), [0], keepdims=False)
            rows.append(op.Reshape(g, b.ints([la.co, la.c, 1, kw])))
        return op.Concat(*rows, axis=2)

    return built(layer, ("x", "dy"), layer.w_shape, emit)


# -- torch -------------------------------------------------------------------------------------------------------

def torch_kernel(layer: Layer, kernel: str, x, w, dy):
    import torch

    args = (list(layer.stride), list(layer.pad), list(layer.dilation))
    if kernel == "fwd":
        return lambda: torch.ops.aten.convolution(x, w, None, *args, False, [0, 0], layer.groups)
    mask = [kernel == "dx", kernel == "dw", False]
    index = 0 if kernel == "dx" else 1
    return lambda: torch.ops.aten.convolution_backward(dy, x, w, None, *args, False, [0, 0], layer.groups,
                                                       mask)[index]


# -- timing ------------------------------------------------------------------------------------------------------

CLOCK = time.perf_counter   # time.thread_time with --threads 1 (see main)


def _lowest(fn, runs: int) -> float:
    fn()
    best = float("inf")
    for _ in range(runs):
        t = CLOCK()
        fn()
        best = min(best, CLOCK() - t)
    return best


def ort_runner(model: onnx.ModelProto, feeds: dict, threads: int):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    so.log_severity_level = 3
    so.add_session_config_entry("session.force_spinning_stop", "1")   # as onnxtrain's sessions
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}
    bound = {k: v for k, v in feeds.items() if k in names}
    return lambda: sess.run(None, bound)[0]


def measure(layers, kernels, impl: str, runs: int, threads: int, only: str | None) -> dict:
    """{(layer, kernel): {variant: seconds}} for one implementation (torch, or every onnxruntime variant)."""
    import torch

    torch.set_num_threads(threads if impl == "torch" else 1)   # no idle OpenMP threads beside onnxruntime's
    rng = np.random.default_rng(0)
    out = {}
    for layer, _ in layers:
        feeds = {"x": rng.standard_normal(layer.x_shape, dtype=np.float32),
                 "w": rng.standard_normal(layer.w_shape, dtype=np.float32) * 0.1,
                 "dy": rng.standard_normal(layer.y_shape, dtype=np.float32)}
        tx, tw, tdy = (torch.from_numpy(feeds[k]) for k in ("x", "w", "dy"))
        for kernel in kernels:
            ref_fn = torch_kernel(layer, kernel, tx, tw, tdy)
            if impl == "torch":
                out[f"{layer}|{kernel}"] = {"torch": _lowest(ref_fn, runs)}
                continue
            ref = ref_fn().numpy()
            fns = {}
            for name, build in VARIANTS[kernel].items():
                if only and not any(o in name for o in only.split(",")) and name not in ("rule", "Conv"):
                    continue
                model = build(layer)
                if model is None:      # the formulation does not apply to this layer
                    continue
                fn = ort_runner(model, feeds, threads)
                got = fn()
                scale = float(np.abs(ref).max()) or 1.0
                if got.shape != ref.shape or not np.allclose(got, ref, rtol=1e-3, atol=1e-4 * scale):
                    err = "shape" if got.shape != ref.shape else f"max err {np.abs(got - ref).max():.3g}"
                    print(f"  {layer} {kernel} {name}: WRONG ({err}), skipped", file=sys.stderr)
                    continue
                fns[name] = fn
            best = dict.fromkeys(fns, float("inf"))
            for _ in range(2):     # interleaved within the process too
                for name, fn in fns.items():
                    best[name] = min(best[name], _lowest(fn, runs))
            out[f"{layer}|{kernel}"] = best
    return out


def run_rounds(args, layers) -> list[dict]:
    """Alternate one torch process and one onnxruntime process per round (torch's OpenMP threads and
    onnxruntime's spinning threads would compete inside one process); keep each kernel's lowest time."""
    import subprocess

    best: dict[str, dict[str, float]] = {}
    for r in range(args.rounds):
        for impl in ("ort", "torch"):
            cmd = [sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--impl", impl]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if proc.returncode:
                raise SystemExit(f"{impl} process failed:\n{proc.stderr[-3000:]}")
            sys.stderr.write("".join(line + "\n" for line in proc.stderr.splitlines() if "WRONG" in line))
            times = json.loads(proc.stdout.strip().splitlines()[-1])
            for key, per in times.items():
                slot = best.setdefault(key, {})
                for name, t in per.items():
                    slot[name] = min(slot.get(name, float("inf")), t)
        print(f"round {r + 1}: load average {os.getloadavg()[0]:.1f}", flush=True)
    counts = {str(la): c for la, c in layers}
    macs = {str(la): la.macs for la, c in layers}
    results = []
    for key, per in best.items():
        layer, kernel = key.split("|")
        ms = {"torch": per.pop("torch") * 1e3, **{k: v * 1e3 for k, v in per.items()}}
        results.append(dict(layer=layer, count=counts[layer], kernel=kernel, gflop=2 * macs[layer] / 1e9, ms=ms))
    return results


def report(results):
    print("\nPer kernel (ms, GFLOP/s in brackets, ratio to torch):")
    for r in results:
        t = r["ms"]["torch"]
        cells = "  ".join(f"{k} {v:.2f} ({r['gflop'] / v * 1e3:.0f}, {v / t:.2f}x)" for k, v in r["ms"].items())
        print(f"  {r['layer']:34s} {r['kernel']:3s} {cells}")
    print("\nPer step, the count-weighted sum of each kernel (ms): torch, the rule, the best variant per layer "
          "(dx counts the first layer too, whose dX training never computes)")
    totals = collections.defaultdict(lambda: collections.Counter())
    for r in results:
        ms = r["ms"]
        ort = {k: v for k, v in ms.items() if k != "torch"}
        tot = totals[r["kernel"]]
        tot["torch"] += r["count"] * ms["torch"]
        tot["rule"] += r["count"] * ms.get("rule", ms.get("Conv", 0.0))
        tot["best"] += r["count"] * min(ort.values())
        tot["gflop"] += r["count"] * r["gflop"]
    for kernel, tot in totals.items():
        rate = tot["gflop"] / tot["torch"] * 1e3
        print(f"  {kernel:3s} {tot['gflop']:6.2f} GFLOP  torch {tot['torch']:7.1f} ({rate:.0f} GFLOP/s)"
              f"  rule {tot['rule']:7.1f} ({tot['rule'] / tot['torch']:.2f}x)  best {tot['best']:7.1f} "
              f"({tot['best'] / tot['torch']:.2f}x)")


def torch_profile(workload: str, steps: int, threads: int) -> None:
    """torch.profiler over training steps of the workload (as bench/run_torch.py: AdamW, cross-entropy): self
    CPU time per aten op, per step, to set beside profile_ops.py's onnxruntime table."""
    import torch
    import torch.nn.functional as F

    import workloads
    from common import ADAMW, make_batch

    torch.set_num_threads(threads)
    model = workloads.build(workload)
    x, y = (torch.from_numpy(a) for a in make_batch(workload))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], **ADAMW)

    def step():
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        optimizer.step()

    for _ in range(3):
        step()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        t = time.perf_counter()
        for _ in range(steps):
            step()
        wall = (time.perf_counter() - t) / steps
    rows = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    total = sum(e.self_cpu_time_total for e in rows) or 1
    print(f"torch {workload}: {wall * 1e3:.1f} ms per step (profiled), {threads} threads, "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"  {'aten op':<44} {'self ms/step':>12} {'share':>7} {'calls/step':>10}")
    for e in rows[:20]:
        print(f"  {e.key[:44]:<44} {e.self_cpu_time_total / 1e3 / steps:>12.2f} "
              f"{100 * e.self_cpu_time_total / total:>6.1f}% {e.count / steps:>10.0f}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="resnet18")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--threads", type=int, default=2,
                   help="1 times each kernel by the calling thread's CPU time, robust to other processes' load")
    p.add_argument("--kernels", default="fwd,dx,dw")
    p.add_argument("--only", help="time only the variants whose name contains one of these (and the rule)")
    p.add_argument("--layers", help="comma-separated substrings of the layer descriptions to keep")
    p.add_argument("--json", help="append the results as JSON lines to this file")
    p.add_argument("--torch-profile", type=int, metavar="STEPS",
                   help="instead: profile STEPS torch training steps (torch.profiler) and print the top aten ops")
    p.add_argument("--impl", choices=["ort", "torch"], help=argparse.SUPPRESS)   # the child processes
    args = p.parse_args(argv)
    if args.threads == 1:
        # One thread runs every kernel on the calling thread (onnxruntime and torch alike): its CPU time does not
        # count the time other processes held the core, so the figures hold on a loaded machine.
        global CLOCK
        CLOCK = time.thread_time
    if args.torch_profile:
        torch_profile(args.workload, args.torch_profile, args.threads)
        return
    layers = workload_layers(args.workload)
    if args.layers:
        layers = [(la, c) for la, c in layers if any(s in str(la) for s in args.layers.split(","))]
    if args.impl:
        times = measure(layers, args.kernels.split(","), args.impl, args.runs, args.threads, args.only)
        print(json.dumps(times))
        return
    load = os.getloadavg()[0]
    clock = "thread CPU time" if args.threads == 1 else "wall time"
    print(f"{args.workload}: {len(layers)} distinct Conv2d layers, {args.threads} thread(s), {clock}; "
          f"load average {load:.1f}")
    results = run_rounds(args, layers)
    report(results)
    if args.json:
        with open(args.json, "a") as f:
            for r in results:
                f.write(json.dumps(dict(r, workload=args.workload, load=load)) + "\n")


if __name__ == "__main__":
    main()
