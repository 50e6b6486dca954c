"""The train-step model: the training graph fused with the optimizer graph, as an optional artifact.

Python's runtime fuses the two graphs itself (``runtime/passes/fuse_optimizer.py``) so that a training step
is one session run. Runtimes that cannot rewrite ONNX graphs (the JavaScript package in js/) load the same
fused graph from a file instead; this module writes it with the same passes, so there is one design:

    training model --SpecializeReset(reset=True)--> --FuseOptimizer(optimizer model)--> train_step_model.onnx

The file is optional: the peer's four artifacts train without it. It keeps the training and optimizer models'
metadata (``TrainingMeta``, ``OptimizerMeta``) and adds a :class:`~onnxtrain.conventions.TrainStepMeta`, so
a runtime can check it was built from the models it is given.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import onnx

from onnxtrain.conventions import (
    OPTIMIZER_META,
    TRAINING_META,
    OptimizerMeta,
    TrainingMeta,
    TrainStepMeta,
    artifact_file,
)
from onnxtrain.errors import ArtifactError, PassError
from onnxtrain.ir.files import atomic_write_bytes
from onnxtrain.runtime.passes import FusedNames, FuseOptimizer, SpecializeReset

__all__ = ["train_step_model", "write_train_step_model"]

logger = logging.getLogger(__name__)


def train_step_model(train_model: onnx.ModelProto, optimizer_model: onnx.ModelProto,
                     reset: bool | None = True) -> onnx.ModelProto:
    """The training graph followed by the optimizer graph, as one standard-ONNX model.

    Args:
        train_model: the training model written by generate_artifacts.
        optimizer_model: its optimizer model.
        reset: the ``lazy_reset_grad`` value to build in (True: a step after ``lazy_reset_grad()``, the usual
            loop; its graph has no gradient-buffer inputs), or None to keep the flag as an input. A training
            model too old to list its gradient accumulation keeps the flag (logged).

    Returns:
        The fused model: the training model's inputs, then the optimizer's under ``TrainStepMeta.prefix``
        (its gradients input excepted); the training model's outputs but the gradients, then the flat
        gradient and the optimizer's outputs under the prefix.

    Raises:
        ArtifactError: the two models do not belong together or cannot be fused.
    """
    meta = TrainingMeta.from_model(train_model)
    updated = [name for name, _ in OptimizerMeta.from_model(optimizer_model).layout]
    if updated != meta.trainable:
        raise ArtifactError(f"the optimizer model updates {updated[:3]}... and the training model trains "
                            f"{meta.trainable[:3]}...: they were not generated together")
    model = train_model
    if reset is not None:
        try:
            model = SpecializeReset(meta.accumulation, reset)(train_model).model
        except PassError as exc:
            logger.warning("the train-step model keeps lazy_reset_grad as an input: %s", exc)
            reset = None
    try:
        fused = FuseOptimizer(optimizer_model, meta.trainable)(model).model
    except PassError as exc:
        raise ArtifactError(f"the training and optimizer models cannot be fused into one train-step model: {exc}"
                            ) from None
    step_meta = TrainStepMeta(FusedNames.of_fused(fused).prefix, reset)
    for source in (train_model, optimizer_model):  # the runtime checks the file against its models with these
        for p in source.metadata_props:
            if p.key in (TRAINING_META, OPTIMIZER_META):
                fused.metadata_props.add(key=p.key, value=p.value)
    for key, value in step_meta.to_props().items():
        fused.metadata_props.add(key=key, value=value)
    return fused


def write_train_step_model(artifact_directory: str | os.PathLike, prefix: str = "",
                           reset: bool | None = True) -> Path:
    """Write ``train_step_model.onnx`` next to the artifacts generate_artifacts wrote (atomically).

    Args:
        artifact_directory: the folder holding the training and optimizer models.
        prefix: the ``prefix`` given to generate_artifacts, if any.
        reset: see :func:`train_step_model`.

    Returns:
        The path written.
    """
    folder = Path(artifact_directory)
    models = {}
    for kind in ("training", "optimizer"):
        path = folder / artifact_file(kind, prefix)
        if not path.is_file():
            raise ArtifactError(f"no {kind} model at {path}: write the train-step model next to the artifacts "
                                "generate_artifacts wrote (with an optimizer)")
        models[kind] = onnx.load(path)
    out = folder / artifact_file("train_step", prefix)
    atomic_write_bytes(out, train_step_model(models["training"], models["optimizer"], reset).SerializeToString())
    return out
