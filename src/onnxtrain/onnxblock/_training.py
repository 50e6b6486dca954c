"""TrainingBlock's back end: onnxtrain's offline phase applied to a forward model whose output is the loss."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from onnxtrain import conventions as names
from onnxtrain.artifacts.graphs import build_graphs
from onnxtrain.artifacts.params import plan_parameters
from onnxtrain.artifacts.source import load_source_model
from onnxtrain.blocks.ops import Identity

__all__ = ["TrainingModels", "build_training_models"]


@dataclass
class TrainingModels:
    training: onnx.ModelProto
    eval: onnx.ModelProto
    weights: dict[str, np.ndarray]
    trainable: list[str]
    frozen: list[str]


def build_training_models(forward: onnx.ModelProto, loss: str, requires_grad: Sequence[str],
                          frozen: Sequence[str], additional_outputs: Sequence[str] = ()) -> TrainingModels:
    """Training and eval models of ``forward`` with ``loss`` (one of its outputs) as the loss, returning
    ``additional_outputs`` (other values the block returned) after it, as the peer's.

    Names in ``requires_grad`` that are graph inputs get their gradient returned, as parameters do.
    """
    source = load_source_model(forward)
    graph_inputs = {i.name for i in source.model.graph.input} - set(source.weights)
    params = [n for n in requires_grad if n not in graph_inputs]
    plan = plan_parameters(source.model.graph, source.weights, params or None,
                           [n for n in frozen if n not in graph_inputs])
    plan.inputs = [n for n in requires_grad if n in graph_inputs]
    graphs = build_graphs(source.model, source.weights, plan, Identity(), [loss], list(additional_outputs),
                          False)
    for model in (graphs.training, graphs.eval):
        for value in model.graph.input:
            if value.name == names.LAZY_RESET_GRAD:  # the peer feeds shape [1], onnxtrain's runtime a scalar
                value.type.tensor_type.ClearField("shape")
    return TrainingModels(graphs.training, graphs.eval, source.weights, plan.trainable, plan.frozen)
