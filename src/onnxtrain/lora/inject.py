"""The LoRA injection pass: wrap targeted MatMul / Gemm / 1x1 Conv weights with trainable low-rank adapters.

The pass rewrites the forward graph before the training graphs are built, so the autodiff, the losses, the
optimizers and the runtime see ordinary parameters. For a node ``y = op(x, W, ...)`` it adds

- MatMul (``W`` is in x out):  ``y = MatMul(x, W) + MatMul(Mul(MatMul(x', Transpose(A)), scale), Transpose(B))``
- Gemm (``W`` is input B, any ``transA`` / ``transB``, bias kept on the base node):
  ``y = Gemm(x, W, C) + Gemm(Gemm(x', A, alpha=scale, transA, transB=1), B, transB=1)``
- Conv with a 1x1 kernel and group 1: ``y = Conv(x, W, b) + Conv(Mul(Conv(x', A, strides, pads), scale), B)``

where ``x' = Dropout(x, dropout, training_mode=True)`` when ``dropout > 0`` (the eval graph turns it off) and
``x`` otherwise. ``A`` (rank x in) is Kaiming-uniform as ``torch.nn.Linear``'s default (bound ``1/sqrt(in)``,
PEFT's choice), ``B`` (out x rank) zeros, so the model's outputs are unchanged until training moves ``B``.
The wrapped node writes ``{y}/lora_base``; an ``Add`` writes ``y``. ``W`` is never a trainable parameter.

Cases: each candidate node some target matches gets an adapter; a weight read by several matched nodes of
one module (tied) gets one ``A`` / ``B`` pair for all of them; every other node is left alone. A target that
matches no candidate is a :class:`~onnxtrain.errors.LoRAError` that lists the candidates.
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from onnxtrain.errors import LoRAError
from onnxtrain.ir.pass_infra import Pass, PassResult
from onnxtrain.ir.passes import clone, declare_as_inputs, used_names
from onnxtrain.lora.config import ALL_LINEAR, Adapter, LoRA, LoRAMeta, adapter_param_names

__all__ = ["InjectLoRA", "module_path", "scope_prefixes", "Candidate", "candidates"]


def module_path(weight: str, node_name: str, prefixes: dict[str, str] | None = None) -> str:
    """The torch module a weight belongs to: the node name torch's exporter writes (``/x/y/MatMul`` -> ``x.y``,
    under the module ``prefixes`` gives its first part, see :func:`scope_prefixes`) when it is not the module
    of the weight's torch name (``x.y.weight`` -> ``x.y``), which is then a tied weight of another module; else
    the module of the weight's name; else the weight name itself."""
    scope = _scope(node_name)
    if scope:
        scope = (prefixes or {}).get(scope.split(".")[0], "") + scope
    if weight.endswith(".weight") and not weight.startswith("onnx::"):
        own = weight[: -len(".weight")]
        # a weight another module owns: a head tied to its embedding (GPT-2's lm_head reads transformer.wte.weight)
        return scope if scope and own != scope and not own.endswith("." + scope) else own
    return scope or weight


def _scope(node_name: str) -> str:
    """The module path of a node name torch's TorchScript exporter writes (``/x/y/MatMul`` -> ``x.y``), or ''."""
    parts = [p for p in node_name.split("/") if p]
    return ".".join(parts[:-1]) if node_name.startswith("/") and len(parts) >= 2 else ""


def _torch_named(name: str) -> bool:
    return "." in name and not name.startswith("onnx::")


def scope_prefixes(graph: onnx.GraphProto, weights: dict[str, np.ndarray]) -> dict[str, str]:
    """The modules torch's TorchScript exporter leaves out of its node names, by the scope's first part.

    OPT's ``OPTForCausalLM.model.decoder.layers.0`` gets nodes named ``/decoder/layers.0/...``: the exporter
    skips the scope of a module whose forward it does not record (``model``), while the parameters keep their
    full names (``model.decoder.layers.0.fc1.weight``). A node that reads a parameter of its own module tells
    the missing part; a first part whose nodes disagree (or name their modules fully) gets none.
    """
    seen: dict[str, set[str]] = {}
    for node in graph.node:
        scope = _scope(node.name)
        for x in node.input[:3] if scope else ():
            module = x.rsplit(".", 1)[0] if x in weights and _torch_named(x) else None
            if module == scope or (module or "").startswith(scope + "."):
                seen.setdefault(scope.split(".")[0], set()).add("")
            elif module and module.endswith("." + scope):
                seen.setdefault(scope.split(".")[0], set()).add(module[: -len(scope)])
    return {head: found.pop() for head, found in seen.items() if len(found) == 1 and "" not in found}


