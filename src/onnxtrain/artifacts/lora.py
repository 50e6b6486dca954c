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
    train = [*adapters, *(n for n in requires_grad or [] if n not in adapters)]
    if not lora.freeze_base:
        return train, frozen_params, meta
    plan = plan_parameters(source.model.graph, source.weights, train, frozen_params)
    weights = plan_parameters(source.model.graph, source.weights, None, None).trainable  # every weight-like one
    return train, [*plan.frozen, *(w for w in weights if w not in plan.trainable and w not in plan.frozen)], meta


def finish_lora(graphs: TrainingGraphs, meta: LoRAMeta) -> None:
    """Record the adapters in the training and eval models (the runtime's merge and the PEFT export read it).

    LoRA's point is memory: with the weights frozen, the activations the backward keeps are most of a step's
    memory. generate_artifacts makes every training graph, LoRA's included, keep fewer forward values and
    temporaries for the backward (``GeluBackward``, ``ShapesInForward``, then ``RecomputeInBackward``; see its
    ``build``).
    """
    meta.attach(graphs.training)
    meta.attach(graphs.eval)
