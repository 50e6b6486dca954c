"""LoRA vs full fine-tuning on a BERT (6 layers, hidden 384, 12 heads, intermediate 1536, vocab 30522), batch 8,
sequence 128: trainable parameters, training step time, peak RSS and checkpoint size.

    python bench/lora.py [--steps 6] [--threads 2] [--out bench/results/lora.json]

Random weights (nothing is downloaded). The torch export runs once; then every measurement runs in a process
of its own that imports only onnxtrain's runtime (no torch), so its peak RSS (VmHWM) is the runtime's:
``base`` runs the forward model in an ``onnxruntime.InferenceSession``; ``generate-X`` writes the artifacts and
``train-X`` trains them, for ``full`` (every weight) and ``lora`` (rank-8 adapters on query/value plus the
classifier; ``lora_constants``: the same with ``LoRA(freeze_base=False)``; ``X_nopattern``: trains X's artifacts
with onnxruntime's memory patterns off). The step is forward + backward +
AdamW + gradient reset, the median of ``--steps`` after 2 warm-up steps. Not a test: the machine is shared,
timings are under load.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

BATCH, SEQ, VOCAB, CLASSES = 8, 128, 30522, 2
HERE = os.path.dirname(os.path.abspath(__file__))


def export(path: str) -> None:
    """The torch export (TorchScript exporter) of a random BertForSequenceClassification."""
    import types
    import warnings

    sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations"))
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(vocab_size=VOCAB, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                        intermediate_size=1536, max_position_embeddings=512, num_labels=CLASSES,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    model = BertForSequenceClassification(config).eval()
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (ids,), path, input_names=["input_ids"], output_names=["logits"], dynamo=False,
                          opset_version=17)


def _batch():
    import numpy as np

    rng = np.random.default_rng(0)
    return rng.integers(0, VOCAB, (BATCH, SEQ)).astype(np.int64), rng.integers(0, CLASSES, BATCH).astype(np.int64)


def _peak_mb() -> float:
    """This process's peak RSS (VmHWM). Not ``ru_maxrss``: Linux carries that across fork + exec, so a child
    would report the parent's peak (the torch export's) when it is higher."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(mode: str, model: str, workdir: str, steps: int, threads: int) -> dict:
    """One mode, in this process (which must not import torch)."""
    import numpy as np
    import onnxruntime as ort

    x, y = _batch()
    out: dict = {"mode": mode}
    if mode == "base":
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
        session = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
        times = []
        for _ in range(steps + 2):
            t = time.perf_counter()
            session.run(None, {"input_ids": x})
            times.append(time.perf_counter() - t)
        out.update(forward_ms=1e3 * float(np.median(times[2:])), peak_rss_mb=_peak_mb())
        return out
    from onnxtrain.api import CheckpointState, Module, Optimizer

    kind, _, what = mode.partition("-")
    directory = os.path.join(workdir, what)
    if kind == "generate":
        from onnxtrain.artifacts import LoRA, LossType, OptimType, generate_artifacts

        t = time.perf_counter()
        lora = None  # lora: the base weights frozen in the checkpoint; lora_constants: constants of the graphs
        if what.startswith("lora"):
            lora = LoRA(rank=8, alpha=16, targets=["*query*", "*value*"], freeze_base=what == "lora")
        paths = generate_artifacts(model, requires_grad=["classifier.*"] if lora else None,
                                   loss=LossType.CrossEntropyLoss, optimizer=OptimType.AdamW,
                                   artifact_directory=directory, lora=lora)
        out.update(generate_s=time.perf_counter() - t, generate_peak_rss_mb=_peak_mb(),
                   checkpoint_mb=os.path.getsize(paths["checkpoint"]) / 2**20,
                   artifacts_mb=sum(os.path.getsize(p) for p in paths.values()) / 2**20)
        return out
    no_pattern = what.endswith("_nopattern")  # onnxruntime's memory patterns off: less memory, slower steps
    directory = directory.removesuffix("_nopattern")
    paths = {k: os.path.join(directory, f"{k}_model.onnx") for k in ("training", "eval", "optimizer")}
    state = CheckpointState.load_checkpoint(os.path.join(directory, "checkpoint"))
    out["trainable_params"] = int(sum(p.data.size for _, p in state.parameters if p.requires_grad))
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    so.enable_mem_pattern = not no_pattern
    module = Module(paths["training"], state, paths["eval"], session_options=so)
    optimizer = Optimizer(paths["optimizer"], module)
    module.train()
    times, losses = [], []
    for _ in range(steps + 2):
        t = time.perf_counter()
        loss = module(x, y)  # the loss alone: no additional outputs
        losses.append(float(loss))
        optimizer.step()
        module.lazy_reset_grad()
        times.append(time.perf_counter() - t)
    out.update(step_ms=1e3 * float(np.median(times[2:])), step_ms_each=[round(1e3 * s, 1) for s in times],
               losses=[round(v, 4) for v in losses], peak_rss_mb=_peak_mb())
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=os.path.join(HERE, "results", "lora.json"))
    p.add_argument("--markdown", default=os.path.join(os.path.dirname(HERE), "BENCHMARKS.md"),
                   help="the file whose LoRA section to update (empty: none)")
    p.add_argument("--child", nargs=3, metavar=("MODE", "MODEL", "WORKDIR"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(measure(*args.child, steps=args.steps, threads=args.threads)))
        return
    with tempfile.TemporaryDirectory(prefix="onnxtrain_lora_") as workdir:
        model = os.path.join(workdir, "bert.onnx")
        export(model)
        results = []
        for mode in ("base", "generate-lora", "train-lora", "generate-full", "train-full", "generate-lora_constants",
                     "train-lora_constants", "train-lora_nopattern", "train-full_nopattern"):
            env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
            proc = subprocess.run([sys.executable, __file__, "--steps", str(args.steps), "--threads",
                                   str(args.threads), "--child", mode, model, workdir],
                                  capture_output=True, text=True, env=env, check=False)
            if proc.returncode:
                raise SystemExit(f"{mode} failed:\n{proc.stderr[-3000:]}")
            results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            print(json.dumps(results[-1]), flush=True)
        load = os.getloadavg()
    record = {"date": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()), "load_avg": load, "batch": BATCH,
              "seq": SEQ, "results": results}
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)
    print(f"wrote {args.out}")
    if args.markdown:
        put_section(args.markdown, table(record))
        print(f"updated the LoRA section of {args.markdown}")


