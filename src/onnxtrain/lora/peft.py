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

__all__ = ["write_peft_adapter", "read_peft_adapter", "fan_in_fan_out", "PEFT_PREFIX", "CONFIG_FILE", "WEIGHTS_FILE"]

logger = logging.getLogger(__name__)

PEFT_PREFIX = "base_model.model."
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
TASK_TYPES = ("SEQ_CLS", "SEQ_2_SEQ_LM", "CAUSAL_LM", "TOKEN_CLS", "QUESTION_ANS", "FEATURE_EXTRACTION")


def write_peft_adapter(meta: LoRAMeta, values: Mapping[str, np.ndarray], output_dir: str | os.PathLike,
                       extra: Mapping[str, np.ndarray] | None = None,
                       base_model_name_or_path: str | None = None,
                       base: Mapping[str, np.ndarray] | None = None, task_type: str | None = None) -> dict[str, str]:
    """Write the adapters of ``meta`` with their current ``values`` (by parameter name) to ``output_dir``.

    ``extra``: other trained tensors (a new head) by torch parameter name; their modules become PEFT's
    ``modules_to_save``. Tensors whose names are not torch parameter names (``onnx::MatMul_12``) are skipped
    with a warning: PEFT could not place them. ``base``: every parameter of the model by name; PEFT wraps every
    module whose name ends with a ``modules_to_save`` entry (``classifier`` takes DistilBERT's
    ``pre_classifier`` too) and then needs its tensors, which are taken from there, unchanged. ``task_type``:
    PEFT's (one of :data:`TASK_TYPES`). Returns the two paths by kind ("config", "weights").
    """
    from safetensors.numpy import save_file

    if task_type is not None and task_type not in TASK_TYPES:
        raise LoRAError(f"task_type {task_type!r} is not one of PEFT's: {', '.join(TASK_TYPES)} (or None)")

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
    if base is not None:
        modules_to_save = _whole_modules(modules_to_save, {n for n in extra or {} if n not in skipped}, base,
                                         meta.modules)
    saved = set(modules_to_save)
    for name, value in (base or {}).items():
        module = name.rsplit(".", 1)[0]
        if ("." in name and not name.startswith("onnx::") and module not in saved
                and any(module.endswith(m) for m in saved) and PEFT_PREFIX + name not in tensors):
            tensors[PEFT_PREFIX + name] = np.asarray(value, order="C")
    config = {
        "peft_type": "LORA", "task_type": task_type, "base_model_name_or_path": base_model_name_or_path,
        "r": meta.rank, "lora_alpha": meta.alpha, "lora_dropout": meta.dropout, "use_rslora": meta.use_rslora,
        "target_modules": meta.modules, "modules_to_save": list(dict.fromkeys(modules_to_save)) or None,
        "bias": "none", "fan_in_fan_out": fan_in_fan_out(meta), "init_lora_weights": True, "inference_mode": True,
        "rank_pattern": {}, "alpha_pattern": {}, "use_dora": False,
    }
    out = os.fspath(output_dir)
    os.makedirs(out, exist_ok=True)
    paths = {"config": os.path.join(out, CONFIG_FILE), "weights": os.path.join(out, WEIGHTS_FILE)}
    save_file(tensors, paths["weights"], metadata={"format": "pt"})
    with open(paths["config"], "w") as f:
        json.dump(config, f, indent=2)
    return paths


def _whole_modules(modules: list[str], trained: set[str], every: Mapping[str, np.ndarray],
                   adapted: list[str]) -> list[str]:
    """Trained sibling modules as their parent when the parent's parameters all train: RoBERTa's ``classifier``
    for its ``classifier.dense`` and ``classifier.out_proj``. PEFT wraps a module and its submodules alike, and
    with ``task_type="SEQ_CLS"`` it adds ``classifier`` itself, which beside ``classifier.dense`` broke its
    loading. Never a parent of an adapted module (PEFT does not adapt inside ``modules_to_save``), nor a parent of
    one trained module only (it may hold weights the export renamed, ``onnx::MatMul_N``)."""
    names = [n for n in every if "." in n and not n.startswith("onnx::")] + sorted(trained)
    unique = list(dict.fromkeys(modules))
    whole = []
    for module in unique:
        parts, best = module.split("."), module
        for k in range(len(parts) - 1, 0, -1):
            ancestor = ".".join(parts[:k]) + "."
            if (not all(n in trained for n in names if n.startswith(ancestor))
                    or any(m.startswith(ancestor) for m in adapted)
                    or sum(m.startswith(ancestor) for m in unique) < 2):
                break
            best = ancestor[:-1]
        whole.append(best)
    return list(dict.fromkeys(whole))


def fan_in_fan_out(meta: LoRAMeta) -> bool:
    """PEFT's ``fan_in_fan_out``: whether the torch modules store their weights (in, out), as GPT-2's ``Conv1D``.

    A weight under its torch name (``transformer.h.0.attn.c_attn.weight``, as torch's exporters keep a Gemm's
    or give it back) that the graph reads as (in, out) is stored so in torch; a ``torch.nn.Linear`` is (out, in),
    and the (in, out) copies torch's constant folding makes of it are called ``onnx::MatMul_N``. PEFT has one flag
    for all modules (and corrects it per module with a warning), so any such module sets it.
    """
    return any(not a.weight_transposed and a.op in ("MatMul", "Gemm") and a.weight == f"{a.module}.weight"
               for a in meta.adapters)


