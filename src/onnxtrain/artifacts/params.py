"""Which initializers are trained, frozen, kept as state buffers, or left as constants."""

from __future__ import annotations

import fnmatch
import logging
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx

from onnxtrain.artifacts.torch_names import (
    folded_parameter,
    folded_sources,
    graph_signature,
    recorded_kinds,
    tied_parameters,
    torch_tensors,
)
from onnxtrain.ir.passes import ancestors, node_inputs
from onnxtrain.ir.types import FLOAT_TYPES

logger = logging.getLogger(__name__)

__all__ = ["ParameterPlan", "plan_parameters", "batchnorm_buffers", "expand_names", "check_state_dtypes"]


@dataclass
class ParameterPlan:
    trainable: list[str] = field(default_factory=list)
    frozen: list[str] = field(default_factory=list)
    buffers: list[str] = field(default_factory=list)  # updated by the training graph, not by gradients
    inputs: list[str] = field(default_factory=list)   # graph inputs whose gradient is an output (onnxblock)


def batchnorm_buffers(graph: onnx.GraphProto, initializers: set[str]) -> list[str]:
    """Running mean/var initializers of training-mode BatchNormalization nodes."""
    found: list[str] = []
    for node in graph.node:
        if node.op_type != "BatchNormalization":
            continue
        training = any(a.name == "training_mode" and a.i for a in node.attribute)
        if training:
            found += [x for x in node.input[3:5] if x in initializers and x not in found]
    return found


def running_statistics(graph: onnx.GraphProto) -> set[str]:
    """Running mean/var inputs of every BatchNormalization node (statistics, never trained by gradients: in
    training mode they are buffers, in inference mode constants)."""
    return {x for node in graph.node if node.op_type == "BatchNormalization" for x in node.input[3:5] if x}


WEIGHTS_AS_INPUTS = ("torch.onnx.export(..., export_params=False) writes the weights as graph inputs without "
                     "values; export the model with its weights (export_params=True, the default)")


RENAMED_BY_FOLDING = ("its constant folding (do_constant_folding=True, the default) stores the weight of a Linear "
                      "that reads a 3-D input transposed under a new name (onnx::MatMul_N) and folds a BatchNorm into "
                      "the convolution before it (onnx::Conv_N); export with do_constant_folding=False to keep the "
                      "parameters' names, or name these")


FOLDED_BY_DYNAMO = ("export with optimize=False to train it, or train the folded tensors under their own names "
                    "(requires_grad=None trains every one)")


# The names model simplifiers give the tensors they compute from parameters (a convolution with its BatchNorm
# folded in, a transposed weight): onnxsim's ``_v_<n>``; a folded node's output, ``/<scope>/<Op>_output_<n>``
# (onnxslim; ``_weight``/``_bias`` appended for a fused BatchNorm); onnxoptimizer's fuse_bn_into_conv, a number.
_SIMPLIFIER_NAMES = re.compile(r"_v_\d+|/.*_output_\d+(_weight|_bias)?|\d+")

SIMPLIFIED_ADVICE = ("model simplifiers (onnxsim, onnxslim, onnxoptimizer's fuse_bn_into_conv) fold a BatchNorm into "
                     "the convolution before it and a weight's Transpose into a new constant, so the parameters these "
                     "were computed from are gone; train the model as the exporter wrote it (and simplify the trained "
                     "model afterwards), or name these")


def simplifier_names_hint(candidates: Sequence[str]) -> str:
    """For the error of a parameter name the model lacks: ``"; <why>"`` if some of ``candidates`` (the float
    initializers) have the names a model simplifier gives the tensors it computed, else ``""``."""
    made = [c for c in candidates if _SIMPLIFIER_NAMES.fullmatch(c)]
    if not made:
        return ""
    return (f"; {len(made)} initializers have names a model simplifier gives the tensors it computes (e.g. "
            f"{made[:3]}): {SIMPLIFIED_ADVICE}")


