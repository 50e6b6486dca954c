"""`onnxtrain info DIR|MODEL.onnx|CHECKPOINT`: inputs, outputs, parameters, trainable counts, sizes and opsets."""

from __future__ import annotations

import argparse
import collections
import json
import os
from dataclasses import asdict

import numpy as np
import onnx

from onnxtrain import conventions as names
from onnxtrain.cli.common import (
    Artifacts,
    CliError,
    human_bytes,
    human_count,
    read_model,
    shape_text,
    stored_train_config,
)
from onnxtrain.conventions import OptimizerMeta, TrainingMeta

__all__ = ["add_parser", "run", "artifact_info", "model_info", "artifact_summary"]


def _io(values) -> list[dict]:
    from onnxtrain.runtime.backends.base import graph_io

    return [{"name": m.name, "dtype": str(m.dtype), "shape": list(m.shape) if m.shape is not None else None}
            for m in graph_io(values)]


def _opsets(model: onnx.ModelProto) -> dict[str, int]:
    return {op.domain or "ai.onnx": op.version for op in model.opset_import}


def _tensors(group: dict[str, np.ndarray]) -> dict:
    return {"count": len(group), "elements": int(sum(a.size for a in group.values())),
            "bytes": int(sum(a.nbytes for a in group.values())),
            "tensors": {n: list(a.shape) for n, a in group.items()}}


def model_info(path: str) -> dict:
    """A plain ONNX model: its interface, initializers and ops."""
    from onnx import numpy_helper

    model = read_model(path, "model")
    g = model.graph
    inits = {i.name: numpy_helper.to_array(i, base_dir=os.path.dirname(os.path.abspath(path))) for i in g.initializer}
    floats = {n: a for n, a in inits.items() if a.dtype.kind == "f" and a.ndim > 0}
    info = {"kind": "model", "path": path, "ir_version": model.ir_version, "opsets": _opsets(model),
            "producer": f"{model.producer_name} {model.producer_version}".strip(),
            "inputs": _io([i for i in g.input if i.name not in inits]), "outputs": _io(g.output),
            "nodes": len(g.node), "ops": dict(collections.Counter(n.op_type for n in g.node).most_common()),
            "initializers": _tensors(inits), "float_weights": _tensors(floats),
            "size_bytes": os.path.getsize(path)}
    if any(p.key == names.TRAINING_META for p in model.metadata_props):
        info["training_metadata"] = asdict(TrainingMeta.from_model(model, "model"))
    return info


def artifact_info(directory: str, prefix: str = "") -> dict:
    """An artifact folder: the model interface, the parameter roles, the optimizer, the checkpoints."""
    from onnxtrain.checkpoint import load_checkpoint

    arts = Artifacts.locate(directory, prefix)
    training = read_model(arts.training, "training model")
    meta = TrainingMeta.from_model(training)
    inputs = {m["name"]: m for m in _io(training.graph.input)}
    outputs = {m["name"]: m for m in _io(training.graph.output)}
    ckpt = load_checkpoint(arts.checkpoint)
    info = {
        "kind": "artifacts", "path": directory, "prefix": prefix, "opsets": _opsets(training),
        "ir_version": training.ir_version,
        "files": {k: {"path": p, "bytes": os.path.getsize(p)} for k, p in
                  (("training", arts.training), ("eval", arts.eval), ("optimizer", arts.optimizer),
                   ("checkpoint", arts.checkpoint)) if p},
        "inputs": [inputs[n] for n in meta.user_inputs], "labels": [inputs[n] for n in meta.labels],
        "model_outputs": meta.model_outputs,
        "additional_outputs": [outputs[n] for n in meta.additional_outputs if n in outputs],
        "checkpoint": {"nominal": ckpt.nominal, "step": ckpt.step,
                       "properties": {k: v for k, v in ckpt.properties.items() if not k.startswith("onnxtrain.")}},
        "train_config": stored_train_config(training),
    }
    if ckpt.nominal:
        specs = {k.split("/", 1)[1]: v for k, v in ckpt.specs.items() if not k.startswith("optimizer/")}
        sizes = {n: (int(np.prod(s.shape)), int(np.prod(s.shape)) * np.dtype(s.dtype).itemsize, list(s.shape))
                 for n, s in specs.items()}
        for role in ("trainable", "frozen", "buffers"):
            group = {n: sizes[n] for n in getattr(meta, role) if n in sizes}
            info[role] = {"count": len(group), "elements": sum(v[0] for v in group.values()),
                          "bytes": sum(v[1] for v in group.values()), "tensors": {n: v[2] for n, v in group.items()}}
    else:
        info.update(trainable=_tensors(ckpt.trainable), frozen=_tensors(ckpt.frozen), buffers=_tensors(ckpt.buffers))
    from onnxtrain.lora import LoRAMeta

    adapters = LoRAMeta.from_model(training)
    if adapters is not None:
        info["lora"] = {"rank": adapters.rank, "alpha": adapters.alpha, "scale": adapters.scale,
                        "dropout": adapters.dropout, "modules": adapters.modules}
    if arts.optimizer:
        opt = read_model(arts.optimizer, "optimizer model")
        ometa = OptimizerMeta.from_model(opt)
        info["optimizer"] = {"type": ometa.type, "config": ometa.config, "states": ometa.states}
    runs = {}
    for which in ("last", "best"):
        path = os.path.join(arts.run_dir, f"{which}.ckpt")
        if os.path.isfile(path):
            progress = load_checkpoint(path).properties.get("onnxtrain.progress")
            runs[which] = {"path": path, "progress": json.loads(progress) if progress else None}
    from onnxtrain.cli.train import step_checkpoints

    steps = list(step_checkpoints(arts.run_dir).values())
    if steps:
        runs["steps"] = {"paths": steps}
    if runs:
        info["run"] = runs
    return info