def _read_config(folder: str) -> dict:
    """``adapter_config.json``, with an error that says what the folder is instead."""
    file = os.path.join(folder, CONFIG_FILE)
    if not os.path.isfile(file):
        inside = sorted(d for d in (os.listdir(folder) if os.path.isdir(folder) else [])
                        if os.path.isfile(os.path.join(folder, d, CONFIG_FILE)))
        what = ("not a folder" if not os.path.isdir(folder) else
                f"no {CONFIG_FILE}; its subfolders {inside} hold adapters (PEFT saves a named adapter in a "
                "subfolder): give one of them" if inside else f"no {CONFIG_FILE}: not a PEFT adapter folder")
        raise LoRAError(f"{folder}: {what}")
    try:
        with open(file) as f:
            config = json.load(f)
        int(config["r"]), float(config["lora_alpha"])
    except (ValueError, KeyError, TypeError) as exc:
        raise LoRAError(f"{file}: not a LoRA adapter config (needs numbers 'r' and 'lora_alpha'): {exc!r}") from None
    return config


def read_peft_adapter(path: str | os.PathLike, **overrides) -> LoRA:
    """A :class:`LoRA` with the rank, alpha, dropout, target modules and weights of a PEFT adapter folder.

    Tensors of ``modules_to_save`` become ``base_values`` (by torch parameter name, which the ONNX model must
    share). ``overrides`` replace fields (e.g. ``seed``). Raises LoRAError (a ValueError) for adapters onnxtrain
    cannot reproduce (DoRA, per-module ranks or alphas, trained biases).
    """
    from safetensors.numpy import load_file

    folder = os.fspath(path)
    config = _read_config(folder)
    # fan_in_fan_out (PEFT sets it for GPT-2's Conv1D, whose weight is stored (in, out)) changes how PEFT merges
    # into the weight, not the adapters: lora_A is (rank, in) and lora_B (out, rank) either way
    unsupported = [k for k in ("use_dora", "rank_pattern", "alpha_pattern", "lora_bias") if config.get(k)]
    if config.get("peft_type", "LORA") != "LORA" or config.get("bias", "none") != "none":
        unsupported.append(f"peft_type={config.get('peft_type')}, bias={config.get('bias')}")
    if unsupported:
        raise LoRAError(f"{folder}: the adapter uses {unsupported}, which onnxtrain's LoRA does not support")
    if not os.path.isfile(os.path.join(folder, WEIGHTS_FILE)):
        pickled = os.path.isfile(os.path.join(folder, "adapter_model.bin"))
        raise LoRAError(f"{folder}: no {WEIGHTS_FILE}" + (
            " (it holds adapter_model.bin, torch's pickle format; - help: save the adapter with "
            "save_pretrained(..., safe_serialization=True))" if pickled else ""))
    tensors = load_file(os.path.join(folder, WEIGHTS_FILE))
    initial: dict[str, np.ndarray] = {}
    base_values: dict[str, np.ndarray] = {}
    for key, value in tensors.items():
        name = key.removeprefix(PEFT_PREFIX).replace(".lora_A.default.", ".lora_A.").replace(
            ".lora_B.default.", ".lora_B.")
        if ".lora_A." in name or ".lora_B." in name:
            initial[name] = value
        elif ".base_layer." in name:
            # the frozen base weight of an adapted layer, which PEFT saves beside the adapters of a layer it takes
            # for an embedding (save_embedding_layers: a language model's head); the model has its own
            continue
        else:  # modules_to_save: a trained copy of a base model module
            base_values[name.replace(".modules_to_save.default.", ".").replace(".modules_to_save.", ".")] = value
    modules = list(dict.fromkeys(n.rsplit(".lora_", 1)[0] for n in initial))
    if not modules:
        raise LoRAError(f"{folder}: {WEIGHTS_FILE} holds no lora_A / lora_B tensors")
    ranks = {n: v.shape[0] if ".lora_A." in n else v.shape[1] for n, v in initial.items() if v.ndim >= 2}
    wrong = {n: r for n, r in ranks.items() if r != config["r"]}
    if wrong:
        name, rank = next(iter(wrong.items()))
        raise LoRAError(f"{folder}: {CONFIG_FILE} says r={config['r']}, but {name!r} in {WEIGHTS_FILE} has rank "
                        f"{rank} (shape {initial[name].shape}): the files are of different adapters")
    fields = {"rank": int(config["r"]), "alpha": float(config["lora_alpha"]), "targets": modules,
              "dropout": float(config.get("lora_dropout") or 0.0), "use_rslora": bool(config.get("use_rslora")),
              "initial": initial, "base_values": base_values or None,
              "modules_to_save": sorted({n.rsplit(".", 1)[0] for n in base_values}) or None}
    fields.update(overrides)
    return LoRA(**fields)
