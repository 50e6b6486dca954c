"""Merge the adapters of an exported inference model file (``export_model_for_inferencing(merge_adapters=True)``)."""

from __future__ import annotations

import os

import onnx
from onnx import numpy_helper

from onnxtrain.lora import LoRAMeta, MergeAdapters

__all__ = ["merge_exported_model"]



def merge_exported_model(meta: LoRAMeta, path: str | os.PathLike) -> None:
    """Rewrite the inference model at ``path`` with the adapters of ``meta`` merged."""
    from onnxtrain.runtime.export import write_model

    merged = MergeAdapters(meta)(onnx.load(os.fspath(path))).model
    weights = {t.name: numpy_helper.to_array(t) for t in merged.graph.initializer}
    del merged.graph.initializer[:]
    write_model(merged, weights, path)   # replacing PATH.data, not appending to it