def keras_names_hint(name: str, candidates: Sequence[str]) -> str:
    """For the error of a Keras variable path the model lacks (``logits/kernel``, Keras 2's ``dense/kernel:0``):
    ``"; <where it went>"`` listing the initializers under a name scope of that layer, else ``""``. tf2onnx
    names a weight after the TensorFlow op that reads it (``functional_1/logits_1/Cast/ReadVariableOp:0``), under
    the layer's scope, which TensorFlow may suffix (``logits_1``)."""
    parts = name.removesuffix(":0").split("/")
    if len(parts) < 2:
        return ""
    layer = re.compile(rf"{re.escape(parts[-2])}(_\d+)?")
    scopes: dict[str, list[str]] = {}
    for c in candidates:
        segments = c.split("/")
        at = next((i for i, s in enumerate(segments[:-1]) if layer.fullmatch(s)), None)
        if at is not None:
            scopes.setdefault("/".join(segments[:at + 1]), []).append(c)
    if not scopes:
        return ""
    found = "; ".join(f"under {scope!r}: {names[:4]}" for scope, names in list(scopes.items())[:3])
    first = next(iter(scopes))
    return (f"; it looks like a Keras variable path, and tf2onnx names each weight after the TensorFlow op that "
            f"reads it, under its layer's name scope (a BatchNormalization's gamma, beta and statistics folded into "
            f"two tensors), {found}: name these, or a scope's glob (requires_grad=['{first}/*'])")


def expand_names(names: Sequence[str] | None, candidates: Sequence[str], what: str, strict: bool = True,
            graph_inputs: frozenset[str] = frozenset(), graph: onnx.GraphProto | None = None) -> list[str]:
    """Resolve names and shell-style globs against ``candidates``; unknown names are an error (``strict``) or
    are skipped with a warning. ``graph_inputs``: the model's inputs, named in the error; ``graph``: the model,
    whose torch records (torch_names.py) can tell where a missing parameter went."""
    if names is None:
        return []
    if isinstance(names, str):
        raise TypeError(f"{what} must be a list of names, got the string {names!r}")
    out: list[str] = []
    skipped: list[str] = []
    tied: dict[str, str] | None = None   # read from the torch records once, at the first name not found
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"{what}: parameter names must be strings, got {name!r}")
        hits = [c for c in candidates if c == name] or (
            [c for c in candidates if fnmatch.fnmatchcase(c, name)] if any(ch in name for ch in "*?[") else [])
        if not hits and graph is not None:   # torch ties it to a parameter the export named: the same tensor
            tied = tied_parameters(graph, set(candidates)) if tied is None else tied
            hits = [tied[name]] if name in tied else []
        if not hits and not strict:
            skipped.append(name)
            continue
        if not hits and name in graph_inputs:
            raise ValueError(f"{what}: {name!r} is an input of the model, not an initializer: it has no value to "
                             f"train from" + (f" ({WEIGHTS_AS_INPUTS})" if not candidates else ""))
        folded = folded_parameter(graph, name, candidates) if not hits and graph is not None else None
        if folded is not None:
            raise ValueError(f"{what}: {name!r} is not an initializer of the model: torch.onnx.export's graph "
                             f"optimizer (dynamo=True and optimize=True, its defaults) folded it {folded}, and its "
                             f"own values are gone; {FOLDED_BY_DYNAMO}")
        if not hits and graph is not None and name in torch_tensors(graph, "PARAMETER"):
            raise ValueError(f"{what}: {name!r} is not an initializer of the model: torch.onnx.export's graph "
                             "optimizer (dynamo=True and optimize=True, its defaults) stored it once with another "
                             "parameter of equal values (a fresh model's zero biases), read by nodes that record no "
                             "torch call to tell them apart; export with optimize=False to train it")
        # onnxruntime.quantization's names for its integers (a Gemm's transB weight is transposed first)
        quantized = next((q for q in (name + "_quantized", name + "_Transposed_quantized") if q in candidates), None)
        if not hits and quantized is not None:
            raise ValueError(f"{what}: {name!r} is not an initializer of the model: onnxruntime.quantization stored "
                             f"it as the integers {quantized!r}, which cannot train; {QUANTIZED_ADVICE}")
        if not hits:
            # a torch name without the prefix of a wrapping module ('2.*' for 'm.2.*'), else a similar name
            close = ([c for c in candidates if fnmatch.fnmatchcase(c, "*." + name)][:5]
                     or [c for c in candidates if name.split(".")[-1] in c][:5])
            made_up = [c for c in candidates if c.startswith("onnx::")]
            raise ValueError(f"{what}: {name!r} is not an initializer of the model"
                             + (f" (similar names: {close})" if close else f" ({len(candidates)} initializers)")
                             + (f"; {len(made_up)} initializers have names torch.onnx.export made up (e.g. "
                                f"{made_up[:3]}): {RENAMED_BY_FOLDING}" if made_up else "")
                             + simplifier_names_hint(candidates) + keras_names_hint(name, candidates))
        if hits and graph is not None and any(ch in name for ch in "*?["):
            _warn_folded_misses(graph, name, candidates, hits, what)
        out += [h for h in hits if h not in out]
    if skipped:
        warnings.warn(f"{what}: {len(skipped)} names are not initializers of the model and are ignored (as "
                      f"onnxruntime-training does): {skipped[:8]}", stacklevel=3)
    return out


