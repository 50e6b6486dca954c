"""What other exporters write and a training graph cannot take as it is (docs/foreign-exporters.md).

- ``detach_foreign_ops``: after ``ml_ops.lower_ml_ops`` has rewritten linear models and scalers, scikit-learn
  models converted by skl2onnx still end in ``ai.onnx.ml`` ops (the class label through
  ``ArrayFeatureExtractor``, probabilities as a ``ZipMap`` sequence of maps). No loss reads those outputs and
  stock-onnxruntime artifacts may only hold default-domain ops, so the nodes outside the default domain and
  everything computed from them are taken out; the outputs lost are remembered, so that a loss asked to read
  one gets an error that names it and the output to use instead (``check_loss_inputs``).
- ``annotate_reshape_ranks``: ONNX shape inference of Reshape before opset 14 ignores the length of a shape
  computed at run time (tf2onnx's Tensordot and einsum write such shapes), so every value after it has no rank;
  the rank is that length.
- Model simplifiers (onnxsim, onnxslim, onnxoptimizer's fuse passes) fold a BatchNorm into its convolution and a
  weight's Transpose into a new constant under names of their own, and drop every node's metadata, where torch's
  dynamo exporter keeps the records that give parameters their torch names back: ``warn_lost_torch_records`` warns
  when a dynamo export lost them (and params.simplifier_names_hint explains the names in a requires_grad error).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx

from onnxtrain.artifacts.contrib_ops import CONTRIB, LOWERED, lower_contrib_ops
from onnxtrain.artifacts.ml_ops import lower_ml_ops
from onnxtrain.artifacts.params import QUANTIZED_ADVICE
from onnxtrain.ir.passes import clone, declare_as_inputs, node_inputs
from onnxtrain.ir.torch_records import FX_NODE
from onnxtrain.ir.types import FLOAT_TYPES, infer_tensor_info

__all__ = ["Detached", "detach_foreign_ops", "annotate_reshape_ranks", "check_loss_inputs", "warn_lost_torch_records"]

_SKL2ONNX_HINT = ("onnxtrain rewrites scikit-learn's linear models and scalers (LinearClassifier, LinearRegressor, "
                  "Scaler, Normalizer) as default-domain ops; tree ensembles, SVMs and other ai.onnx.ml ops have no "
                  "gradient to train, so only a model whose trainable part is written with default-domain ops "
                  "(an MLP, a linear model) can be fine-tuned")


CONTRIB_HINT = ("onnxruntime's optimizer (onnxruntime.transformers optimize_model, or an optimized model saved by "
                "a session) fused these; onnxtrain rewrites " + ", ".join(LOWERED) + " as standard ops, but not "
                "the others: train the model as it was exported, before the optimizer, or optimize it with those "
                "fusions off (e.g. FusionOptions.enable_attention = False)")

NCHWC_HINT = ("onnxruntime's ORT_ENABLE_ALL level, saved with optimized_model_filepath, lays the convolutions out "
              "for this machine's CPU (com.microsoft.nchwc); train the model as it was exported, or save it from a "
              "session at ORT_ENABLE_EXTENDED or below")

QOPERATOR_HINT = ("onnxruntime.quantization (QOperator format, or quantize_dynamic) wrote these integer ops; "
                  + QUANTIZED_ADVICE)


def _foreign_hint(ops: Sequence[str]) -> str:
    """What made the ops ``ops`` (spelled ``domain::op_type``) and what to do, after "; ", or ''."""
    domains = {op.rpartition("::")[0] for op in ops}
    # onnxruntime's quantized ops: QGemm, QLinearAdd, QAttention, DynamicQuantizeMatMul, MatMulIntegerToFloat
    quantized = any(d == CONTRIB and (t.startswith("Q") or "Quantize" in t or "Integer" in t)
                    for d, _, t in (op.rpartition("::") for op in ops))
    return (f"; {_SKL2ONNX_HINT}" if "ai.onnx.ml" in domains else f"; {NCHWC_HINT}" if CONTRIB + ".nchwc" in domains
            else f"; {QOPERATOR_HINT}" if quantized else f"; {CONTRIB_HINT}" if CONTRIB in domains else "")


def _describe(graph: onnx.GraphProto, name: str) -> str:
    for vi in graph.output:
        if vi.name == name:
            tp = vi.type
            if tp.HasField("sequence_type") and tp.sequence_type.elem_type.HasField("map_type"):
                return "a sequence of maps"
            if tp.HasField("tensor_type") and tp.tensor_type.elem_type not in FLOAT_TYPES:
                elem = onnx.helper.tensor_dtype_to_string(tp.tensor_type.elem_type).removeprefix("TensorProto.")
                elem = elem.lower()
                return f"{'an' if elem[0] in 'aeiou' else 'a'} {elem} tensor"
    return "a value"


@dataclass
class Detached:
    """What ``detach_foreign_ops`` took out: ``{graph output: why}``, and the float values the removed nodes read
    (e.g. the probabilities tensor a ZipMap reads), which a loss can read instead."""

    outputs: dict[str, str] = field(default_factory=dict)
    read: list[str] = field(default_factory=list)


def detach_foreign_ops(model: onnx.ModelProto, weights: dict[str, np.ndarray]) -> Detached:
    """Remove, in place, every node outside the default domain and the nodes computed from them, with the graph
    outputs they make. Raises ValueError if no output is left and no float value computed by default-domain
    ops feeds the removed nodes (nothing a loss could read: e.g. a LinearClassifier on the model's input)."""
    lower_ml_ops(model, weights)  # linear models and scalers: default-domain ops that train (ml_ops.py)
    lower_contrib_ops(model, weights)  # onnxruntime's fused GELUs and LayerNorms (contrib_ops.py)
    graph = model.graph
    foreign = [n for n in graph.node if n.domain not in ("", "ai.onnx")]
    if not foreign:
        _default_domain_only(model)
        return Detached()
    cause: dict[str, onnx.NodeProto] = {}  # value -> the foreign node it is computed from
    kept = []
    for node in graph.node:
        source = node if node.domain not in ("", "ai.onnx") else next(
            (cause[x] for x in node_inputs(node) if x in cause), None)
        if source is None:
            kept.append(node)
        else:
            cause.update((o, source) for o in node.output if o)
    removed = {o.name: f"{_describe(graph, o.name)} made by {cause[o.name].domain}::{cause[o.name].op_type} "
                       f"(node {cause[o.name].name!r})" for o in graph.output if o.name in cause}
    made_by_kept = {o for n in kept if n.op_type != "Constant" for o in n.output}   # a constant is no loss input
    removed_nodes = [n for n in graph.node if any(o in cause for o in n.output)]
    read = list(dict.fromkeys(x for n in removed_nodes for x in node_inputs(n) if x in made_by_kept))
    if read:
        view = clone(model)
        declare_as_inputs(view, weights)
        infos = infer_tensor_info(view)
        read = [x for x in read if x in infos and infos[x].is_float]
    if len(removed) == len(graph.output) and not read:
        ops = sorted({f"{n.domain}::{n.op_type}" for n in foreign})
        hint = _foreign_hint(ops)
        raise ValueError(f"every output of the model is computed by ops outside the default ONNX domain "
                         f"({', '.join(ops)}), which have no gradient and cannot be in stock-onnxruntime "
                         f"artifacts{hint}")
    outputs = [o for o in graph.output if o.name not in removed]
    del graph.node[:]
    graph.node.extend(kept)
    del graph.output[:]
    graph.output.extend(outputs)
    _default_domain_only(model)
    return Detached(removed, read)


def _default_domain_only(model: onnx.ModelProto) -> None:
    kept = [op for op in model.opset_import if op.domain in ("", "ai.onnx")]
    if len(kept) != len(model.opset_import):
        del model.opset_import[:]
        model.opset_import.extend(kept)


def annotate_reshape_ranks(model: onnx.ModelProto, weights: dict[str, np.ndarray]) -> None:
    """Declare, in place, the rank of each Reshape output that shape inference leaves unknown before opset 14.

    The ranks come from inferring the graph once more as if it were opset 14 (whose Reshape inference reads the
    length of the shape input): one pass, where declaring the ranks one Reshape at a time would take one pass per
    Reshape along a chain (each Tensordot's shape is computed from the previous one's output)."""
    reshapes = [n for n in model.graph.node if n.op_type == "Reshape" and n.input[1] not in weights]
    if not reshapes:
        return
    view = clone(model)
    added = declare_as_inputs(view, weights)
    view.graph.initializer.extend(onnx.numpy_helper.from_array(weights[n], n) for n in added
                                  if weights[n].dtype.kind == "i" and weights[n].size <= 64)
    infos = infer_tensor_info(view)
    unknown = [n.output[0] for n in reshapes if infos.get(n.output[0]) is None or infos[n.output[0]].shape is None]
    if not unknown:
        return
    for opset in view.opset_import:
        if opset.domain in ("", "ai.onnx"):
            opset.version = max(opset.version, 14)
    infos = infer_tensor_info(view)
    model.graph.value_info.extend(onnx.helper.make_tensor_value_info(name, infos[name].elem_type,
                                                                     [None] * len(infos[name].shape))
                                  for name in unknown if name in infos and infos[name].shape is not None)


def _softmax_input(graph: onnx.GraphProto, name: str) -> str | None:
    """The input of the Softmax that ``name`` is (through Identity nodes), if any: the logits."""
    producers = {o: n for n in graph.node for o in n.output}
    node = producers.get(name)
    while node is not None and node.op_type == "Identity":
        node = producers.get(node.input[0])
    return node.input[0] if node is not None and node.op_type == "Softmax" else None


def check_loss_inputs(graph: onnx.GraphProto, detached: Detached, loss_inputs: Sequence[str] | None,
                      extras: Sequence[str], first_output: str, loss_name: str, all_outputs: bool = False) -> None:
    """Raise ValueError if the loss or ``extras`` would read an output ``detach_foreign_ops`` removed, or a loss
    reads a non-float output; warn if a cross-entropy loss reads probabilities (a Softmax output).

    ``first_output`` is the source model's first output (before any was removed), which built-in losses read by
    default; ``loss_name`` is the loss's class name ("" when the model's first output is the loss);
    ``all_outputs``: the loss (a custom block) reads every output of the model unless ``loss_inputs`` is given.
    """
    removed = detached.outputs
    infos = {vi.name: vi for vi in graph.output}
    floats = [o.name for o in graph.output
              if o.type.HasField("tensor_type") and o.type.tensor_type.elem_type in FLOAT_TYPES]
    floats += [x for x in detached.read if x not in floats]

    def instead() -> str:
        logits = [(f, _softmax_input(graph, f)) for f in floats]
        text = (f"the model's floating-point outputs (or values the removed ops read) are {floats}" if floats
                else "the model has no float output")
        for probs, z in logits:
            if z is not None:
                text += (f"; {probs!r} is a Softmax of {z!r}: for a cross-entropy loss pass "
                         f"loss_input_names=[{z!r}] (the logits)")
        return text

    if all_outputs and not loss_inputs and removed:
        raise ValueError(f"{loss_name} reads every output of the model, and {sorted(removed)} cannot be read: "
                         f"{'; '.join(f'{k!r} is {v}' for k, v in removed.items())}; pass loss_input_names with the "
                         f"values it reads: {instead()}")
    asked = list(loss_inputs) if loss_inputs else [first_output]
    default = "" if loss_inputs else (" (a built-in loss reads the model's first output unless loss_input_names "
                                      "says otherwise)" if loss_name else " (the model's first output is the loss)")
    for name in asked:
        if name in removed:
            hint = _foreign_hint(re.findall(r"[\w.]+::\w+", removed[name]))
            raise ValueError(f"{loss_name or 'the loss'} cannot read {name!r}{default}: it is {removed[name]}, "
                             f"which no loss can read and stock-onnxruntime artifacts cannot contain{hint}; "
                             f"{instead()}")
        vi = infos.get(name)
        if (vi is not None and vi.type.HasField("tensor_type")
                and vi.type.tensor_type.elem_type not in FLOAT_TYPES and loss_name):
            raise ValueError(f"{loss_name} cannot read {name!r}{default}: it is {_describe(graph, name)}, not "
                             f"floating-point scores; {instead()}")
        logits = _softmax_input(graph, name)
        if loss_name == "CrossEntropyLoss" and logits is not None:
            warnings.warn(f"CrossEntropyLoss reads {name!r}, the output of a Softmax: the loss applies its own "
                          f"softmax, so it would train on probabilities as if they were logits; pass "
                          f"loss_input_names=[{logits!r}] (the Softmax's input; onnxtrain generate --loss-inputs "
                          f"{logits})", stacklevel=3)
    for name in extras:
        if name in removed:
            raise ValueError(f"additional_output_names: {name!r} is {removed[name]}, which stock-onnxruntime "
                             f"artifacts cannot contain; compute it from {floats} after the step instead")


_DYNAMO_NODE = re.compile(r"node_\w+")


def warn_lost_torch_records(model: onnx.ModelProto) -> None:
    """Warn if ``model`` is an export of torch's dynamo exporter (producer ``pytorch``, nodes named ``node_*``)
    without the records it writes on every node (``pkg.torch.onnx.fx_node``) and on the graph (the exported
    program's signature): a tool that rewrote the model dropped them, and with them what tells onnxtrain the
    torch names of the parameters the exporter's optimizer transposed, merged or folded (docs/foreign-exporters.md)."""
    graph = model.graph
    if model.producer_name != "pytorch" or not graph.node or len(graph.metadata_props):
        return
    named = sum(1 for n in graph.node if _DYNAMO_NODE.fullmatch(n.name))
    if 2 * named < len(graph.node) or any(p.key == FX_NODE for n in graph.node for p in n.metadata_props):
        return
    tool = " by onnxsim" if any(p.key.startswith("onnxsim.") for p in model.metadata_props) else ""
    warnings.warn(f"the model is an export of torch.onnx.export(dynamo=True) rewritten{tool} without the exporter's "
                  f"records ({FX_NODE} on each node, the exported program's signature on the graph), which tools "
                  f"such as onnxsim, onnxslim and onnxoptimizer drop: the parameters the exporter's graph optimizer "
                  f"stored transposed (val_N), merged or folded (a BatchNorm into its convolution, whose weight keeps "
                  f"the convolution's name) train as the file has them, without their torch names and without a "
                  f"warning naming each; generate from the model as torch.onnx.export wrote it (export with "
                  f"optimize=False to keep every parameter)", stacklevel=4)
