"""Which default-domain ONNX ops onnxtrain differentiates, and how.

    python -m onnxtrain.autodiff.coverage > docs/ops.md

Every op of ``onnx.defs`` (default domain, latest version, deprecated ops left out) gets one status:

- ``rule``: a gradient rule is registered for it;
- ``function body``: no rule, but the spec defines the op by a function body, which is expanded and
  differentiated (see ``function_body.py``);
- ``zero gradient``: piecewise constant (Floor, Round, Sign, ...): its inputs get no gradient;
- ``not differentiable``: no floating-point output, or no floating-point input to differentiate;
- ``unsupported``: none of the above; a gradient through it raises UnsupportedOpError.
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass

import onnx
from onnx import defs

from onnxtrain.autodiff.function_body import has_function_body
from onnxtrain.autodiff.registry import GRADIENT_RULES, NON_DIFFERENTIABLE
from onnxtrain.autodiff.unsupported import UNSUPPORTED

__all__ = ["OpCoverage", "STATUSES", "PEER_OPS", "coverage_table", "markdown"]

STATUSES = ("rule", "function body", "zero gradient", "not differentiable", "unsupported")

# The standard ops onnxruntime-training 1.19.2 has gradient builders for.
PEER_OPS = frozenset("""
Abs Add AveragePool BatchNormalization Cast Clip Concat Conv ConvTranspose Cos Div Dropout Erf Exp Expand Flatten
Gather GatherElements GatherND Gelu Gemm GlobalAveragePool GRU Identity LayerNormalization LeakyRelu Log LogSoftmax
LSTM MatMul Max MaxPool Min Mul Neg Pad Pow Reciprocal ReduceL2 ReduceLogSumExp ReduceMean ReduceSum Relu Reshape
Resize ScatterElements ScatterND Sigmoid Sin Slice Softmax SoftmaxCrossEntropyLoss Split Sqrt Squeeze Sub Tanh Tile
TopK Transpose Trilu Unsqueeze Where""".split())

# Limits of rules, and why the unsupported ops are.
NOTES = {
    "RNN": "unrolled (static length) or a Scan (dynamic)",
    "GRU": "unrolled (static length) or a Scan (dynamic)",
    "LSTM": "unrolled (static length) or a Scan (dynamic)", "If": "both branches",
    "GridSample": "2-D and 3-D; linear (any padding), nearest (zeros/border), cubic (zeros)",
    "Resize": "keep_aspect_ratio_policy with align_corners or half_pixel_symmetric refused",
    "CumProd": "inputs without zeros", "LpNormalization": "p = 1 or 2",
    "ScatterElements": "reduction mul: updates without zeros", "ScatterND": "reduction mul: updates without zeros",
    "Attention": "recomputes the attention in the backward graph",
    "Det": "cofactors from minors (no inverse)", "DeformConv": "2-D; recomputed from GridSample and MatMul",
    "RoiAlign": "no rule yet",
    "MaxRoiPool": "no rule yet", "Col2Im": "constant block_shape (im2col as a Conv with one-hot kernels)",
    "DFT": "the adjoint transform; constant axis", "STFT": "recomputed from frames and a DFT", "Unique": "no rule yet",
    "Scan": "opset 10+; a reverse Scan of the step's gradient",
    "Loop": "opset 10+; a reverse Scan of the step's gradient; not zero iterations on onnxruntime",
    "DequantizeLinear": "no rule yet (quantized training)", "QLinearMatMul": "quantized",
    "BitCast": "reinterprets bits",
}


@dataclass(frozen=True)
class OpCoverage:
    op: str
    version: int          # latest version of the op in the installed onnx
    status: str
    peer: bool            # onnxruntime-training 1.19.2 differentiates it
    note: str = ""


_FLOAT_TYPES = ("tensor(float16)", "tensor(float)", "tensor(double)", "tensor(bfloat16)")


def _can_be_float(schema: defs.OpSchema, params) -> bool:
    """Whether one of ``params`` may hold floating-point tensors (also inside sequences and optionals)."""
    allowed = {t.type_param_str: list(t.allowed_type_strs) for t in schema.type_constraints}
    return any(f in t for p in params for t in allowed.get(p.type_str, [p.type_str]) for f in _FLOAT_TYPES)


def _container(schema: defs.OpSchema) -> bool:
    types = [t for c in schema.type_constraints for t in c.allowed_type_strs]
    return any(t.startswith(("seq(", "optional(")) for t in types)


def _status(schema: defs.OpSchema) -> tuple[str, str]:
    op = schema.name
    float_out, float_in = _can_be_float(schema, schema.outputs), _can_be_float(schema, schema.inputs)
    if op in UNSUPPORTED:
        return "unsupported", UNSUPPORTED[op].split(" - help:")[0].split(": ", 1)[-1]
    if op in GRADIENT_RULES and op not in NON_DIFFERENTIABLE:
        return "rule", NOTES.get(op, "")
    if _container(schema) and float_out:
        return "unsupported", "sequence and optional values are not differentiated"
    if not float_out:
        return "not differentiable", "integer, boolean or string outputs"
    if not float_in or op == "BitCast":
        return "not differentiable", NOTES.get(op, "no floating-point input")
    if op in NON_DIFFERENTIABLE:
        return "zero gradient", "piecewise constant"
    if has_function_body(op, schema.since_version):
        return "function body", NOTES.get(op, "")
    return "unsupported", NOTES.get(op, "no rule and no function body")


def coverage_table() -> list[OpCoverage]:
    """One row per default-domain op (latest version, deprecated ops excluded), sorted by name."""
    schemas = {}
    for s in defs.get_all_schemas():
        if s.domain in ("", "ai.onnx") and not s.deprecated:
            schemas[s.name] = s
    rows = []
    for name in sorted(schemas):
        status, note = _status(schemas[name])
        rows.append(OpCoverage(name, schemas[name].since_version, status, name in PEER_OPS, note))
    return rows


def markdown(rows: list[OpCoverage] | None = None) -> str:
    rows = coverage_table() if rows is None else rows
    counts = Counter(r.status for r in rows)
    lines = [
        "# Gradient coverage of the ONNX operators",
        "",
        f"Generated by `python -m onnxtrain.autodiff.coverage` against onnx {onnx.__version__} "
        f"({len(rows)} default-domain operators, deprecated ones left out). "
        "*peer* marks the ops onnxruntime-training 1.19.2 has gradients for.",
        "",
        "| status | ops |",
        "|---|---|",
        *[f"| {s} | {counts.get(s, 0)} |" for s in STATUSES],
        "",
        "- **rule**: a gradient rule (`onnxtrain/autodiff/*.py`).",
        "- **function body**: the spec defines the op by a function body; it is expanded and differentiated.",
        "- **zero gradient**: piecewise constant; its inputs get no gradient.",
        "- **not differentiable**: no floating-point output (or input); nothing to differentiate.",
        "- **unsupported**: a parameter upstream of it cannot be trained (freeze it, or export differently).",
        "",
        "| op | version | status | peer | note |",
        "|---|---|---|---|---|",
        *[f"| {r.op} | {r.version} | {r.status} | {'yes' if r.peer else ''} | {r.note} |" for r in rows],
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    sys.stdout.write(markdown())


if __name__ == "__main__":
    main()