def _warn_folded_misses(graph: onnx.GraphProto, pattern: str, candidates: Sequence[str], hits: list[str],
                        what: str) -> None:
    """Warn when a glob over torch names misses weights torch's constant folding renamed (``onnx::MatMul_N``) that
    nodes of a module it covers read: ``layer.1.*`` would train that layer's biases and norms but not its Linear
    weights. The module is the TorchScript node's scope (``/encoder/layer.1/attention/self/query/MatMul``)."""
    made_up = {c for c in candidates if c.startswith("onnx::") and c not in hits}
    if not made_up:
        return
    missed = []
    for node in graph.node:
        scope = node.name.strip("/").split("/")[:-1]
        for x in node.input:
            if x in made_up and scope and fnmatch.fnmatchcase(".".join(scope) + ".weight", pattern):
                missed.append(f"{x} (read by {node.name})")
                made_up.discard(x)
    if missed:
        warnings.warn(f"{what}: {pattern!r} matches the module of {len(missed)} weights that torch's export renamed, "
                      f"which it does not train: {missed[:3]}; {RENAMED_BY_FOLDING} too", stacklevel=4)


def plan_parameters(graph: onnx.GraphProto, weights: dict[str, np.ndarray], requires_grad: Sequence[str] | None,
                    frozen_params: Sequence[str] | None, trainable_ops: int = -1) -> ParameterPlan:
    """Decide the role of every initializer.

    - ``requires_grad`` (names or globs): trained. When None, every floating-point initializer that is not
      frozen, not a BatchNorm running statistic (of a training- or inference-mode node) and not a torch buffer
      or constant (marked so by torch's dynamo exporter, :func:`exported_buffers`, or by name,
      :data:`KNOWN_BUFFERS`), nor a constant folded into an initializer (:data:`FOLDED_CONSTANTS`), nor a Keras
      preprocessing layer's constant (:data:`KERAS_PREPROCESSING`), nor a tensor whose shape alone is read
      (:func:`shape_only`) is trained.
      A model from torch's dynamo exporter lists the module's parameters itself: exactly those train
      (:func:`_exported_parameters`), scalars included, and none of the constants the export made initializers.
    - ``frozen_params``: kept in the checkpoint, fed to the graphs, never updated.
    - ``trainable_ops=N`` (N >= 0): only parameters read by the last N ops (topological order; a node that reads
      only weights and constants, such as an exporter's ``Transpose(W)``, belongs to the op that reads its output:
      :func:`weights_of_last_ops`) train; the other candidates become frozen.
    - Running statistics of training-mode BatchNormalization become buffers: the training graph updates them.
    Initializers in none of these roles stay constants inside the graphs.
    """
    names = list(weights)
    float_names = [n for n in names if onnx.helper.np_dtype_to_tensor_dtype(weights[n].dtype) in FLOAT_TYPES]
    trainable = expand_names(requires_grad, names, "requires_grad", graph_inputs=frozenset(i.name for i in graph.input),
                        graph=graph)
    # Nothing to freeze is harmless: exporters turn torch buffers (named_buffers(), which users list here) into
    # constants, and the peer ignores such names.
    frozen = expand_names(frozen_params, names, "frozen_params", strict=False, graph=graph)
    both = sorted(set(trainable) & set(frozen))
    if both:
        raise ValueError(f"{both[0]!r} is listed both in requires_grad and in frozen_params"
                         + (f" (and {len(both) - 1} more)" if len(both) > 1 else ""))
    named = set(requires_grad or [])
    for n in trainable:
        if n not in float_names and n in named:
            raise TypeError(f"requires_grad: {n!r} has dtype {weights[n].dtype}; only floating-point "
                            "parameters can be trained")
    # a glob selects the floating-point tensors it matches (a quantized layer's 'l3.*' has integer zero points)
    trainable = [n for n in trainable if n in float_names]
    # a shape or index named in frozen_params stays a constant (warned; a glob's are dropped silently): only
    # floating-point parameters are state
    integers = [n for n in frozen if n not in float_names and n in set(frozen_params or [])]
    if integers:
        warnings.warn(f"frozen_params: {len(integers)} integer initializers (e.g. {integers[0]!r}, "
                      f"{weights[integers[0]].dtype}) are not parameters and stay constants of the graphs",
                      stacklevel=2)
    frozen = [n for n in frozen if n in float_names]
    buffers = [b for b in batchnorm_buffers(graph, set(names)) if b not in trainable]
    if requires_grad is None:
        statistics = running_statistics(graph)
        settings = _settings(graph)
        exported = _exported_parameters(graph)
        if exported is not None:  # the dynamo exporter listed the module's parameters: exactly those train
            trainable = [n for n in float_names if n in exported and n not in frozen and n not in buffers
                         and n not in statistics and n not in settings]
            _warn_folded(graph, weights)
        else:
            torch_buffers = exported_buffers(graph)
            shapes = shape_only(graph, float_names)
            trainable = [n for n in float_names if n not in frozen and n not in buffers and n not in statistics
                         and weights[n].ndim > 0 and n not in settings and not _is_known_buffer(n)
                         and n not in torch_buffers and n not in shapes]
            _warn_scalars(graph, weights, [n for n in float_names if weights[n].ndim == 0 and n not in frozen
                                           and n not in settings and not _is_known_buffer(n)])
        _warn_merged_constants(graph, weights, trainable)
    if trainable_ops is not None and trainable_ops >= 0:
        consumed = weights_of_last_ops(graph, set(names), trainable_ops)
        frozen += [n for n in trainable if n not in consumed and n not in frozen]
        trainable = [n for n in trainable if n in consumed]
    frozen = [n for n in frozen if n not in buffers]
    frozen += _too_large_for_constants(graph, weights, [*trainable, *frozen, *buffers])
    return ParameterPlan(trainable=trainable, frozen=frozen, buffers=buffers)