@dataclass
class Candidate:
    """A node whose weight can carry an adapter."""

    node: onnx.NodeProto
    weight: str
    module: str
    in_features: int
    out_features: int
    transposed: bool  # W stored (out, in)


def _attr(node: onnx.NodeProto, name: str, default):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def candidates(graph: onnx.GraphProto, weights: dict[str, np.ndarray]) -> Iterator[Candidate]:
    """Every MatMul (weight as second input, or its transpose: ``MatMul(x, Transpose(W))``, as torch's exporters
    write a Linear on a 3-D input), Gemm (weight as input B) and 1x1 group-1 Conv with a float initializer
    weight, in graph order."""
    prefixes = scope_prefixes(graph, weights)
    transposed = {n.output[0]: n.input[0] for n in graph.node
                  if n.op_type == "Transpose" and n.input and n.input[0] in weights and weights[n.input[0]].ndim == 2
                  and list(_attr(n, "perm", [1, 0])) == [1, 0]}
    for node in graph.node:
        if (node.op_type == "MatMul" and len(node.input) == 2 and node.input[1] in transposed
                and weights[transposed[node.input[1]]].dtype.kind == "f"):
            name = transposed[node.input[1]]
            out_f, in_f = weights[name].shape
            yield Candidate(node, name, module_path(name, node.name, prefixes), in_f, out_f, True)
            continue
        if node.domain not in ("", "ai.onnx") or len(node.input) < 2 or node.input[1] not in weights:
            continue
        w = weights[node.input[1]]
        if w.dtype.kind != "f":
            continue
        if node.op_type == "MatMul" and w.ndim == 2:
            module = module_path(node.input[1], node.name, prefixes)
            yield Candidate(node, node.input[1], module, w.shape[0], w.shape[1], False)
        elif node.op_type == "Gemm" and w.ndim == 2:
            trans = bool(_attr(node, "transB", 0))
            out_f, in_f = w.shape if trans else w.shape[::-1]
            yield Candidate(node, node.input[1], module_path(node.input[1], node.name, prefixes), in_f, out_f,
                            trans)
        elif (node.op_type == "Conv" and w.ndim >= 3 and all(k == 1 for k in w.shape[2:])
              and _attr(node, "group", 1) == 1):
            module = module_path(node.input[1], node.name, prefixes)
            yield Candidate(node, node.input[1], module, w.shape[1], w.shape[0], True)


def _matches(pattern: str, c: Candidate) -> bool:
    if any(ch in pattern for ch in "*?["):
        return any(fnmatch.fnmatchcase(s, pattern) for s in (c.weight, c.module, c.node.name))
    return pattern in (c.weight, c.module, c.node.name) or c.module.endswith("." + pattern)


class _Names:
    def __init__(self, taken: set[str]):
        self.taken = taken

    def __call__(self, base: str) -> str:
        name, k = base, 1
        while name in self.taken:
            name, k = f"{base}_{k}", k + 1
        self.taken.add(name)
        return name


def _initial(lora: LoRA, name: str, shape: tuple[int, ...], dtype: np.dtype, rng: np.random.Generator,
             fan_in: int, zeros: bool) -> np.ndarray:
    given = (lora.initial or {}).get(name)
    if given is not None:
        given = np.asarray(given)
        # (rank, in) and (out, rank), or with a 1x1 Conv's trailing ones; never reshaped from another layout
        if given.shape[:2] != shape[:2] or given.size != math.prod(shape):
            raise LoRAError(f"LoRA initial value {name!r} has shape {given.shape}, the model needs {shape} "
                            f"(rank {lora.rank}): an adapter of another rank, or for another model")
        return given.reshape(shape).astype(dtype)
    if zeros:
        return np.zeros(shape, dtype)
    bound = 1.0 / math.sqrt(fan_in)  # kaiming_uniform_(a=sqrt(5)) as torch.nn.Linear and PEFT
    return rng.uniform(-bound, bound, size=shape).astype(dtype)


class InjectLoRA(Pass):
    """Add ``lora``'s adapters to a model whose initializers live outside it, in ``weights`` (the generator's
    source model); the pass adds ``A`` and ``B`` to ``weights`` and records the adapters in the returned
    model's metadata (:meth:`LoRAMeta.from_model`).

    Args:
        lora: the configuration.
        weights: the model's initializer values by name; updated in place.
    """

    def __init__(self, lora: LoRA, weights: dict[str, np.ndarray]):
        self.lora, self.weights = lora, weights

    def call(self, model: onnx.ModelProto) -> PassResult:
        out = clone(model)
        meta = _inject(out.graph, self.weights, self.lora)
        meta.attach(out)
        return PassResult(out, True)

    def ensures(self, model: onnx.ModelProto) -> None:
        """The checker on a copy that declares the outside weights as graph inputs (no tensor data copied)."""
        probe = clone(model)
        declare_as_inputs(probe, self.weights)
        super().ensures(probe)