BEGIN, END = "<!-- lora:begin (bench/lora.py) -->", "<!-- lora:end -->"


def table(record: dict) -> str:
    """The markdown section for BENCHMARKS.md."""
    r = {x["mode"]: x for x in record["results"]}
    base = r["base"]["peak_rss_mb"]
    rows = []
    for what, label in (("full", "full fine-tuning"), ("lora", "LoRA r=8 query/value + classifier"),
                        ("lora_constants", "same, base weights as graph constants (freeze_base=False)"),
                        ("full_nopattern", "full fine-tuning, `enable_mem_pattern=False`"),
                        ("lora_nopattern", "LoRA, `enable_mem_pattern=False`")):
        gen, train = r.get(f"generate-{what.removesuffix('_nopattern')}"), r.get(f"train-{what}")
        if not (gen and train):
            continue
        ratio = train["step_ms"] / r["train-full"]["step_ms"]
        rows.append(f"| {label} | {train['trainable_params']:,} | {train['step_ms']:.0f} ({ratio:.2f}x) | "
                    f"{train['peak_rss_mb']:.0f} (+{100 * (train['peak_rss_mb'] / base - 1):.0f} %) | "
                    f"{gen['checkpoint_mb']:.2f} | {gen['artifacts_mb']:.0f} | {gen['generate_s']:.1f} | "
                    f"{train['losses'][0]:.3f} -> {train['losses'][-1]:.3f} |")
    load = ", ".join(f"{v:.1f}" for v in record["load_avg"])
    return "\n".join([
        BEGIN,
        "## LoRA vs full fine-tuning",
        "",
        f"`python bench/lora.py` ({record['date']}): a random BertForSequenceClassification (6 layers, hidden 384, "
        f"12 heads, intermediate 1536, vocab 30522, 2 classes) exported by torch, batch {record['batch']}, "
        f"sequence {record['seq']}, AdamW, 2 threads. Step = forward + backward + optimizer + gradient reset, "
        "median of 6 after 2 warm-up steps; peak RSS = VmHWM of the training process (no torch imported), "
        f"against {base:.0f} MB for the base model's forward in an InferenceSession "
        f"({r['base']['forward_ms']:.0f} ms). **Timings under load**: the 2-core machine was shared with other "
        f"agents (load average {load} at the end), so only ratios within this run mean anything. Targets: "
        "step <= 0.6x full fine-tuning, peak RSS <= base model + 30 %.",
        "",
        "| what trains | trainable parameters | step ms (/ full) | peak RSS MB (vs base) | checkpoint MB "
        "| artifacts MB | generate s | loss, 8 steps |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
        END,
    ]) + "\n"


def put_section(path: str, section: str) -> None:
    """Replace the LoRA section of ``path`` (or append it); bench/report.py keeps it when it rewrites the file."""
    text = open(path).read() if os.path.exists(path) else ""
    if BEGIN in text and END in text:
        text = text[:text.index(BEGIN)] + section + text[text.index(END) + len(END) + 1:]
    else:
        text = text.rstrip("\n") + "\n\n" + section
    with open(path, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