def weights_of_last_ops(graph: onnx.GraphProto, weights: set[str], count: int) -> set[str]:
    """The weights that the last ``count`` ops read, directly or through nodes that read only weights and constants
    (the exporters' ``Transpose(W)`` and ``Cast(W)``, torch's restored ``Transpose`` of a dynamo-folded weight): those
    nodes are part of the weight, not ops, and are not counted, wherever the exporter put them in the graph."""
    sources: dict[str, set[str]] = {w: {w} for w in weights}   # a weight-only value -> the weights it is made of
    ops = []
    for node in graph.node:
        read = [x for x in node_inputs(node) if x]
        if all(x in sources for x in read):
            made = set().union(*(sources[x] for x in read)) if read else set()
            sources.update((o, made) for o in node.output if o)
        else:
            ops.append(node)
    if count > len(ops):
        raise ValueError(f"trainable_ops={count} but the model has only {len(ops)} ops (not counting the "
                         f"{len(graph.node) - len(ops)} nodes that only prepare weights and constants)")
    return {w for node in ops[len(ops) - count:] if count for x in node_inputs(node) for w in sources.get(x, ())}


# What the graphs may hold as constants: protobuf serializes no message of 2 GB or more, and the forward model
# goes through ONNX's shape inference as one message (the graph itself and its small constants need room too).
CONSTANTS_LIMIT = 1 << 30
# Past the limit, constants are moved until this much is left: each constant is copied several times while the
# graphs are built, checked and written (a 3.1 GB GPT-2 with 1 GB of constants left peaked at 13 GB, 116 s).
CONSTANTS_KEPT = 64 << 20


def _too_large_for_constants(graph: onnx.GraphProto, weights: dict[str, np.ndarray], state: list[str]) -> list[str]:
    """The weights that become frozen parameters (checkpoint state, fed to the graphs) rather than constants
    inside them, because the constants would not fit in one ONNX message: the largest first, until what is
    left is small. A model over 2 GB with a few layers trained (``requires_grad``) used to fail in shape
    inference."""
    state = set(state)
    total = sum(a.nbytes for n, a in weights.items() if n not in state)
    moved: list[str] = []
    if total <= CONSTANTS_LIMIT:   # every model under 1 GB of constants: no walk of the graph
        return moved
    taken = state | _settings(graph) | running_statistics(graph)
    constants = sorted((n for n, a in weights.items() if n not in taken and a.dtype.kind == "f" and a.ndim > 0),
                       key=lambda n: weights[n].nbytes, reverse=True)
    for name in constants:
        if total <= CONSTANTS_KEPT:
            break
        moved.append(name)
        total -= weights[name].nbytes
    if moved:
        logger.info("%d weights that do not train (%.2f GB, e.g. %r) are frozen parameters rather than constants "
                    "of the graphs, which could not hold them", len(moved),
                    sum(weights[n].nbytes for n in moved) / 2**30, moved[0])
    return moved


