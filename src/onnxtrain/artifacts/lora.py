"""The LoRA hook of ``generate_artifacts``: inject the adapters into the source model and train them."""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence

from onnxtrain.artifacts.graphs import TrainingGraphs
from onnxtrain.artifacts.params import plan_parameters
from onnxtrain.artifacts.source import SourceModel
from onnxtrain.errors import LoRAError
from onnxtrain.lora import InjectLoRA, LoRA, LoRAMeta, lora_meta

__all__ = ["apply_lora", "finish_lora"]


def apply_lora(source: SourceModel, lora: LoRA, requires_grad: Sequence[str] | None,
               frozen_params: Sequence[str] | None) -> tuple[list[str], list[str] | None, LoRAMeta]:
    """Add ``lora``'s adapters to ``source`` (in place); return ``requires_grad`` and ``frozen_params`` for the
    parameter plan, and the record for the artifacts' metadata.

    ``requires_grad=None`` trains the adapters only (PEFT freezes the base model); named parameters (a new head)
    train beside them. A targeted weight cannot be trained as well. With ``lora.freeze_base`` every other
    weight becomes a frozen parameter (in the checkpoint); otherwise only ``frozen_params`` are, and the rest
    stay constants of the graphs.
    """
    source.model = InjectLoRA(lora, source.weights)(source.model).model
    meta = lora_meta(source.model)
    targeted = {a.weight for a in meta.adapters}
    for pattern in requires_grad or []:
        both = sorted(w for w in targeted if w == pattern or fnmatch.fnmatchcase(w, pattern))
        if both:
            raise LoRAError(f"requires_grad {pattern!r} names {both[0]!r}, which carries a LoRA adapter and stays "
                            "frozen; - help: leave it out of requires_grad, or out of the LoRA targets")
    adapters = list(dict.fromkeys(n for a in meta.adapters for n in (a.A, a.B)))
    saved = _modules_to_save(lora, source, targeted, frozen_params)
    train = [*adapters, *saved, *(n for n in requires_grad or [] if n not in adapters and n not in saved)]
    if not lora.freeze_base:
        return train, frozen_params, meta
    plan = plan_parameters(source.model.graph, source.weights, train, frozen_params)
    weights = plan_parameters(source.model.graph, source.weights, None, None).trainable  # every weight-like one
    return train, [*plan.frozen, *(w for w in weights if w not in plan.trainable and w not in plan.frozen)], meta


_BUFFERS = (".running_mean", ".running_var")   # a BatchNorm's statistics: buffers, not parameters


def _modules_to_save(lora: LoRA, source: SourceModel, targeted: set[str],
                     frozen_params: Sequence[str] | None) -> list[str]:
    """The parameters of ``lora.modules_to_save`` (PEFT's: the modules whose paths end with an entry; or a
    parameter name or glob), which train beside the adapters; those also named in ``frozen_params`` stay
    frozen."""
    frozen = frozen_params or []
    found: list[str] = []
    for entry in lora.modules_to_save or []:
        hits = [w for w, v in source.weights.items() if v.dtype.kind == "f" and _saves(entry, w)
                and not w.endswith(_BUFFERS)]
        if not hits:
            raise LoRAError(f"LoRA modules_to_save {entry!r} names no float parameter of the model (a module whose "
                            "path ends with it, or a parameter name or glob); torch's constant folding renames "
                            "a Linear's weight on a 3-D input to onnx::MatMul_N: export with "
                            "do_constant_folding=False to keep the torch names")
        both = sorted(set(hits) & targeted)
        if both:
            raise LoRAError(f"LoRA modules_to_save {entry!r} names {both[0]!r}, which carries a LoRA adapter and "
                            "stays frozen; - help: leave it out of modules_to_save, or out of the LoRA targets")
        found += [w for w in hits if w not in found and not any(w == f or fnmatch.fnmatchcase(w, f) for f in frozen)]
    return found


def _saves(entry: str, weight: str) -> bool:
    """PEFT wraps every module whose path ends with the entry (``classifier`` takes DistilBERT's
    ``pre_classifier`` too), with all its parameters (RoBERTa's ``classifier.dense.weight``)."""
    parts = weight.split(".")
    modules = [".".join(parts[:k]) for k in range(1, len(parts))]
    return weight == entry or fnmatch.fnmatchcase(weight, entry) or any(m.endswith(entry) for m in modules)


def finish_lora(graphs: TrainingGraphs, meta: LoRAMeta) -> None:
    """Record the adapters in the training and eval models (the runtime's merge and the PEFT export read it).

    LoRA's point is memory: with the weights frozen, the activations the backward keeps are most of a step's
    memory. generate_artifacts makes every training graph, LoRA's included, keep fewer forward values and
    temporaries for the backward (``GeluBackward``, ``ShapesInForward``, then ``RecomputeInBackward``; see its
    ``build``).
    """
    meta.attach(graphs.training)
    meta.attach(graphs.eval)