def _params_line(role: str, group: dict, total: int) -> str:
    share = f" ({100 * group['elements'] / total:.1f}%)" if total else ""
    return (f"  {role:<10}{group['count']:>4} tensors {human_count(group['elements']):>12} elements{share}, "
            f"{human_bytes(group['bytes'])}")


def artifact_summary(directory: str, prefix: str = "") -> list[str]:
    return _artifact_lines(artifact_info(directory, prefix))


def _io_line(m: dict) -> str:
    return f"{m['name']}: {m['dtype']}{shape_text(m['shape'])}"


def _artifact_lines(info: dict) -> list[str]:
    lines = [f"inputs:      {', '.join(_io_line(m) for m in info['inputs'])}",
             f"labels:      {', '.join(_io_line(m) for m in info['labels'])}",
             "outputs:     loss" + (", " + ", ".join(_io_line(m) for m in info["additional_outputs"])
                                     if info["additional_outputs"] else "")
             + f"  (model outputs: {', '.join(info['model_outputs'])})"]
    total = sum(info[r]["elements"] for r in ("trainable", "frozen", "buffers"))
    lines.append(f"parameters:  {human_count(total)} elements")
    for role in ("trainable", "frozen", "buffers"):
        if info[role]["count"] or role == "trainable":
            lines.append(_params_line(role, info[role], total))
    trainable = list(info["trainable"]["tensors"])
    if trainable:
        shown = ", ".join(trainable[:6]) + (f", ... ({len(trainable)} in all)" if len(trainable) > 6 else "")
        lines.append(f"  trained:   {shown}")
    if "lora" in info:
        lora, modules = info["lora"], info["lora"]["modules"]
        shown = ", ".join(modules[:3]) + (f", ... ({len(modules)} in all)" if len(modules) > 3 else "")
        lines.append(f"LoRA:        rank {lora['rank']}, alpha {lora['alpha']:g} (scale {lora['scale']:g}), dropout "
                     f"{lora['dropout']:g} on {shown}")
    if "optimizer" in info:
        opt = info["optimizer"]
        config = ", ".join(f"{k}={v}" for k, v in opt["config"].items()
                           if v not in (None, 0.0, False) and k != "state_names")
        lines.append(f"optimizer:   {opt['type']}({config})")
    else:
        lines.append("optimizer:   none (no optimizer model: eval and export only)")
    lines.append("opsets:      " + ", ".join(f"{d} {v}" for d, v in info["opsets"].items())
                 + f"; ir version {info['ir_version']}")
    lines.append("files:       " + ", ".join(f"{os.path.basename(f['path'])} {human_bytes(f['bytes'])}"
                                             for f in info["files"].values()))
    ckpt = info["checkpoint"]
    lines.append(f"checkpoint:  step {ckpt['step']}" + (" (nominal: no weights)" if ckpt["nominal"] else ""))
    if info["train_config"]:
        lines.append("train config: " + " ".join(f"{k}={v}" for k, v in info["train_config"].items()))
    for which, run in info.get("run", {}).items():
        if which == "steps":
            lines.append(f"run (steps): {', '.join(map(os.path.basename, run['paths']))} (train --resume CKPT)")
            continue
        p = run["progress"] or {}
        lines.append(f"run ({which}):  {run['path']}: {_count(p.get('epoch', '?'), 'epoch')} done" +
                     (f" + {_count(p['batch'], 'batch')}" if p.get("batch") else "")
                     + f", step {p.get('global_step', '?')}")
    return lines