def _inject(graph: onnx.GraphProto, weights: dict[str, np.ndarray], lora: LoRA) -> LoRAMeta:
    _replace_base_values(weights, lora)
    found = list(candidates(graph, weights))
    chosen: dict[int, Candidate] = {}
    for pattern in [lora.targets] if isinstance(lora.targets, str) else lora.targets:
        hits = _string_targets(pattern, found, graph, weights) if isinstance(lora.targets, str) else \
            [c for c in found if _matches(pattern, c)]
        if not hits:
            raise LoRAError(_no_match(pattern, isinstance(lora.targets, str), found, graph, weights))
        chosen.update((id(c.node), c) for c in hits)
    unknown = set(lora.initial or {}) - {n for c in chosen.values() for n in adapter_param_names(c.module)}
    if unknown:
        raise LoRAError(f"LoRA initial values for {sorted(unknown)[:4]} match no targeted module")

    names = _Names(used_names(graph) | set(weights))
    rng = np.random.default_rng(lora.seed)
    adapters: list[Adapter] = []
    new_nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        new_nodes.append(node)
        c = chosen.get(id(node))
        if c is not None:
            adapter, extra = _wrap(c, lora, weights, names, rng)
            adapters.append(adapter)
            new_nodes.extend(extra)
    del graph.node[:]
    graph.node.extend(new_nodes)
    targets = [lora.targets] if isinstance(lora.targets, str) else list(lora.targets)
    return LoRAMeta(rank=lora.rank, alpha=float(lora.alpha), scale=lora.scale, dropout=float(lora.dropout),
                    use_rslora=lora.use_rslora, targets=targets, adapters=adapters)


# Ops that carry a layer's output to the model's output unchanged but for a layout, a bias or a scale
_PASS_THROUGH = {"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Identity", "Cast", "Flatten", "Softmax",
                 "LogSoftmax", "Sigmoid", "Slice", "Expand", "Gather"}
_AFFINE = {"Add", "Sub", "Mul", "Div"}


def _string_targets(pattern: str, found: list[Candidate], graph: onnx.GraphProto,
                    weights: dict[str, np.ndarray]) -> list[Candidate]:
    """PEFT's string ``target_modules``: ``"all-linear"``, or a regular expression matching a whole name."""
    if pattern.lower() != ALL_LINEAR:
        return [c for c in found if re.fullmatch(pattern, c.module) or re.fullmatch(pattern, c.weight)]
    heads = _output_layers(graph, found, weights)
    return [c for c in found if c.node.op_type in ("MatMul", "Gemm") and c.module not in heads]


def _output_layers(graph: onnx.GraphProto, found: list[Candidate], weights: dict[str, np.ndarray]) -> set[str]:
    """The modules of the candidates whose output is the model's output up to reshapes, a bias or a scale (a
    language model's head, a classifier): PEFT's ``all-linear`` leaves a transformers model's output layer out."""
    constants = set(weights) | {o for n in graph.node if n.op_type == "Constant" for o in n.output} | {""}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in graph.node:
        for x in n.input:
            readers.setdefault(x, []).append(n)
    outputs = {o.name for o in graph.output}

    def reaches_output(value: str, seen: set[str]) -> bool:
        if value in outputs:
            return True
        seen.add(value)
        for n in readers.get(value, []):
            passes = (n.op_type in _PASS_THROUGH and n.input[0] == value or
                      n.op_type in _AFFINE and all(x == value or x in constants for x in n.input))
            if passes and any(o not in seen and reaches_output(o, seen) for o in n.output):
                return True
        return False

    return {c.module for c in found if reaches_output(c.node.output[0], set())}


def _no_match(pattern: str, regex: bool, found: list[Candidate], graph: onnx.GraphProto,
              weights: dict[str, np.ndarray]) -> str:
    """Why a target matches no candidate: what it names instead (an embedding's Gather, a LayerNormalization's
    scale), or that nothing has that name, with the candidates."""
    listed = ", ".join(dict.fromkeys(c.module for c in found[:8]))
    message = (f"LoRA target {pattern!r} matches no MatMul / Gemm / 1x1 Conv weight ({len(found)} candidates: "
               f"{listed}{', ...' if len(found) > 8 else ''})")
    if regex:
        hint = "a single string is a regular expression matching a whole module path or weight name, as PEFT's " \
               "target_modules"
        if not any(ch in pattern for ch in ".*+?[]()|\\^$"):
            hint += f"; - help: targets=[{pattern!r}] matches module paths ending in .{pattern}"
        return f"{message}; {hint}"
    other = next(((n, x) for n in graph.node for x in n.input if x in weights and
                  _matches(pattern, Candidate(n, x, module_path(x, n.name), 0, 0, False))), None)
    if other is None:
        regex = any(x in pattern for x in (".*", "\\", "|", "(", "+", "^", "$"))
        return f"{message}; targets match weight names, module paths and node names" + (
            f"; - help: a regular expression goes as one string, targets={pattern!r} (PEFT's target_modules)"
            if regex else "")
    node, weight = other
    kind = f"a {node.op_type}'s input {list(node.input).index(weight)}"
    if node.op_type in ("MatMul", "Gemm", "Conv"):
        kind += " (adapters take a MatMul's second input, a Gemm's B, a 1x1 group-1 Conv's weight)"
    return (f"{message}: it names {weight!r}, {kind} in node {node.name!r}; LoRA adapts linear layers only, "
            "not embeddings (Gather), normalizations or other weights")