# torch buffers (not parameters) that exporters write as initializers like any weight, by their conventional
# names: rotary position embeddings' inverse frequencies (Hugging Face's Llama, Qwen, Mistral, ... `inv_freq`);
# the statistics of a BatchNorm written as arithmetic (torchvision's FrozenBatchNorm2d in DETR-style backbones,
# exported by TorchScript), which a gradient step could drive to a negative variance; Swin V2's log-spaced
# relative position table. Trained, they would change what the model computes; list them in requires_grad to
# train them anyway.
KNOWN_BUFFERS = ("*inv_freq", "*running_mean", "*running_var", "*relative_coords_table")

# The TorchScript exporter names a Constant node's output "<scope>/Constant_<n>_output_0": an initializer of that
# name is a constant a later tool folded into one (onnxruntime's optimizer: an attention mask's 0 and -inf), never
# a parameter. Trained, a mask's 0 would become a learned bias on every attention score.
FOLDED_CONSTANTS = ("*Constant_output_0", "*Constant_*_output_0")

# tf2onnx names a tensor under its Keras layer's name scope: the constants of the preprocessing layers Rescaling and
# Normalization (its adapted mean and variance, which grappler folds with a Rescaling offset into one Add and a
# reciprocal: 'functional_1/rescaling_1/add:0', 'ConstantFolding/.../normalization_1/truediv_recip:0') are not
# weights in Keras either. Only the default layer names: 'batch_normalization_1' and 'layer_normalization' differ.
KERAS_PREPROCESSING = re.compile(r"(.*/)?(rescaling|normalization)(_\d+)*/.*")


def exported_buffers(graph: onnx.GraphProto) -> set[str]:
    """The values torch's dynamo exporter marked as buffers or constant tensors of the torch module (not
    parameters): trained by default, they would change what the model computes rather than learn."""
    return {name for name, kind in recorded_kinds(graph).items() if kind in ("BUFFER", "CONSTANT_TENSOR")}


def _exported_parameters(graph: onnx.GraphProto) -> set[str] | None:
    """The initializers that are torch parameters by the dynamo exporter's own record (its graph signature,
    torch_names.py), 0-d ones included, and the constants its optimizer computed from parameters alone (a layer
    scale reshaped to (C, 1, 1), trained under the constant's name); None when the model has no such record.
    The rest are the exported program's constants (a causal mask, SDPA's scale, a RoPE table, zeros an op
    starts from), which would change what the model computes if trained."""
    signature = graph_signature(graph).values()
    parameters = {target for kind, target in signature if kind == "PARAMETER"}
    if not parameters:
        return None
    folded = {constant for constant, sources in folded_sources(graph).items() if parameters.intersection(sources)}
    return parameters | folded


def _warn_folded(graph: onnx.GraphProto, weights: dict[str, np.ndarray]) -> None:
    """Warn, when every parameter trains, about torch parameters that the dynamo exporter's optimizer folded into
    another tensor: that tensor trains in their place, with values that are not theirs (a convolution's weight
    with its BatchNorm folded in; a bias table gathered by a constant index, each entry now its own)."""
    missing = [t for t in torch_tensors(graph, "PARAMETER") if t not in weights]
    folded = [(t, where) for t in missing if (where := folded_parameter(graph, t, weights)) is not None]
    if folded:
        listed = "; ".join(f"{t!r} {where}" for t, where in folded[:3])
        warnings.warn(f"{len(folded)} torch parameters were folded into other tensors by torch.onnx.export's graph "
                      f"optimizer (optimize=True, its default), which train in their place with values that are "
                      f"not torch's (loading them back into the torch module by name would not give its model): "
                      f"{listed}{'; ...' if len(folded) > 3 else ''}; export with optimize=False to train torch's "
                      "parameters as they are", stacklevel=3)


