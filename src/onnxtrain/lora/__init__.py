"""Low-rank adapters (LoRA), compatible with Hugging Face PEFT's adapter files.

- :class:`LoRA` configures ``generate_artifacts(..., lora=LoRA(...))``.
- :class:`InjectLoRA` is the graph pass that adds them; :func:`merge_adapters` folds them into their weights
  (``export_model_for_inferencing(..., merge_adapters=True)``).
- :func:`save_peft_adapter` writes a PEFT adapter folder from a checkpoint; :meth:`LoRA.from_peft` starts from one.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import onnx

from onnxtrain.conventions import LORA_META
from onnxtrain.errors import LoRAError
from onnxtrain.lora.config import Adapter, LoRA, LoRAMeta, adapter_param_names
from onnxtrain.lora.inject import InjectLoRA
from onnxtrain.lora.merge import merge_adapters
from onnxtrain.lora.peft import read_peft_adapter, write_peft_adapter

if TYPE_CHECKING:
    from onnxtrain.runtime.state import CheckpointState

__all__ = ["LoRA", "LoRAMeta", "Adapter", "LORA_META", "LoRAError", "adapter_param_names", "InjectLoRA",
           "merge_adapters", "save_peft_adapter", "read_peft_adapter", "write_peft_adapter", "lora_meta"]


def lora_meta(model: onnx.ModelProto | str | os.PathLike) -> LoRAMeta:
    """The adapters recorded in a training or eval model; LoRAError (a ValueError) if it has none."""
    proto = model if isinstance(model, onnx.ModelProto) else onnx.load(os.fspath(model), load_external_data=False)
    meta = LoRAMeta.from_model(proto)
    if meta is None:
        raise LoRAError("the model has no LoRA adapters: generate the artifacts with lora=LoRA(...) "
                         "(onnxtrain generate --lora-rank R --lora-targets ...)")
    return meta


def save_peft_adapter(state: CheckpointState, model: onnx.ModelProto | str | os.PathLike,
                      output_dir: str | os.PathLike, base_model_name_or_path: str | None = None,
                      task_type: str | None = None) -> dict[str, str]:
    """Write ``adapter_model.safetensors`` + ``adapter_config.json`` (PEFT's format) to ``output_dir``.

    Args:
        state: the checkpoint holding the trained adapters.
        model: the artifacts' training or eval model (its metadata names the adapters).
        output_dir: the folder to write; ``PeftModel.from_pretrained(torch_model, output_dir)`` loads it.
        base_model_name_or_path: recorded in the config for PEFT's benefit.
        task_type: PEFT's ``task_type`` ("SEQ_CLS", "CAUSAL_LM", ...), for ``AutoPeftModelFor...``; None loads as
            a plain ``PeftModel``.

    Returns:
        The written paths by kind ("config", "weights").
    """
    meta = lora_meta(model)
    adapter_names = {n for a in meta.adapters for n in (a.A, a.B)}
    values = {n: state.parameters[n].data for n in adapter_names}
    extra = {n: p.data for n, p in state.parameters.items() if p.requires_grad and n not in adapter_names}
    base = {n: p.data for n, p in state.parameters.items() if n not in adapter_names}
    return write_peft_adapter(meta, values, output_dir, extra, base_model_name_or_path, base=base,
                              task_type=task_type)
