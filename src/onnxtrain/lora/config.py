"""The LoRA configuration a user gives, and the adapter record that travels in the artifacts' metadata."""

from __future__ import annotations

import json
import math
import numbers
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import onnx

from onnxtrain.conventions import LORA_META

__all__ = ["LoRA", "Adapter", "LoRAMeta", "LORA_META", "ALL_LINEAR", "adapter_param_names"]

ALL_LINEAR = "all-linear"


def _check_regex(pattern: str) -> None:
    if pattern.lower() == ALL_LINEAR:
        return
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"LoRA targets {pattern!r}: a single string is a regular expression (as PEFT's "
                         f"target_modules), and this one does not compile: {exc}; - help: give a list of names "
                         "or globs, e.g. targets=['query', 'value']") from None


def adapter_param_names(module: str) -> tuple[str, str]:
    """The parameter names of a module's adapter: PEFT's key names without ``base_model.model.``."""
    return f"{module}.lora_A.weight", f"{module}.lora_B.weight"


@dataclass
class LoRA:
    """Low-rank adapters (Hu et al., 2021, https://arxiv.org/abs/2106.09685) for ``generate_artifacts(lora=...)``.

    Each targeted weight ``W`` stays frozen; a trainable ``A`` (rank x in, Kaiming-uniform) and ``B`` (out x rank,
    zeros) add ``scale * (dropout(x) A^T) B^T`` to the node's output, with ``scale = alpha / rank`` (or
    ``alpha / sqrt(rank)`` with ``use_rslora``), as Hugging Face PEFT's ``LoraConfig``.

    Args:
        rank: the adapters' rank ``r``.
        alpha: PEFT's ``lora_alpha``.
        targets: a list of names or shell globs matched against the weight initializer's name, the node's name
            and the torch module path (taken from the weight name, or from the node name torch's exporter writes,
            e.g. ``/bert/encoder/layer.0/attention/self/query/MatMul`` ->
            ``bert.encoder.layer.0.attention.self.query``).
            A plain name also matches a module path ending in ``.name`` (PEFT's ``target_modules``). Candidates
            are the weights of MatMul (second input), Gemm (input B) and 1x1 Conv (group 1) nodes. As in PEFT, a
            single string is a regular expression that must match a whole module path (or weight name), and
            ``"all-linear"`` takes every MatMul / Gemm weight but the output layer's (a language model's head or
            a classifier that writes the model's output).
        dropout: dropout on the adapter's input during training (PEFT's ``lora_dropout``).
        use_rslora: rank-stabilized scaling ``alpha / sqrt(rank)``.
        seed: seeds the Kaiming-uniform initialization of ``A``.
        freeze_base: the weights that do not train (the targeted ones included) become frozen parameters: one
            copy in the checkpoint, fed to the training and eval sessions. False leaves them constants of the
            graphs, as ``requires_grad`` does without LoRA: a checkpoint of the adapters only, but a copy of the
            weights in each graph file and in each onnxruntime session (on the BERT benchmark, 2.1x the peak
            RSS and 4x the generation time).
        initial: starting values of adapter parameters by name (``{module}.lora_A.weight``); see :meth:`from_peft`.
        base_values: values replacing initializers of the model by name, e.g. a classifier PEFT saved as
            ``modules_to_save``; see :meth:`from_peft`.
        modules_to_save: modules whose parameters train beside the adapters, as PEFT's ``modules_to_save``
            (every module whose path ends with an entry, e.g. ``["classifier"]``, with its submodules; or a
            parameter name or glob): the same as naming their parameters in ``generate_artifacts(requires_grad=...)``.
            :meth:`from_peft` sets it to the modules the adapter file holds.
    """

    rank: int = 8
    alpha: float = 16.0
    targets: Sequence[str] | str = ("*query*", "*value*")
    dropout: float = 0.0
    use_rslora: bool = False
    seed: int = 0
    freeze_base: bool = True
    initial: Mapping[str, np.ndarray] | None = field(default=None, repr=False)
    base_values: Mapping[str, np.ndarray] | None = field(default=None, repr=False)
    modules_to_save: Sequence[str] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.rank, int) or self.rank < 1:
            raise ValueError(f"LoRA rank must be a positive integer, got {self.rank!r}")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, numbers.Real) or not math.isfinite(self.alpha):
            raise ValueError(f"LoRA alpha must be a finite number (PEFT's lora_alpha), got {self.alpha!r}")
        if isinstance(self.modules_to_save, str):
            self.modules_to_save = [self.modules_to_save]
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"LoRA dropout must be in [0, 1), got {self.dropout!r}")
        if not isinstance(self.targets, str) and [str(t).lower() for t in self.targets] == [ALL_LINEAR]:
            self.targets = ALL_LINEAR   # the command line's --lora-targets all-linear
        if isinstance(self.targets, str):
            _check_regex(self.targets)
        elif not self.targets:
            raise ValueError("LoRA targets is empty: name at least one MatMul/Gemm/Conv weight or module")

    @property
    def scale(self) -> float:
        """The factor applied to the adapter's output."""
        return self.alpha / (math.sqrt(self.rank) if self.use_rslora else self.rank)

    @classmethod
    def from_peft(cls, path: str, **overrides) -> LoRA:
        """A LoRA that starts from a Hugging Face PEFT adapter folder (``adapter_config.json`` and
        ``adapter_model.safetensors``): its rank, alpha, dropout, target modules and weights, and the tensors
        of its ``modules_to_save`` (by torch parameter name, as ``base_values``), which train as in PEFT
        (``modules_to_save=None`` in ``overrides`` keeps them frozen)."""
        from onnxtrain.lora.peft import read_peft_adapter

        return read_peft_adapter(path, **overrides)


@dataclass
class Adapter:
    """One injected adapter: which node and weight it wraps and which graph pieces it added."""

    module: str          # the torch module path (PEFT key stem)
    weight: str          # the frozen weight initializer W
    op: str              # MatMul | Gemm | Conv
    A: str
    B: str
    in_features: int
    out_features: int
    weight_transposed: bool  # W is stored (out, in): Gemm transB=1 and Conv; MatMul stores (in, out)
    gemm_alpha: float    # the wrapped Gemm's alpha (1 for MatMul / Conv)
    base_output: str     # the wrapped node now writes here
    output: str          # the Add of base and adapter writes the node's original output
    nodes: list[str]     # names of the nodes the adapter added (the Add included)


@dataclass
class LoRAMeta:
    """What the runtime, the merge and the PEFT export need to know; stored as JSON under :data:`LORA_META`."""

    rank: int
    alpha: float
    scale: float
    dropout: float
    use_rslora: bool
    targets: list[str]
    adapters: list[Adapter]

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    def attach(self, model: onnx.ModelProto) -> None:
        """Store this record in ``model``'s metadata (replacing an older one)."""
        for i, prop in enumerate(model.metadata_props):
            if prop.key == LORA_META:
                del model.metadata_props[i]
                break
        model.metadata_props.add(key=LORA_META, value=self.to_json())

    @classmethod
    def from_model(cls, model: onnx.ModelProto) -> LoRAMeta | None:
        """The record stored in ``model``'s metadata, or None for a model without adapters."""
        for prop in model.metadata_props:
            if prop.key == LORA_META:
                raw = json.loads(prop.value)
                raw["adapters"] = [Adapter(**a) for a in raw["adapters"]]
                return cls(**raw)
        return None

    @property
    def modules(self) -> list[str]:
        """Adapted module paths, once each, in graph order."""
        return list(dict.fromkeys(a.module for a in self.adapters))