def _warn_scalars(graph: onnx.GraphProto, weights: dict[str, np.ndarray], scalars: list[str]) -> None:
    """0-d initializers stay constants under ``requires_grad=None`` outside the dynamo exporter's record (which
    lists 0-d parameters): exporters store their scalar constants so (a GELU's 0.5, an attention scale), and
    nothing tells a scalar parameter (CLIP's ``logit_scale``) from them. Those with a name of their own (not an
    exporter's ``onnx::Mul_12`` or ``/attn/Constant_output_0``) are named, so that a parameter is not missed."""
    named = [n for n in scalars if not n.startswith(("onnx::", "/")) and "Constant" not in n]
    if named:
        warnings.warn(f"requires_grad=None leaves {len(named)} 0-d initializers as constants (e.g. {named[:3]}): "
                      "scalars are mostly an exporter's constants; name a scalar parameter (a temperature, CLIP's "
                      "logit_scale) in requires_grad to train it", stacklevel=3)


def _warn_merged_constants(graph: onnx.GraphProto, weights: dict[str, np.ndarray], trainable: list[str]) -> None:
    """A trainable tensor of equal elements read as the scale or bias of several normalizations or as the bias of
    several layers: a tool that stores equal tensors once (onnxruntime's optimizer, ``optimized_model_filepath``,
    on a freshly initialized model: all LayerNorm weights are ones, all biases zeros) merged parameters that torch
    keeps apart, and they would train as one."""
    roles = {"LayerNormalization": (1, 2), "BatchNormalization": (1, 2), "InstanceNormalization": (1, 2),
             "GroupNormalization": (1, 2), "Gemm": (2,), "Conv": (2,), "ConvTranspose": (2,), "Add": (0, 1)}
    readers: dict[str, int] = {}
    for node in graph.node:
        for i in roles.get(node.op_type, ()):
            if i < len(node.input) and node.input[i] in weights:
                readers[node.input[i]] = readers.get(node.input[i], 0) + 1
    merged = [n for n in trainable if readers.get(n, 0) > 1 and weights[n].size > 1
              and np.all(weights[n] == weights[n].flat[0])]
    if merged:
        warnings.warn(f"{len(merged)} trainable tensors of equal elements are each read as the scale or bias of "
                      f"several layers (e.g. {merged[0]!r}, all {weights[merged[0]].flat[0]}, by "
                      f"{readers[merged[0]]} nodes): a tool that stores equal tensors once (onnxruntime's graph "
                      "optimizer on a freshly initialized model) merged parameters, which would train as one; "
                      "save the model before optimizing it", stacklevel=3)


def _is_known_buffer(name: str) -> bool:
    return (any(fnmatch.fnmatchcase(name, pattern) for pattern in (*KNOWN_BUFFERS, *FOLDED_CONSTANTS))
            or KERAS_PREPROCESSING.fullmatch(name) is not None)


# The inputs that hold an op's settings, not weights: ratios, bounds, pads and scales of shape ops, and the scales
# and zero points of quantization (the quantized weights themselves are integers).
_SETTING_INPUTS: dict[str, tuple[int, ...]] = {
    "Dropout": (1,), "Clip": (1, 2), "Pad": (2,), "Resize": (1, 2),
    "QuantizeLinear": (1, 2), "DequantizeLinear": (1, 2), "ConvInteger": (2, 3), "MatMulInteger": (2, 3),
    "QLinearConv": (1, 2, 4, 5, 6, 7), "QLinearMatMul": (1, 2, 4, 5, 6, 7),
}
# ops whose integer outputs are computed from float inputs: no gradient flows through those values
QUANTIZING_OPS = frozenset({"QuantizeLinear", "DynamicQuantizeLinear"})
# the ops of a model quantized by onnxruntime.quantization (QDQ, dynamic or QOperator format)
QUANTIZED_OPS = QUANTIZING_OPS | {"DequantizeLinear", "ConvInteger", "MatMulInteger", "QLinearConv", "QLinearMatMul"}
QUANTIZED_ADVICE = ("train the float model and quantize it after training (its integer weights cannot train), or "
                    "freeze what comes before the quantized ops")


