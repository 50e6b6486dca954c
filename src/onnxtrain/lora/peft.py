"""Hugging Face PEFT's adapter files: ``adapter_model.safetensors`` + ``adapter_config.json``.

Keys are ``base_model.model.{module}.lora_A.weight`` (rank x in) and ``...lora_B.weight`` (out x rank), as
``PeftModel.save_pretrained`` writes them; other trained tensors named like torch parameters
(``classifier.weight``) go in as ``modules_to_save``. Only json and safetensors are needed, so the on-device
runtime can write and read these files without torch or peft.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping

import numpy as np

from onnxtrain.errors import LoRAError
from onnxtrain.lora.config import LoRA, LoRAMeta, adapter_param_names

__all__ = ["write_peft_adapter", "read_peft_adapter", "PEFT_PREFIX", "CONFIG_FILE", "WEIGHTS_FILE"]

logger = logging.getLogger(__name__)

PEFT_PREFIX = "base_model.model."
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"


def write_peft_adapter(meta: LoRAMeta, values: Mapping[str, np.ndarray], output_dir: str | os.PathLike,
                       extra: Mapping[str, np.ndarray] | None = None,
                       base_model_name_or_path: str | None = None,
                       base: Mapping[str, np.ndarray] | None = None) -> dict[str, str]:
    """Write the adapters of ``meta`` with their current ``values`` (by parameter name) to ``output_dir``.

    ``extra``: other trained tensors (a new head) by torch parameter name; their modules become PEFT's
    ``modules_to_save``. Tensors whose names are not torch parameter names (``onnx::MatMul_12``) are skipped
    with a warning: PEFT could not place them. ``base``: every parameter of the model by name; PEFT wraps every
    module whose name ends with a ``modules_to_save`` entry (``classifier`` takes DistilBERT's
    ``pre_classifier`` too) and then needs its tensors, which are taken from there, unchanged. Returns the two
    paths by kind ("config", "weights").
    """
    from safetensors.numpy import save_file

    tensors: dict[str, np.ndarray] = {}
    for module in meta.modules:
        for name in adapter_param_names(module):
            tensors[PEFT_PREFIX + name] = np.asarray(values[name], order="C")
    modules_to_save: list[str] = []
    skipped = []
    for name, value in (extra or {}).items():
        if name.startswith("onnx::") or "." not in name:
            skipped.append(name)
            continue
        tensors[PEFT_PREFIX + name] = np.asarray(value, order="C")
        modules_to_save.append(name.rsplit(".", 1)[0])
    if skipped:
        logger.warning("not in the PEFT adapter (no torch parameter name): %s", ", ".join(skipped[:5]))
    saved = set(modules_to_save)
    for name, value in (base or {}).items():
        module = name.rsplit(".", 1)[0]
        if ("." in name and not name.startswith("onnx::") and module not in saved
                and any(module.endswith(m) for m in saved) and PEFT_PREFIX + name not in tensors):
            tensors[PEFT_PREFIX + name] = np.asarray(value, order="C")
    config = {
        "peft_type": "LORA", "task_type": None, "base_model_name_or_path": base_model_name_or_path,
        "r": meta.rank, "lora_alpha": meta.alpha, "lora_dropout": meta.dropout, "use_rslora": meta.use_rslora,
        "target_modules": meta.modules, "modules_to_save": list(dict.fromkeys(modules_to_save)) or None,
        "bias": "none", "fan_in_fan_out": False, "init_lora_weights": True, "inference_mode": True,
        "rank_pattern": {}, "alpha_pattern": {}, "use_dora": False,
    }
    out = os.fspath(output_dir)
    os.makedirs(out, exist_ok=True)
    paths = {"config": os.path.join(out, CONFIG_FILE), "weights": os.path.join(out, WEIGHTS_FILE)}
    save_file(tensors, paths["weights"], metadata={"format": "pt"})
    with open(paths["config"], "w") as f:
        json.dump(config, f, indent=2)
    return paths


def read_peft_adapter(path: str | os.PathLike, **overrides) -> LoRA:
    """A :class:`LoRA` with the rank, alpha, dropout, target modules and weights of a PEFT adapter folder.

    Tensors of ``modules_to_save`` become ``base_values`` (by torch parameter name, which the ONNX model must
    share). ``overrides`` replace fields (e.g. ``seed``). Raises LoRAError (a ValueError) for adapters onnxtrain
    cannot reproduce (DoRA, per-module ranks or alphas, trained biases).
    """
    from safetensors.numpy import load_file

    folder = os.fspath(path)
    with open(os.path.join(folder, CONFIG_FILE)) as f:
        config = json.load(f)
    # fan_in_fan_out (PEFT sets it for GPT-2's Conv1D, whose weight is stored (in, out)) changes how PEFT merges
    # into the weight, not the adapters: lora_A is (rank, in) and lora_B (out, rank) either way
    unsupported = [k for k in ("use_dora", "rank_pattern", "alpha_pattern", "lora_bias") if config.get(k)]
    if config.get("peft_type", "LORA") != "LORA" or config.get("bias", "none") != "none":
        unsupported.append(f"peft_type={config.get('peft_type')}, bias={config.get('bias')}")
    if unsupported:
        raise LoRAError(f"{folder}: the adapter uses {unsupported}, which onnxtrain's LoRA does not support")
    tensors = load_file(os.path.join(folder, WEIGHTS_FILE))
    initial: dict[str, np.ndarray] = {}
    base_values: dict[str, np.ndarray] = {}
    for key, value in tensors.items():
        name = key.removeprefix(PEFT_PREFIX).replace(".lora_A.default.", ".lora_A.").replace(
            ".lora_B.default.", ".lora_B.")
        if ".lora_A." in name or ".lora_B." in name:
            initial[name] = value
        else:  # modules_to_save: a trained copy of a base model module
            base_values[name.replace(".modules_to_save.default.", ".").replace(".modules_to_save.", ".")] = value
    modules = list(dict.fromkeys(n.rsplit(".lora_", 1)[0] for n in initial))
    if not modules:
        raise LoRAError(f"{folder}: {WEIGHTS_FILE} holds no lora_A / lora_B tensors")
    fields = {"rank": int(config["r"]), "alpha": float(config["lora_alpha"]), "targets": modules,
              "dropout": float(config.get("lora_dropout") or 0.0), "use_rslora": bool(config.get("use_rslora")),
              "initial": initial, "base_values": base_values or None}
    fields.update(overrides)
    return LoRA(**fields)