def _count(n, word: str) -> str:
    """`1 epoch`, `2 epochs`, `1 batch`, `3 batches` (`? epochs` when unknown)."""
    return f"{n} {word}" if n == 1 else f"{n} {word}es" if word == "batch" else f"{n} {word}s"


def _model_lines(info: dict) -> list[str]:
    lines = [f"model:       {info['path']} ({human_bytes(info['size_bytes'])}, {info['nodes']} nodes"
             + (f", producer {info['producer']}" if info["producer"] else "") + ")",
             f"inputs:      {', '.join(_io_line(m) for m in info['inputs'])}",
             f"outputs:     {', '.join(_io_line(m) for m in info['outputs'])}",
             "opsets:      " + ", ".join(f"{d} {v}" for d, v in info["opsets"].items())
             + f"; ir version {info['ir_version']}"]
    inits, floats = info["initializers"], info["float_weights"]
    lines.append(f"parameters:  {inits['count']} initializers, {human_count(inits['elements'])} elements, "
                 f"{human_bytes(inits['bytes'])}; trainable by default: {floats['count']} float weights, "
                 f"{human_count(floats['elements'])} elements")
    ops = ", ".join(f"{op} {n}" for op, n in info["ops"].items())
    lines.append(f"ops:         {ops}")
    if "training_metadata" in info:
        lines.append("note:        this is an onnxtrain training/eval model; run `onnxtrain info` on its folder")
    return lines


def add_parser(sub) -> None:
    p = sub.add_parser("info", help="describe an artifact folder, an ONNX model or a checkpoint",
                       description=__doc__)
    p.add_argument("path", metavar="DIR|MODEL|CHECKPOINT")
    p.add_argument("--prefix", default="", help="the file-name prefix given to generate")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(run=run)


def checkpoint_info(path: str) -> dict:
    from onnxtrain.checkpoint import load_checkpoint

    ckpt = load_checkpoint(path)
    info = {"kind": "checkpoint", "path": path, "step": ckpt.step, "nominal": ckpt.nominal,
            "properties": dict(ckpt.properties), "size_bytes": os.path.getsize(path)}
    if not ckpt.nominal:
        info.update(trainable=_tensors(ckpt.trainable), frozen=_tensors(ckpt.frozen), buffers=_tensors(ckpt.buffers),
                    optimizer_states=sorted({s for states in ckpt.optimizer.values() for s in states}))
    return info


def _checkpoint_lines(info: dict) -> list[str]:
    lines = [f"checkpoint:  {info['path']} ({human_bytes(info['size_bytes'])}), step {info['step']}"
             + (" (nominal)" if info["nominal"] else "")]
    if not info["nominal"]:
        total = sum(info[r]["elements"] for r in ("trainable", "frozen", "buffers"))
        for role in ("trainable", "frozen", "buffers"):
            lines.append(_params_line(role, info[role], total))
        if info["optimizer_states"]:
            lines.append(f"optimizer:   states {', '.join(info['optimizer_states'])}")
    for key, value in info["properties"].items():
        lines.append(f"property:    {key} = {value}")
    return lines


def run(args: argparse.Namespace) -> int:
    path = args.path
    if not os.path.exists(path):
        raise FileNotFoundError(f"not found: {path}")
    if os.path.isdir(path):
        info = artifact_info(path, args.prefix)
        lines = [f"artifacts:   {path}"] + _artifact_lines(info)
    elif path.endswith(".ort"):
        raise CliError(f"{path} is in ORT format, which onnxtrain cannot inspect; run info on the .onnx file")
    elif path.endswith(".onnx"):
        info = model_info(path)
        lines = _model_lines(info)
    else:
        with open(path, "rb") as f:
            head = f.read(16)
        if len(head) >= 9 and head[8:9] == b"{":  # safetensors: 8-byte header length, then JSON
            info = checkpoint_info(path)
            lines = _checkpoint_lines(info)
        else:
            try:
                info = model_info(path)
            except CliError:
                raise CliError(f"{path} is neither an ONNX model nor an onnxtrain checkpoint") from None
            lines = _model_lines(info)
    if args.json:
        print(json.dumps(info, indent=2, default=str))
    else:
        print("\n".join(lines))
    return 0
