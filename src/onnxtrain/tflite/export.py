"""Export trained artifacts back to the .tflite / .circle file their model was imported from."""

from __future__ import annotations

import os
import tempfile

import onnx
from onnx import numpy_helper

from onnxtrain.lora.config import LoRAMeta
from onnxtrain.tflite.source import SourceRecord, has_source
from onnxtrain.tflite.writer import WriteBackReport, write_back

__all__ = ["export_flatbuffer"]


def export_flatbuffer(training_model: str | onnx.ModelProto, eval_model: str | onnx.ModelProto, checkpoint: str,
                      output: str | os.PathLike, format: str | None = None,
                      source: str | onnx.ModelProto | None = None) -> WriteBackReport:
    """Write the weights of ``checkpoint`` into a copy of the flatbuffer the model was imported from.

    The flatbuffer comes from ``source`` (the imported ONNX model) if given, else from the training model's
    metadata (generation puts it there). Every weight goes through the exported inference model,
    so frozen and trained weights alike are written, and LoRA adapters are merged into theirs.
    """
    from onnxtrain.api import CheckpointState, Module

    load = lambda m: onnx.load(m) if isinstance(m, (str, os.PathLike)) else m  # noqa: E731
    training = load(training_model)
    if source is None and not has_source(training):
        raise ValueError("the training model was not imported from a .tflite or .circle file (its artifacts hold "
                         "no record of one; generation copies it from the model `onnxtrain import` writes): pass "
                         "that model with --source MODEL.onnx (source= in Python)")
    record = SourceRecord.from_model(load(source) if source is not None else training,
                                     "the imported model" if source is not None else "the training model")
    evaluation = load(eval_model)
    module = Module(training, CheckpointState.load_checkpoint(checkpoint), evaluation)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.onnx")
        # LoRA adapters are folded into their weights: the flatbuffer has only the base weights' buffers
        module.export_model_for_inferencing(path, merge_adapters=LoRAMeta.from_model(evaluation) is not None)
        exported = onnx.load(path)
    weights = {i.name: numpy_helper.to_array(i) for i in exported.graph.initializer if i.name in record.weights}
    return write_back(record, weights, output, format)