def _replace_base_values(weights: dict[str, np.ndarray], lora: LoRA) -> None:
    for name, value in (lora.base_values or {}).items():
        if name not in weights:
            raise LoRAError(f"LoRA base value {name!r} (e.g. a PEFT modules_to_save tensor) is not an initializer "
                             "of the model; torch's exporter keeps the names of Gemm weights but renames "
                             "pre-transposed MatMul weights (onnx::MatMul_...)")
        value = np.asarray(value)
        if value.shape != weights[name].shape:
            raise LoRAError(f"LoRA base value {name!r} has shape {value.shape}, the model's is {weights[name].shape}")
        weights[name] = value.astype(weights[name].dtype)


def _wrap(c: Candidate, lora: LoRA, weights: dict[str, np.ndarray], names: _Names,
          rng: np.random.Generator) -> tuple[Adapter, list[onnx.NodeProto]]:
    """The adapter nodes for one candidate; creates ``A`` and ``B`` unless a tied use already did."""
    node, r = c.node, lora.rank
    dtype = weights[c.weight].dtype
    a_name, b_name = adapter_param_names(c.module)
    spatial = (1,) * (weights[c.weight].ndim - 2) if node.op_type == "Conv" else ()
    a_shape, b_shape = (r, c.in_features, *spatial), (c.out_features, r, *spatial)
    for name, shape, zeros in ((a_name, a_shape, False), (b_name, b_shape, True)):
        if name in weights:
            if weights[name].shape != shape:
                raise LoRAError(f"LoRA: module {c.module!r} is used with shapes {weights[name].shape} and {shape}")
            continue
        names.taken.add(name)
        weights[name] = _initial(lora, name, shape, dtype, rng, c.in_features, zeros)

    stem = f"{node.name or c.module}/lora"
    made: list[onnx.NodeProto] = []

    def emit(op: str, inputs: list[str], **attrs) -> str:
        out = names(f"{stem}/{op}_output")
        made.append(helper.make_node(op, inputs, [out], name=names(f"{stem}/{op}"), **attrs))
        return out

    def const(value: np.ndarray) -> str:
        return emit("Constant", [], value=onnx.numpy_helper.from_array(value))

    x = node.input[0]
    if lora.dropout > 0:
        x = emit("Dropout", [x, const(np.array(lora.dropout, dtype)), const(np.array(True))])
    if node.op_type == "MatMul":
        h = emit("MatMul", [x, emit("Transpose", [a_name], perm=[1, 0])])
        h = emit("Mul", [h, const(np.array(lora.scale, dtype))])
        delta = emit("MatMul", [h, emit("Transpose", [b_name], perm=[1, 0])])
    elif node.op_type == "Gemm":
        h = emit("Gemm", [x, a_name], alpha=float(lora.scale), transA=int(_attr(node, "transA", 0)), transB=1)
        delta = emit("Gemm", [h, b_name], transB=1)
    else:
        keep = {a.name: helper.get_attribute_value(a) for a in node.attribute
                if a.name in ("strides", "pads", "auto_pad", "dilations")}
        h = emit("Conv", [x, a_name], **keep)
        h = emit("Mul", [h, const(np.array(lora.scale, dtype))])
        delta = emit("Conv", [h, b_name])
    output = node.output[0]
    base = names(f"{output}/lora_base")
    node.output[0] = base
    add = names(f"{stem}/Add")
    made.append(helper.make_node("Add", [base, delta], [output], name=add))
    gemm_alpha = float(_attr(node, "alpha", 1.0)) if node.op_type == "Gemm" else 1.0
    adapter = Adapter(module=c.module, weight=c.weight, op=node.op_type, A=a_name, B=b_name,
                      in_features=c.in_features, out_features=c.out_features, weight_transposed=c.transposed,
                      gemm_alpha=gemm_alpha, base_output=base, output=output, nodes=[n.name for n in made])
    return adapter, made
