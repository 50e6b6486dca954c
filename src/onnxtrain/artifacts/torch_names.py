"""torch's parameters back under their own names, in models from torch's dynamo exporter with its optimizer on.

``torch.onnx.export`` (``dynamo=True``, the default from torch 2.9) optimizes the graph by default
(``optimize=True``), and its rewrites change what the initializers are:

- the weight of a Linear that reads a 3-D input (every transformer's projections) is stored transposed, under a
  name of the exporter's (``val_51`` for ``bert.encoder.layer.0.attention.self.query.weight``);
- initializers with equal values are stored once: a freshly initialized model's zero biases and unit LayerNorm
  weights become one tensor, which would train as one parameter where torch has several;
- a zero bias is dropped from its Gemm, Conv or LayerNormalization;
- an eval-mode BatchNorm is folded into the convolution before it, and a parameter read through constant
  indices or reshapes becomes a constant computed from it.

From what the exporter records on each node (ir/torch_records.py: the torch call, its ``%p_<name>`` arguments,
the module scopes), :func:`restore_torch_parameters` gives each parameter its torch name, values and layout back:
a transposed weight becomes the torch weight read through a ``Transpose`` (the form the TorchScript exporter
writes, which the gradient passes know), a shared tensor one initializer per parameter it stands for, a dropped
bias a zero initializer. Nothing is renamed when the record is missing or ambiguous, or when the name is taken by
a tensor with other values (a weight torch ties stays one parameter).

What cannot come back is named for the error a ``requires_grad`` list gets (:func:`folded_parameter`), and a tied
weight's other torch name is resolved to the tensor the export kept (:func:`tied_parameter`).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections import Counter
from collections.abc import Collection

import numpy as np
import onnx
from onnx import helper

from onnxtrain.ir.passes import node_inputs
from onnxtrain.ir.torch_records import FX_NODE, FxCall, fx_call
from onnxtrain.ir.types import onnx_dtype

__all__ = ["restore_torch_parameters", "folded_parameter", "tied_parameters", "graph_signature", "torch_tensors",
           "folded_sources", "retie_folded_transposes"]

logger = logging.getLogger(__name__)

ORIGINAL_NAME = "pkg.torch.onnx.original_node_name"
FOLDED_FROM = "pkg.onnxscript.optimizer.folded_from"
EXPORT_KIND = "pkg.torch.export.graph_signature.InputSpec.kind"
SIGNATURE = "pkg.torch.export.ExportedProgram.graph_signature"  # the graph's record of every lifted tensor

_KINDS = {"p_": "PARAMETER", "b_": "BUFFER"}
_CONVOLUTIONS = ("aten.conv1d", "aten.conv2d", "aten.conv3d", "aten.convolution")
# (input, weight, bias, running_mean, running_var, ...): BatchNormalization's inputs in the same order
_BATCH_NORMS = ("aten._native_batch_norm_legit_no_training", "aten._native_batch_norm_legit_functional",
                "aten._native_batch_norm_legit", "aten.native_batch_norm", "aten.batch_norm")


@dataclasses.dataclass(frozen=True)
class _Role:
    arg: int                         # which argument of the torch call the ONNX input is
    transposed: bool = False         # stored as that argument's transpose


def _role(node: onnx.NodeProto, index: int, call: FxCall) -> _Role | None:
    """Which argument of the torch call ``node.input[index]`` is, for the calls whose ONNX form is known."""
    op, target = node.op_type, call.target
    if target == "aten.linear":
        if op == "MatMul" and index == 1:
            return _Role(1, transposed=True)
        if op == "Gemm" and index in (1, 2):
            return _Role(index, transposed=index == 1 and not _trans_b(node))
        if op == "Add":
            return _Role(2)
    if target == "aten.embedding" and op == "Gather" and index == 0:
        return _Role(0)
    if target == "aten.layer_norm" and op == "LayerNormalization" and index in (1, 2):
        return _Role(index + 1)
    if target in _CONVOLUTIONS and op == "Conv" and index in (1, 2):
        return _Role(index)
    if target in _BATCH_NORMS and op == "BatchNormalization" and index in (1, 2, 3, 4):
        return _Role(index)  # a fresh BatchNorm's unit weight and zero bias are stored once with its statistics
    return None


def _trans_b(gemm: onnx.NodeProto) -> int:
    return next((a.i for a in gemm.attribute if a.name == "transB"), 0)


def _placeholder_of(node: onnx.NodeProto, index: int, call: FxCall, weights: dict[str, np.ndarray],
                    named: bool) -> _Role | None:
    """The role of an initializer input: by the op's known form; else, for a tensor that has a torch name
    (``named``: a shared one, not one the optimizer computed), the one parameter of the call that no other
    initializer input of the node stands for (an RMSNorm's ``Mul(weight, x)``)."""
    role = _role(node, index, call)
    if role is not None:
        return role if role.arg < len(call.args) and _is_placeholder(call.args[role.arg]) else None
    params = [k for k, a in enumerate(call.args) if _is_placeholder(a)]
    others = sum(1 for i, x in enumerate(node.input) if i != index and x in weights)
    return _Role(params[0]) if named and len(params) == 1 and others == 0 else None


def _is_placeholder(arg: str | None) -> bool:
    return arg is not None and arg.startswith(tuple(_KINDS))


def _mangled(name: str) -> str:
    return re.sub(r"\W", "_", name).lower()


def torch_name(placeholder: str, scopes: tuple[str, ...], known: dict[str, str]) -> str | None:
    """The dotted torch name of ``p_<mangled>`` (``b_`` for buffers): from the exporter's own record when the
    tensor kept its name, else the innermost module scope whose mangled path prefixes it, plus the rest as the
    attribute name."""
    if placeholder in known:
        return known[placeholder]
    rest = placeholder[2:]   # after p_ or b_
    for scope in reversed(scopes):
        if not scope:
            return rest or None
        prefix = _mangled(scope) + "_"
        if rest.lower().startswith(prefix) and len(rest) > len(prefix):
            return f"{scope}.{rest[len(prefix):]}"
    return None


def _known_placeholders(graph: onnx.GraphProto) -> dict[str, str]:
    """Placeholder (``p_<mangled>``) -> torch name: the exported program's signature, then the names the kept
    tensors record."""
    known = {placeholder: target for placeholder, (_, target) in graph_signature(graph).items()}
    known.update({p.value: v.name for v in [*graph.input, *graph.value_info] for p in v.metadata_props
                  if p.key == ORIGINAL_NAME})
    return known


_SIGNATURE_LINE = re.compile(r"^(\w+): (\w+) target='([^']*)'", re.MULTILINE)


def graph_signature(graph: onnx.GraphProto) -> dict[str, tuple[str, str]]:
    """The dynamo exporter's record of the torch module's tensors (``p_fc_weight: PARAMETER target='fc.weight'``):
    placeholder -> (kind: PARAMETER, BUFFER, CONSTANT_TENSOR..., torch name); empty for other exporters."""
    text = next((p.value for p in graph.metadata_props if p.key == SIGNATURE), "")
    inputs = text.split("# outputs")[0]   # the outputs section names mutated parameters again (max_norm's renorm)
    return {placeholder: (kind, target) for placeholder, kind, target in _SIGNATURE_LINE.findall(inputs)}


def recorded_kinds(graph: onnx.GraphProto) -> dict[str, str]:
    """Value -> what the dynamo exporter records it was in the torch module (its value info's ``InputSpec.kind``:
    PARAMETER, BUFFER, CONSTANT_TENSOR, USER_INPUT); empty for other exporters."""
    return {v.name: p.value for v in [*graph.input, *graph.value_info] for p in v.metadata_props
            if p.key == EXPORT_KIND}


def torch_tensors(graph: onnx.GraphProto, kind: str) -> set[str]:
    """The torch names of the module's tensors of ``kind`` (PARAMETER, BUFFER...) in the exporter's signature."""
    return {target for k, target in graph_signature(graph).values() if k == kind}


def folded_sources(graph: onnx.GraphProto) -> dict[str, list[str]]:
    """Initializer -> the tensors the exporter's optimizer computed it from (its ``folded_from`` record)."""
    out = {}
    for info in graph.value_info:
        sources = next((p.value for p in info.metadata_props if p.key == FOLDED_FROM), None)
        if sources is not None:
            out[info.name] = re.findall(r"'([^']*)'", sources)
    return out


def restore_torch_parameters(graph: onnx.GraphProto, weights: dict[str, np.ndarray]) -> list[str]:
    """Give back torch's parameters that the dynamo exporter's optimizer renamed, transposed or merged (module
    docstring), in place: ``graph``'s nodes read them, ``weights`` holds their values. Returns the names added."""
    if not any(p.key == FX_NODE for n in graph.node[:8] for p in n.metadata_props):
        return []
    known = _known_placeholders(graph)
    named = set(known.values())
    taken = {x for n in graph.node for x in (*node_inputs(n), *n.output)} | {i.name for i in graph.input}
    added: dict[str, tuple[str, bool]] = {}    # new name -> (the tensor it comes from, transposed)
    transposes: dict[str, str] = {}            # new name -> its Transpose's output
    new_nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        call = None
        for index, x in enumerate(node.input):
            if x not in weights or weights[x].dtype.kind != "f":
                continue
            call = call or fx_call(node)
            role = _placeholder_of(node, index, call, weights, x in named) if call else None
            if role is None or (role.transposed and weights[x].ndim != 2):
                continue
            placeholder = call.args[role.arg]
            name = torch_name(placeholder, call.scopes, known)
            if name is None or (name == x and not role.transposed):
                continue
            if not _claim(name, x, role.transposed, weights, added, taken):
                continue
            if role.transposed:
                if name not in transposes:
                    transposes[name] = _fresh(f"{name}/transposed", taken)
                    new_nodes.append(helper.make_node("Transpose", [name], [transposes[name]], perm=[1, 0],
                                                      name=transposes[name]))
                node.input[index] = transposes[name]
            else:
                node.input[index] = name
            if name not in weights:
                values = weights[x].T if role.transposed else weights[x]
                weights[name] = np.array(values, order="C")
                graph.value_info.append(_declaration(name, weights[name], placeholder))
    added.update(_restore_dropped_biases(graph, weights, known, taken))
    _warn_merged(graph, weights)
    if not added:
        return []
    read = {x for n in [*new_nodes, *graph.node] for x in node_inputs(n)} | {o.name for o in graph.output}
    _prepend_and_drop(graph, weights, new_nodes, {w for w in weights if w not in read})
    return [n for n in added if n in weights]


def _prepend_and_drop(graph: onnx.GraphProto, weights: dict[str, np.ndarray], nodes: list[onnx.NodeProto],
                      gone: Collection[str]) -> None:
    """Put ``nodes`` first in ``graph`` and forget the tensors ``gone`` (their values and declarations)."""
    ordered = [*nodes, *graph.node]
    del graph.node[:]
    graph.node.extend(ordered)
    for name in gone:
        del weights[name]
    infos = [v for v in graph.value_info if v.name not in gone]
    del graph.value_info[:]
    graph.value_info.extend(infos)


def _warn_merged(graph: onnx.GraphProto, weights: dict[str, np.ndarray]) -> None:
    """Warn about torch parameters that no initializer holds and that were not folded into a constant or a
    convolution: the optimizer stored them with another tensor of equal values, read by nodes that record no
    torch call to tell them apart (a cross-attention's Split of its in_proj_bias), so they train as one."""
    missing = [t for t in torch_tensors(graph, "PARAMETER") if t not in weights]
    tied = tied_parameters(graph, set(weights)) if missing else {}   # one tensor in torch too: not merged
    merged = sorted(t for t in missing if t not in tied and folded_parameter(graph, t, weights) is None)
    if merged:
        logger.warning("%d torch parameters (e.g. %s) share a tensor with another parameter of equal values: "
                       "torch.onnx.export's graph optimizer (optimize=True, its default) stored equal tensors once, "
                       "and the nodes reading them record no torch call to tell them apart, so they train as one "
                       "parameter; export with optimize=False to train each", len(merged), merged[:3])


# (torch call, ONNX op) whose bias the optimizer drops when it is zero: the bias's ONNX input and torch argument
_BIASES = {("aten.linear", "Gemm"): (2, 2), ("aten.addmm", "Gemm"): (2, 0),
           ("aten.layer_norm", "LayerNormalization"): (2, 3),
           **{(conv, "Conv"): (2, 2) for conv in _CONVOLUTIONS}}


def _bias_size(node: onnx.NodeProto, weights: dict[str, np.ndarray]) -> int | None:
    """The length of the bias ``node`` would add, from its weight (LayerNormalization: its scale)."""
    w = weights.get(node.input[1]) if len(node.input) > 1 else None
    if w is None:
        return None
    if node.op_type == "Gemm":
        return w.shape[0] if _trans_b(node) else w.shape[1] if w.ndim == 2 else None
    if node.op_type == "Conv":
        return w.shape[0] if w.ndim >= 3 else None
    return w.shape[0] if w.ndim == 1 else None


def _restore_dropped_biases(graph: onnx.GraphProto, weights: dict[str, np.ndarray], known: dict[str, str],
                            taken: set[str]) -> dict[str, tuple[str, bool]]:
    """A bias the optimizer dropped because it was zero (a Linear's Gemm, a convolution, a LayerNorm), back as a
    zero initializer: the node computes a whole torch call (no other node has its record) that has a bias
    argument, and reads no bias."""
    records = [next((p.value for p in n.metadata_props if p.key == FX_NODE), None) for n in graph.node]
    count = Counter(r for r in records if r is not None)
    added: dict[str, tuple[str, bool]] = {}
    for node, record in zip(graph.node, records):
        if record is None or count[record] != 1:
            continue
        call = fx_call(node)
        where = _BIASES.get((call.target, node.op_type)) if call is not None else None
        if where is None or len(node.input) > where[0] or where[1] >= len(call.args):
            continue
        size, placeholder = _bias_size(node, weights), call.args[where[1]]
        if size is None or not _is_placeholder(placeholder):
            continue
        name = torch_name(placeholder, call.scopes, known)
        if name is None or name in weights or name in taken:
            continue
        weights[name] = np.zeros(size, dtype=weights[node.input[1]].dtype)
        graph.value_info.append(_declaration(name, weights[name], placeholder))
        while len(node.input) < where[0]:
            node.input.append("")
        node.input.append(name)
        added[name] = (node.input[1], False)
        taken.add(name)
    return added


def _claim(name: str, source: str, transposed: bool, weights: dict[str, np.ndarray],
           added: dict[str, tuple[str, bool]], taken: set[str]) -> bool:
    """Whether ``name`` may hold ``source`` (transposed or not): a new name, one given to the same tensor already,
    or an existing initializer with the same values (a parameter torch ties, as GPT-2's embedding and head)."""
    if name in added:
        return added[name] == (source, transposed)
    if name in weights:
        values = weights[source].T if transposed else weights[source]
        if weights[name].shape != values.shape or not np.array_equal(weights[name], values):
            return False
    elif name in taken:
        return False
    added[name] = (source, transposed)
    taken.add(name)
    return True


def _fresh(name: str, taken: set[str]) -> str:
    out, k = name, 1
    while out in taken:
        out, k = f"{name}_{k}", k + 1
    taken.add(out)
    return out


def _declaration(name: str, values: np.ndarray, placeholder: str) -> onnx.ValueInfoProto:
    """A value info recording what the tensor was in torch (a parameter or a buffer), as the exporter's own."""
    info = helper.make_tensor_value_info(name, onnx_dtype(values.dtype), list(values.shape))
    for key, value in ((EXPORT_KIND, _KINDS[placeholder[:2]]), (ORIGINAL_NAME, placeholder)):
        info.metadata_props.add(key=key, value=value)
    return info


def folded_parameter(graph: onnx.GraphProto, name: str, initializers: Collection[str]) -> str | None:
    """Where the exporter's optimizer put the parameter ``name`` that no initializer holds under that name, as a
    phrase for an error ("into the Conv node 'node_Conv_3' (whose weights are now ['conv1.weight'])"), or None.

    The optimizer records the tensors it computed a constant from (``pkg.onnxscript.optimizer.folded_from``: a
    position table sliced to a fixed length, a bias table gathered by constant indices); a BatchNorm folded into
    a convolution leaves its own torch call on the Conv node."""
    for constant, sources in folded_sources(graph).items():
        if name in sources:
            return f"into the constant {constant!r}, computed from it"
    wanted = {prefix + _mangled(name) for prefix in _KINDS}
    for node in graph.node:
        call = fx_call(node)
        if call is not None and any(a is not None and a.lower() in wanted for a in call.args):
            weights = [x for x in node.input[1:] if x in initializers]
            return f"into the {node.op_type} node {node.name!r} (whose weights are now {weights})"
    return None


# The attribute of the torch module a call's argument is (``linear(x, self.weight, self.bias)``).
_ATTRIBUTES = {("aten.linear", 1): "weight", ("aten.linear", 2): "bias", ("aten.embedding", 0): "weight",
               ("aten.layer_norm", 2): "weight", ("aten.layer_norm", 3): "bias",
               **{(conv, k): a for conv in _CONVOLUTIONS for k, a in ((1, "weight"), (2, "bias"))}}


def tied_parameters(graph: onnx.GraphProto, initializers: Collection[str]) -> dict[str, str]:
    """Torch parameter name -> the initializer a node of its module reads in that attribute's place, for the
    names that are no initializer: a parameter torch ties to another whose name the export kept (GPT-2's
    ``transformer.wte.weight`` is its ``lm_head.weight``). One walk over the nodes' records."""
    producers = {n.output[0]: n for n in graph.node if n.op_type == "Transpose" and n.output}
    found: dict[str, str] = {}
    for node in graph.node:
        call = fx_call(node)
        if call is None or not call.scopes:
            continue
        for index, x in enumerate(node.input):
            role = _role(node, index, call)
            attribute = _ATTRIBUTES.get((call.target, role.arg)) if role is not None else None
            if attribute is None:
                continue
            if x not in initializers and x in producers:   # MatMul(x, Transpose(W))
                x = producers[x].input[0]
            name = f"{call.scopes[-1]}.{attribute}"
            if x in initializers and name not in initializers:
                found.setdefault(name, x)
    return found


def retie_folded_transposes(graph: onnx.GraphProto, weights: dict[str, np.ndarray]) -> dict[str, str]:
    """A weight the TorchScript exporter's constant folding stored transposed under a made-up name
    (``onnx::MatMul_N``) although the model keeps the weight itself under its torch name: a parameter torch ties
    (a language model's head and its embedding, as OPT, Gemma and BART do). Trained apart, the embedding's gradient
    would miss the head's part and the two would drift apart. The folded copy is replaced by a ``Transpose`` of the
    named weight, in place. Only for models without the dynamo exporter's records (restore_torch_parameters handles
    those), and only for tensors whose values vary (equal zeros are not a tie). Returns folded name -> weight."""
    if any(p.key == FX_NODE for n in graph.node[:8] for p in n.metadata_props):
        return {}
    folded = {n: w for n, w in weights.items() if n.startswith("onnx::") and w.ndim == 2 and w.dtype.kind == "f"
              and w.size > 1 and w.min() != w.max()}
    shapes = {w.shape[::-1] for w in folded.values()}
    named = [(n, w) for n, w in weights.items() if not n.startswith("onnx::") and w.shape in shapes]
    ties = {f: n for f, fw in folded.items() for n, w in named
            if w.shape == fw.shape[::-1] and w.dtype == fw.dtype and np.array_equal(w.T, fw)}
    if not ties:
        return {}
    taken = {x for n in graph.node for x in (*node_inputs(n), *n.output)} | {i.name for i in graph.input}
    outputs = {f: _fresh(f"{n}/transposed", taken) for f, n in ties.items()}
    for node in graph.node:
        for i, x in enumerate(node.input):
            if x in outputs:
                node.input[i] = outputs[x]
    transposes = [helper.make_node("Transpose", [ties[f]], [out], perm=[1, 0], name=out) for f, out in outputs.items()]
    _prepend_and_drop(graph, weights, transposes, ties)
    logger.warning("%s %s the transpose of %s, which the model also reads: a weight torch ties (a language model's "
                   "head and embedding), stored twice by the TorchScript exporter's constant folding; trained as %s "
                   "(export with do_constant_folding=False if they are separate parameters)",
                   ", ".join(map(repr, ties)), "is" if len(ties) == 1 else "are",
                   ", ".join(sorted({repr(n) for n in ties.values()})), "one parameter" if len(ties) == 1 else "those")
    return ties