def _settings(graph: onnx.GraphProto) -> set[str]:
    """The values some node reads as an op's settings (``_SETTING_INPUTS``): a float initializer read so is not
    a parameter, even if another node reads it too (exporters share equal constants: a hard swish's 6 is a Clip
    bound and a divisor)."""
    found: set[str] = set()
    for node in graph.node:
        positions = _SETTING_INPUTS.get(node.op_type)
        if positions:
            found.update(node.input[i] for i in positions if i < len(node.input) and node.input[i])
    return found


def shape_only(graph: onnx.GraphProto, weights: Sequence[str]) -> set[str]:
    """The ``weights`` that only ``Shape`` and ``Size`` nodes read (and no graph output is): their values never
    reach an output, so their gradient is zero at every step. tf2onnx writes such tensors for a Keras
    attention over a dynamic sequence (its einsum reads the shape of a second, reshaped copy of each projection
    weight)."""
    readers: dict[str, set[str]] = {}
    for node in graph.node:
        for name in node_inputs(node):
            readers.setdefault(name, set()).add(node.op_type)
    outputs = {o.name for o in graph.output}
    return {n for n in weights if readers.get(n) and readers[n] <= {"Shape", "Size"} and n not in outputs}


def quantized_away(graph: onnx.GraphProto, trainable: Sequence[str]) -> list[str]:
    """The ``trainable`` parameters that some quantizing op (``QUANTIZING_OPS``) reads, directly or not: their
    gradient through the quantized values is zero, whatever the loss."""
    nodes = list(graph.node)
    quantized = [n.input[0] for n in nodes if n.op_type in QUANTIZING_OPS and n.input]
    if not quantized:
        return []
    read = set(quantized) | {x for k in ancestors(nodes, quantized) for x in node_inputs(nodes[k])}
    return [p for p in trainable if p in read]



def quantized_weights(graph: onnx.GraphProto, weights: dict[str, np.ndarray]) -> list[str]:
    """The integer initializers a DequantizeLinear reads: weights stored quantized, which cannot train (dynamic
    quantization's embedding tables and MatMul weights, a QDQ model's weights)."""
    return list(dict.fromkeys(n.input[0] for n in graph.node if n.op_type == "DequantizeLinear" and n.input
                              and n.input[0] in weights and weights[n.input[0]].dtype.kind in "iu"))

def _by_dtype(weights: dict[str, np.ndarray], names: Sequence[str]) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for n in names:
        groups.setdefault(str(weights[n].dtype), []).append(n)
    return groups


def check_state_dtypes(weights: dict[str, np.ndarray], plan: ParameterPlan, optimizer: bool) -> None:
    """Refuse, before any graph is built, parameters the runtime cannot hold: trainable ones of several dtypes (they
    share one flat vector), trainable ones other than float32 under an optimizer (its update runs in float32), and
    state (trainable, frozen, buffers) in a dtype onnxruntime's Python API cannot bind (bfloat16, float8)."""
    groups = _by_dtype(weights, plan.trainable)
    if len(groups) > 1:
        listed = "; ".join(f"{d}: {len(ns)} (e.g. {ns[0]!r})" for d, ns in groups.items())
        raise TypeError(f"the trainable parameters have several dtypes ({listed}); they are trained as one flat "
                        f"vector of one dtype: select parameters of one dtype in requires_grad (the others stay "
                        f"constants, or list them in frozen_params), or convert the model to one float type")
    state = [*plan.trainable, *plan.frozen, *plan.buffers]
    unbindable = [n for n in state if weights[n].dtype.kind == "V"]   # ml_dtypes' bfloat16 and float8 types
    if unbindable:
        n = unbindable[0]
        raise TypeError(f"parameter {n!r} is {weights[n].dtype} ({len(unbindable)} such trainable, frozen or buffer "
                        f"tensors): onnxruntime's Python API cannot feed {weights[n].dtype} arrays to a session, so "
                        f"it cannot be training state; leave it out of requires_grad and frozen_params (it then "
                        f"stays a constant of the graphs), or convert the model's weights to float32")
    if optimizer and groups and next(iter(groups)) != "float32":
        dtype, ns = next(iter(groups.items()))
        raise TypeError(f"the optimizer graph supports float32 parameters; the {len(ns)} trainable parameters are "
                        f"{dtype} (e.g. {ns[0]!r}): convert the model to float32 first (skl2onnx: FloatTensorType "
                        f"inputs; otherwise export it from the float32 model, or cast its float initializers, inputs "
                        f"and Cast nodes), or pass "
                        f"optimizer=None and update the parameters yourself")
