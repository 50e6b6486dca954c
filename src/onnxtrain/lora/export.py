"""Merge the adapters of an exported inference model file (``export_model_for_inferencing(merge_adapters=True)``)."""

from __future__ import annotations

import os

import onnx

from onnxtrain.ir.files import PROTO_LIMIT, atomic_write_bytes
from onnxtrain.lora import LoRAMeta, MergeAdapters

__all__ = ["merge_exported_model"]



def merge_exported_model(meta: LoRAMeta, path: str | os.PathLike) -> None:
    """Rewrite the inference model at ``path`` with the adapters of ``meta`` merged."""
    path = os.fspath(path)
    merged = MergeAdapters(meta)(onnx.load(path)).model
    if merged.ByteSize() > PROTO_LIMIT - (64 << 20):
        onnx.save_model(merged, path, save_as_external_data=True, all_tensors_to_one_file=True,
                        location=os.path.basename(path) + ".data")
        return
    atomic_write_bytes(path, merged.SerializeToString())
