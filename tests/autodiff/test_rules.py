"""Every gradient rule against central finite differences (float64, onnx.reference) and against torch autograd.

One row per op and case: inputs inside the op's domain (away from kinks), several shapes, broadcasting.
The checked scalar is sum_k sum(y_k * r_k) with fixed random r_k; the torch column recomputes it with the
same r_k and compares torch's input gradients with ours.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pytest

from onnxtrain.autodiff import GRADIENT_RULES, NON_DIFFERENTIABLE
from onnxtrain.autodiff.check import check_gradients, single_node_model
from onnxtrain.autodiff.unsupported import UNSUPPORTED

rng = np.random.default_rng(1234)


def randn(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape)


def uniform(lo: float, hi: float, *shape: int) -> np.ndarray:
    return rng.uniform(lo, hi, shape)


def away(*shape: int, gap: float = 0.2) -> np.ndarray:
    """Normal values at least ``gap`` away from 0 (for kinks at 0)."""
    x = randn(*shape)
    return x + np.sign(x) * gap


def distinct(*shape: int) -> np.ndarray:
    """Values at least 0.1 apart (no ties for max/min/sort)."""
    return rng.permutation(np.arange(int(np.prod(shape)))).reshape(shape) * 0.1 - 0.05 * np.prod(shape) + 0.03


def i64(values) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


def f32(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float32)


@dataclass
class Row:
    op: str
    inputs: dict[str, np.ndarray]                       # graph inputs; the float ones are differentiated
    attrs: dict = field(default_factory=dict)
    consts: dict[str, np.ndarray] = field(default_factory=dict)   # initializers (indices, axes, ...), after inputs
    torch: Callable | None = None                       # torch version: (*inputs) -> output or tuple of outputs
    tag: str = ""
    opset: int = 18
    outputs: int = 1
    order: list[str] | None = None                      # node input order when constants come first
    eps: float = 1e-6
    rtol: float = 1e-4
    atol: float = 1e-6
    backend: str = "reference"                          # runs the finite differences

    @property
    def id(self) -> str:
        shapes = "_".join("x".join(map(str, v.shape)) or "scalar" for v in self.inputs.values())
        return f"{self.op}-{self.tag or shapes}"


def _t():
    return pytest.importorskip("torch")


def F():
    return _t().nn.functional


ROWS: list[Row] = []


def row(*args, **kwargs) -> None:
    ROWS.append(Row(*args, **kwargs))


# -- arithmetic with broadcasting ----------------------------------------------------------------------------
for a, b in [((3, 4), (3, 4)), ((2, 3, 4), (4,)), ((2, 1, 4), (3, 1)), ((3, 4), ())]:
    row("Add", {"a": randn(*a), "b": randn(*b)}, torch=lambda a, b: a + b)
    row("Sub", {"a": randn(*a), "b": randn(*b)}, torch=lambda a, b: a - b)
    row("Mul", {"a": randn(*a), "b": randn(*b)}, torch=lambda a, b: a * b)
    row("Div", {"a": randn(*a), "b": away(*b, gap=0.5)}, torch=lambda a, b: a / b)
    row("Pow", {"a": uniform(0.5, 2.0, *a), "b": randn(*b)}, torch=lambda a, b: a ** b)
row("Pow", {"a": uniform(0.5, 2.0, 3, 4)}, consts={"e": np.asarray(3, dtype=np.int64)}, tag="int_exponent",
    torch=lambda a: a ** 3)
row("Mod", {"a": uniform(0.5, 5.0, 3, 4), "b": uniform(0.7, 1.3, 4)}, {"fmod": 1},
    torch=lambda a, b: _t().fmod(a, b), tag="fmod")
row("Max", {"a": distinct(3, 4), "b": distinct(4) + 0.01, "c": distinct(3, 1) + 0.02},
    torch=lambda a, b, c: _t().maximum(_t().maximum(a, b), c))
row("Min", {"a": distinct(3, 4), "b": distinct(4) + 0.01}, torch=lambda a, b: _t().minimum(a, b))
row("Sum", {"a": randn(3, 4), "b": randn(4), "c": randn(2, 1, 1)}, torch=lambda a, b, c: a + b + c)
row("Mean", {"a": randn(3, 4), "b": randn(4), "c": randn(2, 1, 1)}, torch=lambda a, b, c: (a + b + c) / 3)
row("Where", {"a": randn(3, 4), "b": randn(4)}, consts={"c": rng.random((3, 4)) > 0.5}, tag="broadcast",
    order=["c", "a", "b"])

# -- unary math ----------------------------------------------------------------------------------------------
UNARY = [
    ("Neg", randn(3, 4), lambda x: -x),
    ("Identity", randn(3, 4), lambda x: x),
    ("Abs", away(3, 4), lambda x: x.abs()),
    ("Exp", randn(3, 4), lambda x: x.exp()),
    ("Log", uniform(0.2, 3.0, 3, 4), lambda x: x.log()),
    ("Sqrt", uniform(0.2, 3.0, 3, 4), lambda x: x.sqrt()),
    ("Reciprocal", away(3, 4), lambda x: 1 / x),
    ("Sigmoid", randn(3, 4), lambda x: x.sigmoid()),
    ("Tanh", randn(3, 4), lambda x: x.tanh()),
    ("Erf", randn(3, 4), lambda x: _t().erf(x)),
    ("Sin", randn(3, 4), lambda x: x.sin()),
    ("Cos", randn(3, 4), lambda x: x.cos()),
    ("Tan", uniform(-1.2, 1.2, 3, 4), lambda x: x.tan()),
    ("Asin", uniform(-0.9, 0.9, 3, 4), lambda x: x.asin()),
    ("Acos", uniform(-0.9, 0.9, 3, 4), lambda x: x.acos()),
    ("Atan", randn(3, 4), lambda x: x.atan()),
    ("Sinh", randn(3, 4), lambda x: x.sinh()),
    ("Cosh", randn(3, 4), lambda x: x.cosh()),
    ("Asinh", randn(3, 4), lambda x: x.asinh()),
    ("Acosh", uniform(1.2, 3.0, 3, 4), lambda x: x.acosh()),
    ("Atanh", uniform(-0.9, 0.9, 3, 4), lambda x: x.atanh()),
    ("Relu", away(2, 3, 4), lambda x: x.relu()),
    ("Softplus", randn(3, 4), lambda x: F().softplus(x)),
    ("Softsign", randn(3, 4), lambda x: F().softsign(x)),
    ("Mish", randn(3, 4), lambda x: F().mish(x)),
    ("HardSwish", uniform(-4, 4, 3, 5) + 0.05, lambda x: F().hardswish(x)),
]
for op, x, fn in UNARY:
    row(op, {"x": x}, torch=fn, opset=22)
row("Gelu", {"x": randn(3, 4)}, torch=lambda x: F().gelu(x), opset=20)
row("Gelu", {"x": randn(3, 4)}, {"approximate": "tanh"}, torch=lambda x: F().gelu(x, approximate="tanh"),
    opset=20, tag="tanh")
row("LeakyRelu", {"x": away(3, 4)}, {"alpha": 0.1}, torch=lambda x: F().leaky_relu(x, 0.1))
row("Elu", {"x": away(3, 4)}, {"alpha": 0.7}, torch=lambda x: F().elu(x, 0.7))
row("Celu", {"x": away(3, 4)}, {"alpha": 1.5}, torch=lambda x: F().celu(x, 1.5))
row("Selu", {"x": away(3, 4)}, torch=lambda x: F().selu(x))
row("ThresholdedRelu", {"x": uniform(-2, 2, 3, 4) + 0.03}, {"alpha": 0.5},
    torch=lambda x: F().threshold(x, 0.5, 0.0))
row("Shrink", {"x": uniform(-2, 2, 3, 4) + 0.03}, {"lambd": 0.4, "bias": 0.2})
row("HardSigmoid", {"x": uniform(-4, 4, 3, 4) + 0.05}, {"alpha": 0.25, "beta": 0.4})
row("Swish", {"x": randn(3, 4)}, {"alpha": 1.7}, opset=24, torch=lambda x: x * (1.7 * x).sigmoid())
row("PRelu", {"x": away(2, 3, 4, 2), "slope": uniform(0.1, 0.5, 3, 1, 1)},
    torch=lambda x, s: F().prelu(x, s.reshape(-1)))
row("PRelu", {"x": away(2, 3), "slope": uniform(0.1, 0.5, 3)}, tag="vector_slope")
row("Clip", {"x": uniform(-2, 2, 3, 4)}, consts={"lo": np.asarray(-0.55), "hi": np.asarray(0.65)},
    torch=lambda x: x.clamp(-0.55, 0.65))
row("Cast", {"x": randn(3, 4)}, {"to": 1}, eps=1e-2, tag="to_float32")
row("CastLike", {"x": randn(3, 4)}, consts={"like": np.zeros(1, np.float32)}, eps=1e-2, opset=21)

# -- reductions ----------------------------------------------------------------------------------------------
for op, make, fn in [
    ("ReduceSum", randn, lambda x, ax, kd: x.sum(ax, keepdim=kd)),
    ("ReduceMean", randn, lambda x, ax, kd: x.mean(ax, keepdim=kd)),
    ("ReduceSumSquare", randn, lambda x, ax, kd: (x * x).sum(ax, keepdim=kd)),
    ("ReduceL1", away, lambda x, ax, kd: x.abs().sum(ax, keepdim=kd)),
    ("ReduceL2", randn, lambda x, ax, kd: x.norm(dim=ax, keepdim=kd)),
    ("ReduceLogSum", lambda *s: uniform(0.3, 2.0, *s), lambda x, ax, kd: x.sum(ax, keepdim=kd).log()),
    ("ReduceLogSumExp", randn, lambda x, ax, kd: x.logsumexp(ax, keepdim=kd)),
    ("ReduceProd", lambda *s: uniform(0.5, 1.5, *s) * np.sign(randn(*s)), lambda x, ax, kd: x.prod(ax[0], keepdim=kd)),
    ("ReduceMax", distinct, lambda x, ax, kd: x.amax(ax, keepdim=kd)),
    ("ReduceMin", distinct, lambda x, ax, kd: x.amin(ax, keepdim=kd)),
]:
    for axes, keepdims in [([1], 1), ([-1], 0), ([0, 2], 0)]:
        if op == "ReduceProd" and len(axes) > 1:
            continue
        row(op, {"x": make(2, 3, 4)}, {"keepdims": keepdims}, consts={"axes": i64(axes)}, tag=f"axes{axes}_k{keepdims}",
            torch=lambda x, fn=fn, axes=axes, kd=keepdims: fn(x, axes, bool(kd)))
    row(op, {"x": make(2, 3)}, {"keepdims": 0}, tag="all_axes")
# exact zeros: one in a product (the others' product goes to it), two (nothing), and a norm of a zero vector (0, as
# torch; both gave NaN)
_with_zeros = uniform(0.5, 1.5, 2, 3, 4) * np.sign(randn(2, 3, 4))
_with_zeros[0, 0, 1] = _with_zeros[0, 1, 0] = _with_zeros[0, 1, 2] = 0.0
row("ReduceProd", {"x": _with_zeros}, {"keepdims": 0}, consts={"axes": i64([-1])}, tag="zeros",
    torch=lambda x: x.prod(-1))
row("ReduceProd", {"x": _with_zeros}, {"keepdims": 1}, tag="zeros_all_axes", torch=lambda x: x.prod().reshape(1, 1, 1))
_zero_row = randn(2, 3, 4)
_zero_row[1, 2] = 0.0
row("ReduceL2", {"x": _zero_row}, {"keepdims": 1}, consts={"axes": i64([-1])}, tag="zero_vector",
    torch=lambda x: x.norm(dim=-1, keepdim=True))
row("ReduceSum", {"x": randn(2, 3)}, {"noop_with_empty_axes": 1}, tag="noop")
row("ReduceSumSquare", {"x": randn(2, 3)}, {"noop_with_empty_axes": 1}, tag="noop")
row("ReduceSum", {"x": randn(2, 3, 4)}, {"keepdims": 0}, consts={"axes": i64([1])}, opset=13, tag="opset13")
row("ReduceMean", {"x": randn(2, 3, 4)}, {"axes": [0, 2]}, opset=13, tag="opset13_attr")

# -- shapes and indexing -------------------------------------------------------------------------------------
row("Reshape", {"x": randn(2, 3, 4)}, consts={"shape": i64([4, -1])}, torch=lambda x: x.reshape(4, -1))
row("Flatten", {"x": randn(2, 3, 4)}, {"axis": 2}, torch=lambda x: x.reshape(6, 4))
row("Squeeze", {"x": randn(2, 1, 4)}, consts={"axes": i64([1])}, torch=lambda x: x.squeeze(1))
row("Unsqueeze", {"x": randn(2, 4)}, consts={"axes": i64([0, -1])}, torch=lambda x: x[None, :, :, None])
row("Transpose", {"x": randn(2, 3, 4)}, {"perm": [2, 0, 1]}, torch=lambda x: x.permute(2, 0, 1))
row("Expand", {"x": randn(3, 1)}, consts={"shape": i64([2, 3, 4])}, torch=lambda x: x.expand(2, 3, 4))
row("Concat", {"a": randn(2, 3), "b": randn(2, 1), "c": randn(2, 2)}, {"axis": -1},
    torch=lambda a, b, c: _t().cat([a, b, c], -1))
row("Split", {"x": randn(2, 7)}, {"axis": 1}, consts={"split": i64([2, 5])}, outputs=2,
    torch=lambda x: _t().split(x, [2, 5], 1))
row("Split", {"x": randn(6, 2)}, {"axis": 0, "num_outputs": 3}, outputs=3, tag="num_outputs")
row("Slice", {"x": randn(5, 6)}, consts={"s": i64([4, 1]), "e": i64([0, 6]), "a": i64([0, 1]), "st": i64([-2, 2])},
    tag="negative_step")
row("Gather", {"x": randn(5, 3)}, {"axis": 0}, consts={"i": i64([[0, 4], [4, -1]])}, tag="rows_repeated")
row("Gather", {"x": randn(2, 5, 3)}, {"axis": 1}, consts={"i": i64([1, 3, 1])}, tag="axis1",
    torch=lambda x: x[:, [1, 3, 1]])
row("GatherElements", {"x": randn(3, 4)}, {"axis": 1}, consts={"i": i64([[0, 0], [3, 1], [2, 2]])},
    torch=lambda x: x.gather(1, _t().tensor([[0, 0], [3, 1], [2, 2]])))
row("GatherND", {"x": randn(3, 4, 2)}, consts={"i": i64([[0, 1], [2, 3], [0, 1]])}, tag="repeated")
row("GatherND", {"x": randn(2, 3, 4)}, {"batch_dims": 1}, consts={"i": i64([[[1], [2]], [[0], [0]]])},
    tag="batch_dims1")
DIU = ["d", "i", "u"]
row("ScatterElements", {"d": randn(3, 4), "u": randn(3, 2)}, {"axis": 1}, consts={"i": i64([[0, 2], [3, 1], [1, 0]])},
    order=DIU,
    torch=lambda d, u: d.scatter(1, _t().tensor([[0, 2], [3, 1], [1, 0]]), u))
row("ScatterElements", {"d": randn(3, 4), "u": randn(3, 2)}, {"axis": 1, "reduction": "add"},
    consts={"i": i64([[0, 0], [3, 1], [1, 1]])}, tag="add", order=DIU,
    torch=lambda d, u: d.scatter_add(1, _t().tensor([[0, 0], [3, 1], [1, 1]]), u))
row("ScatterElements", {"d": distinct(3, 4), "u": distinct(3, 2) + 0.013}, {"axis": 1, "reduction": "max"},
    consts={"i": i64([[0, 2], [3, 1], [1, 0]])}, tag="max", order=DIU)
row("ScatterND", {"d": randn(4, 3), "u": randn(2, 3)}, consts={"i": i64([[1], [3]])}, order=DIU)
row("ScatterND", {"d": randn(4, 3), "u": randn(2, 3)}, {"reduction": "add"}, consts={"i": i64([[1], [1]])}, tag="add",
    order=DIU)
row("ScatterND", {"d": randn(4, 3), "u": randn(2)}, {"reduction": "mul"}, consts={"i": i64([[1, 2], [3, 0]])},
    tag="mul", order=DIU)
row("Tile", {"x": randn(2, 3)}, consts={"r": i64([2, 3])}, torch=lambda x: x.repeat(2, 3))
for mode in ["constant", "reflect", "edge", "wrap"]:
    row("Pad", {"x": randn(2, 3, 4)}, {"mode": mode}, consts={"p": i64([0, 1, 2, 0, 2, 1])}, tag=mode, opset=19)
row("Pad", {"x": randn(2, 3, 4)}, consts={"p": i64([1, -1, 2, -1]), "_omit": np.zeros(0), "axes": i64([1, 2])},
    tag="axes_and_crop", opset=19)
# a pad value computed from parameters (a scalar, or the one-element tensor the TorchScript exporter writes)
row("Pad", {"x": randn(2, 3, 4), "v": randn()}, consts={"p": i64([0, 1, 2, 0, 2, 1])}, order=["x", "p", "v"],
    tag="value", opset=19)
row("Pad", {"x": randn(2, 3, 4), "v": randn(1)}, consts={"p": i64([1, -1, 2, -1]), "axes": i64([1, 2])},
    order=["x", "p", "v", "axes"], tag="value_and_crop", opset=19)
row("Trilu", {"x": randn(2, 4, 5)}, {"upper": 0}, consts={"k": np.asarray(1, np.int64)},
    torch=lambda x: x.tril(1))
row("TopK", {"x": distinct(3, 5)}, {"axis": 1}, consts={"k": i64([2])}, outputs=2,
    torch=lambda x: x.topk(2, 1))
row("CumSum", {"x": randn(3, 4)}, consts={"axis": np.asarray(1, np.int64)}, torch=lambda x: x.cumsum(1))
row("CumSum", {"x": randn(3, 4)}, {"exclusive": 1, "reverse": 1}, consts={"axis": np.asarray(0, np.int64)},
    tag="exclusive_reverse")
row("Compress", {"x": randn(3, 4)}, {"axis": 1}, consts={"c": np.array([True, False, True, True])})
row("Compress", {"x": randn(3, 4)}, consts={"c": np.array([True, False, True, True, False, True])}, tag="flat")
row("ReverseSequence", {"x": randn(4, 3, 2)}, {"batch_axis": 1, "time_axis": 0},
    consts={"lens": i64([4, 2, 1])})
row("MaxUnpool", {"x": randn(1, 2, 2, 2)}, {"kernel_shape": [2, 2], "strides": [2, 2]},
    consts={"i": i64([[[[0, 3], [9, 14]], [[17, 18], [28, 31]]]])})
row("DepthToSpace", {"x": randn(1, 8, 2, 3)}, {"blocksize": 2}, tag="DCR",
    torch=lambda x: x.reshape(1, 2, 2, 2, 2, 3).permute(0, 3, 4, 1, 5, 2).reshape(1, 2, 4, 6))
row("DepthToSpace", {"x": randn(1, 8, 2, 3)}, {"blocksize": 2, "mode": "CRD"}, torch=lambda x: F().pixel_shuffle(x, 2),
    tag="CRD")
row("SpaceToDepth", {"x": randn(1, 2, 4, 6)}, {"blocksize": 2})
for eq, shapes in [("ij,jk->ik", [(2, 3), (3, 4)]), ("bij,bjk->bik", [(2, 2, 3), (2, 3, 4)]),
                   ("ij->i", [(3, 4)]), ("ii->i", [(3, 3)]), ("i,j->ij", [(3,), (4,)]),
                   ("...ij,jk->...ik", [(2, 1, 2, 3), (3, 4)]), ("ij,ij->", [(2, 3), (2, 3)]),
                   ("ij,jk", [(2, 3), (3, 4)]), ("bhqd,bhkd->bhqk", [(1, 2, 3, 4), (1, 2, 5, 4)]),
                   ("...i,...i->...", [(2, 3, 4), (1, 3, 4)]),
                   # a repeated label summed away: the gradient is on the diagonal only (it was spread over all)
                   ("ii->", [(3, 3)]), ("bii->b", [(2, 3, 3)]), ("iij->j", [(3, 3, 2)]),
                   ("ij,kk->ij", [(2, 3), (4, 4)])]:
    names = "abcd"[:len(shapes)]
    row("Einsum", {n: randn(*s) for n, s in zip(names, shapes)}, {"equation": eq}, tag=eq.replace("...", "E"),
        torch=lambda *xs, eq=eq: _t().einsum(eq, *xs))

# -- nn ------------------------------------------------------------------------------------------------------
row("MatMul", {"a": randn(2, 3, 4), "b": randn(4, 5)}, torch=lambda a, b: a @ b)
row("MatMul", {"a": randn(3, 1, 2, 4), "b": randn(2, 4, 5)}, torch=lambda a, b: a @ b, tag="batch_broadcast")
row("MatMul", {"a": randn(4), "b": randn(2, 4, 3)}, torch=lambda a, b: a @ b, tag="vector")
row("Gemm", {"a": randn(4, 3), "b": randn(5, 4), "c": randn(5)}, {"transA": 1, "transB": 1, "alpha": 0.7, "beta": 1.3},
    torch=lambda a, b, c: 0.7 * a.T @ b.T + 1.3 * c)
row("Conv", {"x": randn(2, 4, 6, 5), "w": randn(6, 2, 3, 2), "b": randn(6)},
    {"group": 2, "strides": [2, 1], "pads": [1, 0, 1, 1], "dilations": [1, 2]},
    torch=lambda x, w, b: F().conv2d(F().pad(x, (0, 1, 1, 1)), w, b, stride=(2, 1), dilation=(1, 2), groups=2))
row("Conv", {"x": randn(1, 2, 7), "w": randn(3, 2, 3)}, {"auto_pad": "SAME_UPPER", "strides": [2]}, tag="same_upper_1d")
row("Conv", {"x": randn(2, 3, 9, 9), "w": randn(3, 1, 3, 3)}, {"group": 3, "pads": [1, 1, 1, 1]},
    tag="depthwise_many_positions", torch=lambda x, w: F().conv2d(x, w, padding=1, groups=3))
row("Conv", {"x": randn(2, 3, 17, 16), "w": randn(6, 1, 3, 3), "b": randn(6)},
    {"group": 3, "strides": [2, 2], "pads": [1, 0, 1, 1]}, tag="depthwise_multiplier_strided",
    torch=lambda x, w, b: F().conv2d(F().pad(x, (0, 1, 1, 1)), w, b, stride=2, groups=3))
row("Conv", {"x": randn(2, 3, 5, 5), "w": randn(3, 1, 3, 3)}, {"group": 3, "pads": [1, 1, 1, 1]},
    tag="depthwise_few_positions", torch=lambda x, w: F().conv2d(x, w, padding=1, groups=3))
row("ConvTranspose", {"x": randn(2, 4, 3, 4), "w": randn(4, 3, 3, 2), "b": randn(6)},
    {"group": 2, "strides": [2, 3], "pads": [1, 0, 0, 1], "output_padding": [1, 2], "dilations": [1, 2]},
    torch=lambda x, w, b: F().conv_transpose2d(x, w, b, stride=(2, 3), output_padding=(1, 2), groups=2,
                                               dilation=(1, 2))[:, :, 1:, :-1])
row("ConvTranspose", {"x": randn(1, 2, 4, 4), "w": randn(2, 3, 3, 3)}, {"strides": [2, 2], "auto_pad": "SAME_UPPER"},
    tag="same_upper")
row("ConvTranspose", {"x": randn(1, 2, 4, 4), "w": randn(2, 3, 3, 3)}, {"strides": [2, 2], "output_shape": [8, 9]},
    tag="output_shape")
row("ConvTranspose", {"x": randn(1, 2, 5), "w": randn(2, 1, 4)}, {"strides": [3]}, tag="1d",
    torch=lambda x, w: F().conv_transpose1d(x, w, stride=3))
row("MaxPool", {"x": distinct(2, 2, 5, 6)}, {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 0]},
    torch=lambda x: F().max_pool2d(x, (3, 2), (2, 2), padding=(1, 0)))
row("MaxPool", {"x": distinct(2, 3, 4, 6)}, {"kernel_shape": [2, 2], "strides": [2, 2]}, tag="tiled",
    torch=lambda x: F().max_pool2d(x, 2))
row("MaxPool", {"x": distinct(2, 2, 5, 7)}, {"kernel_shape": [2, 3], "strides": [3, 3], "pads": [0, 1, 0, 1]},
    tag="apart_padded_remainder", torch=lambda x: F().max_pool2d(x, (2, 3), 3, padding=(0, 1)))
row("MaxPool", {"x": distinct(2, 3, 9)}, {"kernel_shape": [3], "strides": [3], "storage_order": 0}, tag="1d",
    torch=lambda x: F().max_pool1d(x, 3))
row("AveragePool", {"x": randn(2, 2, 5, 6)}, {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"},
    tag="same_upper_strided")   # TFLite's SAME pool; with symbolic sizes (test_dynamic_shapes) padded at run time
row("AveragePool", {"x": randn(2, 2, 6, 7)}, {"kernel_shape": [2, 3], "strides": [2, 3], "auto_pad": "SAME_LOWER",
                                              "count_include_pad": 1}, tag="same_lower_strided_counting_pads")
row("MaxPool", {"x": distinct(2, 2, 5, 7)}, {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"},
    tag="same_upper_strided")
row("MaxPool", {"x": distinct(1, 2, 6, 6)}, {"kernel_shape": [2, 2], "strides": [2, 2], "auto_pad": "SAME_UPPER"},
    tag="same_upper_windows_apart")
row("AveragePool", {"x": randn(2, 2, 5, 6)}, {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    torch=lambda x: F().avg_pool2d(x, 3, 2, padding=1, count_include_pad=False))
row("AveragePool", {"x": randn(2, 2, 5, 6)}, {"kernel_shape": [2, 3], "count_include_pad": 1, "pads": [1, 1, 1, 1]},
    torch=lambda x: F().avg_pool2d(x, (2, 3), 1, padding=1, count_include_pad=True), tag="count_include_pad")
row("GlobalAveragePool", {"x": randn(2, 3, 4, 5)}, torch=lambda x: x.mean((2, 3), keepdim=True))
row("GlobalMaxPool", {"x": distinct(2, 3, 4, 5)}, torch=lambda x: x.amax((2, 3), keepdim=True))
row("GlobalLpPool", {"x": away(2, 3, 4, 5)}, {"p": 2}, torch=lambda x: x.norm(dim=(2, 3), keepdim=True))
row("GlobalLpPool", {"x": away(2, 3, 4)}, {"p": 3}, tag="p3")
row("Softmax", {"x": randn(2, 3, 4)}, {"axis": 1}, torch=lambda x: x.softmax(1))
row("LogSoftmax", {"x": randn(2, 3, 4)}, torch=lambda x: x.log_softmax(-1))
row("Dropout", {"x": randn(3, 4)}, {"seed": 3}, consts={"r": np.asarray(0.0), "t": np.asarray(True)},
    tag="train_ratio0")
row("Dropout", {"x": randn(3, 4)}, consts={"r": np.asarray(0.3), "t": np.asarray(False)}, tag="eval")
row("LayerNormalization", {"x": randn(2, 3, 4), "s": randn(3, 4), "b": randn(3, 4)}, {"axis": 1},
    torch=lambda x, s, b: F().layer_norm(x, (3, 4), s, b))
BN_MEAN, BN_VAR = randn(3), uniform(0.5, 1.5, 3)


def _batch_norm_training(x, s, b):
    """y and the running statistics (population variance, momentum 0.9) of BatchNormalization-15."""
    mean, var = x.mean((0, 2)), x.var((0, 2), unbiased=False)
    y = F().batch_norm(x, None, None, s, b, training=True)
    return y, 0.9 * _t().tensor(BN_MEAN) + 0.1 * mean, 0.9 * _t().tensor(BN_VAR) + 0.1 * var


row("BatchNormalization", {"x": randn(4, 3, 2), "s": randn(3), "b": randn(3)}, {"training_mode": 1},
    consts={"m": BN_MEAN, "v": BN_VAR}, tag="training", outputs=3, torch=_batch_norm_training)
row("BatchNormalization", {"x": randn(4, 3, 2), "s": randn(3), "b": randn(3), "m": randn(3), "v": uniform(0.5, 1.5, 3)},
    {"training_mode": 1, "momentum": 0.8}, outputs=3, tag="training_running_stats")
row("BatchNormalization", {"x": randn(4, 3, 2), "s": randn(3), "b": randn(3), "m": randn(3), "v": uniform(0.5, 1.5, 3)},
    tag="inference",
    torch=lambda x, s, b, m, v: ((x - m[:, None]) / (v[:, None] + 1e-5).sqrt() * s[:, None] + b[:, None]))
row("InstanceNormalization", {"x": randn(2, 3, 4, 5), "s": randn(3), "b": randn(3)},
    torch=lambda x, s, b: F().instance_norm(x, weight=s, bias=b))
row("GroupNormalization", {"x": randn(2, 6, 4), "s": randn(6), "b": randn(6)}, {"num_groups": 3, "stash_type": 11},
    opset=21,
    torch=lambda x, s, b: F().group_norm(x, 3, s, b))
row("GroupNormalization", {"x": randn(2, 6, 2, 2), "s": randn(3), "b": randn(3)}, {"num_groups": 3}, opset=18,
    tag="opset18_per_group")
row("GroupNormalization", {"x": randn(3, 4, 2, 3), "s": randn(4), "b": randn(4)}, {"num_groups": 2, "stash_type": 11},
    opset=21,
    tag="4d", torch=lambda x, s, b: F().group_norm(x, 2, s, b))
row("RMSNormalization", {"x": randn(2, 3, 4), "s": randn(4)}, opset=23,
    torch=lambda x, s: F().rms_norm(x, (4,), s, eps=1e-5))
row("RMSNormalization", {"x": randn(2, 3, 4), "s": randn(3, 1)}, {"axis": 1}, opset=23, tag="axis1_broadcast_scale")
row("LpNormalization", {"x": away(3, 4)}, {"axis": 1, "p": 2}, torch=lambda x: F().normalize(x, 2.0, 1), tag="p2")
row("LpNormalization", {"x": away(3, 4)}, {"axis": 0, "p": 1}, torch=lambda x: F().normalize(x, 1.0, 0), tag="p1")
row("LRN", {"x": randn(2, 5, 3, 2)}, {"size": 3, "alpha": 0.2, "beta": 0.75, "bias": 1.5},
    torch=lambda x: F().local_response_norm(x, 3, 0.2, 0.75, 1.5))
row("LRN", {"x": randn(1, 6, 2, 1)}, {"size": 4, "alpha": 0.3}, tag="even_size")

def _torch_nll(lp, w, labels, ignore):
    """Mean-reduced weighted NLL written with differentiable torch ops (torch's nll_loss does not
    differentiate its class weights)."""
    y = _t().tensor(labels)
    keep = (y != ignore).to(lp.dtype)
    safe = y.clamp(min=0) * (y != ignore)
    wi = w[safe] * keep
    li = -lp.gather(1, safe.unsqueeze(1)).squeeze(1)
    return (wi * li).sum() / wi.sum()


# -- losses --------------------------------------------------------------------------------------------------
row("SoftmaxCrossEntropyLoss", {"x": randn(4, 5)}, consts={"y": i64([0, 4, 2, 2])},
    torch=lambda x: F().cross_entropy(x, _t().tensor([0, 4, 2, 2])))
row("SoftmaxCrossEntropyLoss", {"x": randn(3, 4, 2), "w": uniform(0.5, 2.0, 4)},
    {"reduction": "sum", "ignore_index": 1},
    consts={"y": i64([[0, 1], [3, 2], [1, 1]])}, tag="weights_ignore_sum", order=["x", "y", "w"])
row("SoftmaxCrossEntropyLoss", {"x": randn(3, 4, 2), "w": uniform(0.5, 2.0, 4)}, {"ignore_index": 1},
    consts={"y": i64([[0, 1], [3, 2], [2, 1]])}, tag="weights_ignore_mean_dims", outputs=2, order=["x", "y", "w"],
    torch=lambda x, w: (_torch_nll(x.log_softmax(1), w, [[0, 1], [3, 2], [2, 1]], 1), x.log_softmax(1)))
row("SoftmaxCrossEntropyLoss", {"x": randn(2, 3, 2, 2)}, {"reduction": "none"},
    consts={"y": i64([[[0, 1], [2, 2]], [[1, 1], [0, 2]]])}, tag="none_4d", outputs=2)
row("NegativeLogLikelihoodLoss", {"x": randn(4, 5)}, {"reduction": "none"}, consts={"y": i64([0, 4, 2, 2])},
    torch=lambda x: F().nll_loss(x, _t().tensor([0, 4, 2, 2]), reduction="none"))
row("NegativeLogLikelihoodLoss", {"x": randn(3, 4, 2), "w": uniform(0.5, 2.0, 4)}, {"ignore_index": 3},
    consts={"y": i64([[0, 3], [3, 2], [2, 1]])}, tag="weights_ignore_mean", order=["x", "y", "w"],
    torch=lambda x, w: _torch_nll(x, w, [[0, 3], [3, 2], [2, 1]], 3))

# -- resampling ----------------------------------------------------------------------------------------------
NO_ROI = np.zeros(0, np.float32)
row("Resize", {"x": randn(1, 2, 3, 4)}, {"mode": "nearest"}, consts={"roi": NO_ROI, "s": f32([1, 1, 2.0, 1.5])},
    tag="nearest_scales", opset=19)
row("Resize", {"x": randn(1, 2, 3, 4)}, {"mode": "linear"}, consts={"roi": NO_ROI, "s": f32([1, 1, 2.0, 2.0])},
    tag="linear_half_pixel", opset=19,
    torch=lambda x: F().interpolate(x, scale_factor=2, mode="bilinear", align_corners=False))
row("Resize", {"x": randn(1, 2, 4, 5)}, {"mode": "linear", "coordinate_transformation_mode": "align_corners"},
    consts={"roi": NO_ROI, "_omit": NO_ROI, "sizes": i64([1, 2, 7, 3])}, tag="linear_align_corners_sizes", opset=19,
    torch=lambda x: F().interpolate(x, size=(7, 3), mode="bilinear", align_corners=True))
row("Resize", {"x": randn(1, 2, 4, 5)}, {"mode": "linear", "keep_aspect_ratio_policy": "not_larger", "axes": [2, 3]},
    consts={"roi": NO_ROI, "_omit": NO_ROI, "sizes": i64([7, 11])}, tag="linear_not_larger", opset=19)
row("Resize", {"x": randn(1, 2, 6, 5)}, {"mode": "nearest", "keep_aspect_ratio_policy": "not_smaller", "axes": [2, 3]},
    consts={"roi": NO_ROI, "_omit": NO_ROI, "sizes": i64([2, 4])}, tag="nearest_not_smaller_down", opset=19)
row("Resize", {"x": randn(1, 1, 9, 8)}, {"mode": "linear", "keep_aspect_ratio_policy": "not_larger",
                                        "coordinate_transformation_mode": "asymmetric", "axes": [2, 3]},
    consts={"roi": NO_ROI, "_omit": NO_ROI, "sizes": i64([3, 5])}, tag="linear_not_larger_third", opset=19)
row("Resize", {"x": randn(1, 1, 4, 4)}, {"mode": "cubic", "antialias": 1},
    consts={"roi": NO_ROI, "s": f32([1, 1, 0.6, 0.8])}, tag="cubic_antialias_down", opset=19)
row("Resize", {"x": randn(2, 5, 3)}, {"mode": "linear", "axes": [1]},
    consts={"roi": NO_ROI, "s": f32([1.7])}, tag="axes_attr_3d", opset=19)
row("Resize", {"x": randn(1, 1, 4, 5)}, {"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize",
                                        "extrapolation_value": 3.0},
    consts={"roi": f32([0, 0, 0.2, -0.1, 1, 1, 0.9, 1.2]), "_omit": NO_ROI, "sizes": i64([1, 1, 6, 7])},
    tag="tf_crop", opset=19)   # with scales, the output size differs (onnx's inference ignores the roi, ORT not)
for padding in ["zeros", "border", "reflection"]:
    for align in [0, 1]:
        row("GridSample", {"x": randn(2, 2, 4, 5), "g": uniform(-1.3, 1.3, 2, 3, 2, 2)},
            {"padding_mode": padding, "align_corners": align}, opset=22, tag=f"linear_{padding}_align{align}",
            torch=lambda x, g, p=padding, a=align: F().grid_sample(x, g, "bilinear", p, bool(a)))
row("GridSample", {"x": randn(1, 2, 4, 5), "g": uniform(-1.1, 1.1, 1, 3, 2, 2)}, {"mode": "nearest"}, opset=22,
    tag="nearest")


# -- more tensor ops ------------------------------------------------------------------------------------------
row("CumProd", {"x": uniform(0.5, 1.5, 3, 4) * np.sign(randn(3, 4))}, consts={"axis": np.asarray(1, np.int64)},
    opset=26, torch=lambda x: x.cumprod(1))
row("CumProd", {"x": uniform(0.5, 1.5, 3, 4)}, {"exclusive": 1, "reverse": 1}, consts={"axis": np.asarray(0, np.int64)},
    opset=26, tag="exclusive_reverse")
row("LpPool", {"x": away(1, 2, 5, 6)}, {"kernel_shape": [2, 3], "p": 2}, torch=lambda x: F().lp_pool2d(x, 2, (2, 3), 1))
row("LpPool", {"x": away(1, 2, 5, 6)}, {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 1, 1, 0], "p": 3},
    tag="p3_strided_padded")
row("AveragePool", {"x": randn(1, 2, 5, 6)}, {"kernel_shape": [2, 3], "strides": [2, 2], "ceil_mode": 1},
    opset=19, tag="ceil_mode", torch=lambda x: F().avg_pool2d(x, (2, 3), 2, ceil_mode=True))
row("OneHot", {"v": np.array([0.3, 1.7])}, {"axis": 1}, consts={"i": i64([[0, 2], [1, -1]]), "d": np.asarray(3)},
    order=["i", "d", "v"], opset=13)
row("Range", {"start": np.asarray(0.3), "delta": np.asarray(0.7)}, consts={"limit": np.asarray(3.3)},
    order=["start", "limit", "delta"], opset=13)

# -- transformer ops and ops defined by a function body -------------------------------------------------------
POS = i64([[0, 2, 1], [3, 3, 0]])
row("RotaryEmbedding", {"x": randn(2, 2, 3, 8), "cos": randn(4, 4), "sin": randn(4, 4)}, consts={"pos": POS},
    opset=23, tag="4d_position_ids_cache_grads")
row("RotaryEmbedding", {"x": randn(2, 3, 16)}, {"num_heads": 2, "rotary_embedding_dim": 4, "interleaved": 1},
    consts={"cos": randn(2, 3, 2), "sin": randn(2, 3, 2)}, opset=23, tag="3d_partial_interleaved")
row("Attention", {"q": randn(1, 2, 3, 4), "k": randn(1, 2, 5, 4), "v": randn(1, 2, 5, 4)}, opset=23,
    torch=lambda q, k, v: F().scaled_dot_product_attention(q, k, v))
row("Attention", {"q": randn(1, 2, 3, 4), "k": randn(1, 2, 5, 4), "v": randn(1, 2, 5, 4), "mask": randn(3, 5)},
    {"is_causal": 1, "softcap": 2.0, "scale": 0.3}, opset=23, tag="causal_softcap_float_mask")
row("Attention", {"q": randn(2, 3, 8), "k": randn(2, 5, 4), "v": randn(2, 5, 4)}, {"q_num_heads": 2, "kv_num_heads": 1},
    opset=23, tag="3d_grouped_query")
row("MeanVarianceNormalization", {"x": randn(2, 3, 4).astype(np.float32)}, {"axes": [0, 2]}, eps=1e-2, rtol=2e-2,
    atol=2e-3, tag="float32")   # its function body holds float32 constants: onnx.reference cannot run it in float64
row("AffineGrid", {"theta": randn(2, 2, 3).astype(np.float32)}, consts={"size": i64([2, 1, 3, 4])}, opset=20,
    eps=1e-2, rtol=2e-2, atol=2e-3, tag="float32",      # onnx.reference computes AffineGrid in float32
    torch=lambda t: F().affine_grid(t, [2, 1, 3, 4], align_corners=False))
row("CenterCropPad", {"x": randn(5, 3, 2)}, {"axes": [0, 1]}, consts={"shape": i64([3, 4])})
for mode in ["nearest", "linear"]:
    row("GridSample", {"x": randn(1, 2, 3, 4, 3), "g": uniform(-1.1, 1.1, 1, 2, 2, 3, 3)}, {"mode": mode},
        opset=22, tag=f"3d_{mode}",
        torch=lambda x, g, m=mode: F().grid_sample(x, g, {"linear": "bilinear"}.get(m, m), "zeros", False))
row("GridSample", {"x": randn(1, 2, 4, 5), "g": uniform(-1.2, 1.2, 1, 3, 2, 2)}, {"mode": "cubic", "align_corners": 1},
    opset=22, tag="cubic", torch=lambda x, g: F().grid_sample(x, g, "bicubic", "zeros", True))


# -- spectral ------------------------------------------------------------------------------------------------
def _cplx(x):
    """(..., 2) real pairs as a complex torch tensor."""
    return _t().view_as_complex(x.contiguous())


row("DFT", {"x": randn(2, 8, 1)}, {"axis": 1}, opset=18, tag="real_axis_attr",
    torch=lambda x: _t().view_as_real(_t().fft.fft(x[..., 0], dim=1)))
row("DFT", {"x": randn(3, 5, 2)}, opset=20, tag="complex_default_axis",
    torch=lambda x: _t().view_as_real(_t().fft.fft(_cplx(x), dim=1)))
row("DFT", {"x": randn(2, 6, 3, 2)}, {"inverse": 1}, consts={"n": i64(8), "axis": i64(1)}, opset=20,
    tag="inverse_zero_padded", torch=lambda x: _t().view_as_real(_t().fft.ifft(_cplx(x), n=8, dim=1)))
row("DFT", {"x": randn(2, 3, 9, 1)}, {"onesided": 1}, consts={"n": i64(6), "axis": i64(2)}, opset=20,
    tag="rfft_truncated", torch=lambda x: _t().view_as_real(_t().fft.rfft(x[..., 0], n=6, dim=2)))
row("DFT", {"x": randn(1, 4, 3, 2)}, {"inverse": 1, "onesided": 1}, consts={"_omit": NO_ROI, "axis": i64(1)},
    order=["x", "_omit", "axis"], opset=20, tag="irfft",
    torch=lambda x: _t().fft.irfft(_cplx(x), dim=1)[..., None])
row("DFT", {"x": randn(2, 5, 2)}, {"inverse": 1, "onesided": 1}, consts={"n": i64(7), "axis": i64(1)}, opset=20,
    tag="irfft_odd_length", torch=lambda x: _t().fft.irfft(_cplx(x), n=7, dim=1)[..., None])
row("STFT", {"signal": randn(2, 20, 1), "window": uniform(0.5, 1.5, 6)}, {"onesided": 1}, consts={"step": i64(3)},
    order=["signal", "step", "window"], opset=17, tag="real_window",  # onnx's inference misses the default onesided
    torch=lambda s, w: _t().view_as_real(_t().stft(s[..., 0], 6, 3, window=w, center=False, onesided=True,
                                                   return_complex=True).transpose(1, 2)))
row("STFT", {"signal": randn(1, 16, 2)}, {"onesided": 0}, consts={"step": i64(4), "_omit": NO_ROI, "n": i64(5)},
    order=["signal", "step", "_omit", "n"], opset=17, tag="complex_frame_length")

# -- patches, determinants, caches ---------------------------------------------------------------------------
row("Col2Im", {"x": randn(2, 12, 9)}, consts={"image": i64([4, 5]), "block": i64([2, 3])}, opset=18,
    torch=lambda x: F().fold(x, (4, 5), (2, 3)))
row("Col2Im", {"x": randn(1, 8, 12)}, {"strides": [2, 1], "dilations": [1, 2], "pads": [1, 1, 1, 1]},
    consts={"image": i64([5, 4]), "block": i64([2, 2])}, opset=18, tag="strided_dilated_padded",
    torch=lambda x: F().fold(x, (5, 4), (2, 2), dilation=(1, 2), padding=1, stride=(2, 1)))
row("Col2Im", {"x": randn(1, 4, 12)}, consts={"image": i64([2, 3, 4]), "block": i64([1, 2, 2])}, opset=18, tag="3d")
# onnx.reference rounds DeformConv's sampling coordinates to float32: finite differences on onnxruntime (float64)
row("DeformConv", {"x": randn(1, 1, 4, 4), "w": randn(1, 1, 2, 2), "off": uniform(-1.8, 1.8, 1, 8, 3, 3)},
    {"kernel_shape": [2, 2]}, opset=22, backend="ort")
row("DeformConv", {"x": randn(2, 4, 5, 4), "w": randn(4, 2, 2, 2), "off": uniform(-1.8, 1.8, 2, 16, 3, 4),
                   "b": randn(4), "mask": uniform(0.2, 1.0, 2, 8, 3, 4)},
    {"kernel_shape": [2, 2], "pads": [1, 1, 1, 1], "strides": [2, 1], "dilations": [1, 2], "group": 2,
     "offset_group": 2}, opset=22, backend="ort", tag="groups_mask_bias_strided_dilated")
row("Det", {"x": randn(3, 3)}, opset=13, torch=lambda x: _t().linalg.det(x))
row("Det", {"x": randn(2, 4, 4)}, opset=13, torch=lambda x: _t().linalg.det(x))
row("Det", {"x": np.array([[1.0, 2.0], [2.0, 4.0]])}, opset=13, tag="singular")  # no inverse needed; torch gives 0

row("TensorScatter", {"past": randn(2, 3, 6, 4), "new": randn(2, 3, 2, 4)}, consts={"w": i64([1, 4])}, opset=24)
row("TensorScatter", {"past": randn(3, 5, 2), "new": randn(3, 3, 2)}, {"mode": "circular", "axis": 1},
    consts={"w": i64([0, 3, 4])}, opset=24, tag="circular_axis1")
row("TensorScatter", {"past": randn(2, 4, 3), "new": randn(2, 2, 3)}, {"axis": 1}, opset=24, tag="no_write_indices")

# -- the table must cover every rule ------------------------------------------------------------------------
def test_every_rule_has_a_row():
    tested = {r.op for r in ROWS} | set(NON_DIFFERENTIABLE) | set(EXTRA_TESTED)
    missing = sorted(set(GRADIENT_RULES) - tested)
    assert not missing, f"rules without a row in the table: {missing}"


# Ops checked by dedicated tests in this folder (test_recurrent.py, test_control_flow.py), and the refused ones
# (test_refused_ops_raise_with_a_fix below).
EXTRA_TESTED = {"RNN", "GRU", "LSTM", "If", "Loop", "Scan", *UNSUPPORTED}

REFUSED = {  # op -> a model of it at an opset where it exists
    "Scatter": lambda: single_node_model("Scatter", {"d": randn(3, 3)}, opset=10,
                                         constant_inputs={"i": i64([[0, 2, 1]]), "u": randn(1, 3)}),
    "Upsample": lambda: single_node_model("Upsample", {"x": randn(1, 1, 2, 2).astype(np.float32)}, opset=9,
                                          constant_inputs={"s": f32([1, 1, 2, 2])}, mode="nearest"),
}


@pytest.mark.parametrize("op", sorted(UNSUPPORTED))
def test_refused_ops_raise_with_a_fix(op):
    from onnxtrain.autodiff.check import gradient_model
    from onnxtrain.errors import UnsupportedOpError

    model = REFUSED[op]()
    with pytest.raises(UnsupportedOpError, match=rf"^{op} node .* - help: convert the model"):
        gradient_model(model, [model.graph.input[0].name], {"y0": np.ones(1)})


def _run_row(r: Row):
    model = single_node_model(r.op, r.inputs, n_outputs=r.outputs, opset=r.opset, constant_inputs=r.consts,
                              input_order=r.order, **r.attrs)
    wrt = [k for k, v in r.inputs.items() if np.issubdtype(v.dtype, np.floating)]
    report = check_gradients(model, r.inputs, wrt, eps=r.eps, rtol=r.rtol, atol=r.atol, backend=r.backend)
    return report


@pytest.mark.parametrize("r", ROWS, ids=[r.id for r in ROWS])
def test_rule_matches_finite_differences(r: Row):
    report = _run_row(r)
    assert report.ok, f"{r.id}: {report}"
    if r.torch is None:
        return
    torch = _t()
    tensors = [torch.tensor(v, requires_grad=True) for v in r.inputs.values()]
    outs = r.torch(*tensors)
    outs = outs if isinstance(outs, tuple | list) else (outs,)
    loss = sum((o * torch.tensor(report.weights[f"y{k}"])).sum() for k, o in enumerate(outs)
               if f"y{k}" in report.weights and o.dtype.is_floating_point)
    grads = torch.autograd.grad(loss, tensors, allow_unused=True)
    for name, g in zip(r.inputs, grads):
        expected = np.zeros_like(r.inputs[name]) if g is None else g.numpy()
        tight = r.inputs[name].dtype == np.float64
        np.testing.assert_allclose(report.analytic[name], expected, rtol=1e-6 if tight else 1e-4,
                                   atol=1e-8 if tight else 1e-5, err_msg=f"{r.id}: d{name} differs from torch")



def _float32(values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: np.asarray(v, dtype=np.float32) if np.asarray(v).dtype == np.float64 else np.asarray(v)
            for k, v in values.items()}


@pytest.mark.parametrize("r", ROWS, ids=[r.id for r in ROWS])
def test_gradient_graph_runs_on_onnxruntime(r: Row):
    """The gradient graph, in float32, loads and runs on stock onnxruntime (every emitted op has a CPU
    kernel) and agrees with the float64 gradient onnx.reference computes."""
    ort = pytest.importorskip("onnxruntime")
    from onnxtrain.autodiff.check import gradient_model, run_model

    wrt = [k for k, v in r.inputs.items() if np.issubdtype(v.dtype, np.floating)]
    model64 = single_node_model(r.op, r.inputs, n_outputs=r.outputs, opset=r.opset, constant_inputs=r.consts,
                                input_order=r.order, **r.attrs)
    inputs32 = _float32(r.inputs)
    model32 = single_node_model(r.op, inputs32, n_outputs=r.outputs, opset=r.opset,
                                constant_inputs=_float32(r.consts), input_order=r.order, **r.attrs)
    try:
        ort.InferenceSession(model32.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"onnxruntime cannot run the forward {r.op} itself: {str(e).splitlines()[0][:120]}")
    outs = run_model(model64, r.inputs)
    weights = {o.name: np.random.default_rng(7).standard_normal(v.shape).astype(v.dtype)
               for o, v in zip(model64.graph.output, outs) if np.issubdtype(v.dtype, np.floating)}
    expected = run_model(gradient_model(model64, wrt, weights), r.inputs)[1:]
    got = run_model(gradient_model(model32, wrt, _float32(weights)), inputs32, backend="ort")[1:]
    for name, e, g in zip(wrt, expected, got):
        scale = float(np.abs(e).max()) if np.size(e) else 1.0
        np.testing.assert_allclose(g, e, rtol=2e-3, atol=2e-4 * (1 + scale), err_msg=f"{r.id}: d{name} on onnxruntime")


SYMBOLIC = [  # (op, inputs, attrs): inputs declared with symbolic dims, so unbroadcast works at run time
    ("MatMul", {"a": randn(3, 1, 2, 4), "b": randn(2, 4, 5)}, {}),
    ("Add", {"a": randn(2, 3, 4), "b": randn(3, 1)}, {}),
    ("Mul", {"a": randn(2, 1, 4), "b": randn(3, 4)}, {}),
    ("Where", {"c": rng.random((3, 1)) > 0.5, "a": randn(2, 3, 4), "b": randn(4)}, {}),
    ("ReduceMean", {"x": randn(2, 3, 4)}, {"axes": [1], "keepdims": 0}),
    ("Softmax", {"x": randn(2, 3, 4)}, {"axis": 1}),
]


@pytest.mark.parametrize("op,inputs,attrs", SYMBOLIC, ids=[s[0] for s in SYMBOLIC])
def test_symbolic_shapes(op, inputs, attrs):
    from onnx import helper

    opset = 17 if op == "ReduceMean" else 18
    names = list(inputs)
    graph = helper.make_graph(
        [helper.make_node(op, names, ["y"], **attrs)], op,
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), [f"{n}{i}" for i in range(v.ndim)])
         for n, v in inputs.items()],
        [helper.make_tensor_value_info("y", 11, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    wrt = [n for n, v in inputs.items() if v.dtype == np.float64]
    report = check_gradients(model, inputs, wrt)
    assert report.ok, report


@pytest.mark.parametrize("opset", [18, 21])
def test_group_normalization_without_shapes(opset):
    """Shape inference may leave the rank and sizes unknown (inputs declared without a shape): one gradient
    graph serves inputs of different ranks and sizes, on onnx.reference and on onnxruntime."""
    from onnx import helper

    from onnxtrain.autodiff.check import gradient_model, run_model

    graph = helper.make_graph(
        [helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=2)], "gn",
        [helper.make_tensor_value_info(n, 1, None) for n in "xsb"], [helper.make_tensor_value_info("y", 1, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    per = 2 if opset == 18 else 4
    weights = None
    for shape in [(2, 4, 3), (3, 4, 2, 5)]:
        feeds = {"x": randn(*shape).astype(np.float32), "s": randn(per).astype(np.float32),
                 "b": randn(per).astype(np.float32)}
        report = check_gradients(model, feeds, list(feeds), eps=1e-2, rtol=3e-2, atol=3e-3)
        assert report.ok, report
        weights = {"y": randn(*shape).astype(np.float32)}
        grads = gradient_model(model, list(feeds), weights)
        for e, g in zip(run_model(grads, feeds), run_model(grads, feeds, backend="ort")):
            np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5)


def test_mean_variance_normalization_without_shapes():
    """MeanVarianceNormalization (differentiated through its function body) with the input's rank and sizes
    unknown, at two ranks with one gradient graph (float32: the body's constants are float32)."""
    from onnx import helper

    from onnxtrain.autodiff.check import gradient_model, run_model

    graph = helper.make_graph([helper.make_node("MeanVarianceNormalization", ["x"], ["y"], axes=[0, 1])], "mvn",
                              [helper.make_tensor_value_info("x", 1, None)],
                              [helper.make_tensor_value_info("y", 1, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    for shape in [(3, 4), (2, 3, 4, 2)]:
        feeds = {"x": randn(*shape).astype(np.float32)}
        report = check_gradients(model, feeds, ["x"], eps=1e-2, rtol=3e-2, atol=3e-3)
        assert report.ok, report
        grads = gradient_model(model, ["x"], {"y": randn(*shape).astype(np.float32)})
        np.testing.assert_allclose(run_model(grads, feeds, backend="ort")[1], run_model(grads, feeds)[1],
                                   rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_resize_to_a_run_time_size(mode):
    """U-Net decoders resize to the skip connection's shape: sizes = Shape(skip), unknown when building."""
    from onnx import helper

    nodes = [helper.make_node("Shape", ["skip"], ["size"]),
             helper.make_node("Resize", ["x", "", "", "size"], ["y"], mode=mode)]
    graph = helper.make_graph(nodes, "resize", [helper.make_tensor_value_info("x", 11, [1, 2, 3, 4]),
                                                helper.make_tensor_value_info("skip", 11, [1, 2, "h", "w"])],
                              [helper.make_tensor_value_info("y", 11, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    report = check_gradients(model, {"x": randn(1, 2, 3, 4), "skip": np.zeros((1, 2, 5, 7))}, ["x"])
    assert report.ok, report


@pytest.mark.parametrize("batch", [2, 1])
def test_affine_grid_for_a_run_time_size(batch):
    """A spatial transformer samples a grid for the image's own size: AffineGrid(theta, Shape(x)), the batch unknown
    when building. The spec's body squeezes theta's (N, 1, 3) rows without axes, which lost their rank (no gradient
    graph) and would squeeze a batch of 1 away."""
    from onnx import helper

    nodes = [helper.make_node("Shape", ["x"], ["size"]),
             helper.make_node("AffineGrid", ["theta", "size"], ["y"], align_corners=0)]
    graph = helper.make_graph(nodes, "affine_grid", [helper.make_tensor_value_info("theta", 1, ["n", 2, 3]),
                                                     helper.make_tensor_value_info("x", 1, ["n", 1, "h", "w"])],
                              [helper.make_tensor_value_info("y", 1, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 9
    feeds = {"theta": randn(batch, 2, 3).astype(np.float32), "x": np.zeros((batch, 1, 3, 4), np.float32)}
    report = check_gradients(model, feeds, ["theta"], eps=1e-2, rtol=2e-2, atol=2e-3)  # AffineGrid runs in float32
    assert report.ok, report


@pytest.mark.parametrize("backend", ["ort", "reference"])
@pytest.mark.parametrize("attrs", [{"kernel_shape": [2, 2], "strides": [2, 2]},
                                   {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}],
                         ids=["apart", "overlapping"])
def test_max_pool_ties_go_to_the_first_maximum_as_in_torch(backend, attrs):
    """Ties are not differentiable, so finite differences cannot check them; torch's choice (the first
    maximum of each window gets all of dY) is the reference. ReLU outputs and flat image regions tie often."""
    torch = _t()
    from onnxtrain.autodiff.check import gradient_model, run_model

    x = np.maximum(rng.standard_normal((2, 3, 6, 6)), 0).astype(np.float32)
    x[:, :, :4, :4] = 0.5
    model = single_node_model("MaxPool", {"x": x}, **attrs)
    y = run_model(model, {"x": x}, backend=backend)[0]
    dy = rng.standard_normal(y.shape).astype(np.float32)
    got = run_model(gradient_model(model, ["x"], {model.graph.output[0].name: dy}), {"x": x}, backend=backend)[1]
    xt = torch.tensor(x, requires_grad=True)
    k, st, pad = attrs["kernel_shape"][0], attrs["strides"][0], attrs.get("pads", [0])[0]
    F().max_pool2d(xt, k, st, padding=pad).backward(torch.tensor(dy))
    np.testing.assert_allclose(got, xt.grad.numpy(), rtol=1e-6, atol=1e-6)


def test_clip_gradient_at_the_bounds_follows_torch_hardtanh():
    """Exactly on a bound the gradient stops (torch's hardtanh and ReLU6, the usual sources of Clip): the mask
    is read from the output alone, so Clip's input need not be kept for the backward."""
    torch = _t()
    from onnxtrain.autodiff.check import gradient_model, run_model

    x = np.array([[-1.0, -0.5, 0.0, 0.25, 0.5, 0.75]], dtype=np.float32)
    model = single_node_model("Clip", {"x": x}, constant_inputs={"lo": np.float32(-0.5), "hi": np.float32(0.5)})
    dy = np.arange(1, 7, dtype=np.float32).reshape(1, 6)
    grads = gradient_model(model, ["x"], {model.graph.output[0].name: dy})
    got = run_model(grads, {"x": x}, backend="ort")[1]
    xt = torch.tensor(x, requires_grad=True)
    torch.nn.functional.hardtanh(xt, -0.5, 0.5).backward(torch.tensor(dy))
    np.testing.assert_array_equal(got, xt.grad.numpy())
    np.testing.assert_array_equal(got, [[0, 0, 3, 4, 0, 0]])
    clip = next(n for n in grads.graph.node if n.op_type == "Clip")
    readers = [n.op_type for n in grads.graph.node if clip.input[0] in n.input and n is not clip]
    assert readers == [], f"the backward reads Clip's input: {readers}"
