"""LoRA vs full fine-tuning on a BERT (6 layers, hidden 384, 12 heads, intermediate 1536, vocab 30522), batch 8,
sequence 128: trainable parameters, training step time, peak RSS and checkpoint size.

    python bench/lora.py [--steps 6] [--rounds 8] [--threads 2] [--out bench/results/lora.json]

Random weights (nothing is downloaded). The torch export runs once; then every measurement runs in a process of
its own that imports only onnxtrain's runtime (no torch), so its peak RSS (VmHWM) is the runtime's: ``base`` runs
the forward model in an ``onnxruntime.InferenceSession`` (``base_nopattern``: with ``enable_mem_pattern=False``
and ``enable_mem_reuse=False``, as onnxtrain's sessions run); ``generate-X`` writes the artifacts and ``train-X``
trains them, for ``full`` (every weight) and ``lora`` (rank-8 adapters on query/value plus the classifier;
``lora_constants``: the same with ``LoRA(freeze_base=False)``; ``lora_dynamic``: the same on the model exported
with a dynamic batch axis, as exporters usually write it); ``arena-lora`` trains ``lora`` with onnxruntime's
profiler on, which reports per node the bytes its arena has in use and holds: their peaks are the activations
alone. The step is forward + backward + AdamW + gradient
reset, the median of ``--steps`` after 2 warm-up steps. ``interleaved`` loads ``full`` and ``lora`` in one
process and alternates their steps for ``--rounds`` rounds, so that both see the same load on a shared machine:
the step-time ratio comes from there (wall and CPU time). Not a test: timings are under load.
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


def export(path: str, dynamic_batch: bool = False) -> None:
    """The torch export (TorchScript exporter) of a random BertForSequenceClassification (batch axis fixed, or
    dynamic)."""
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
                          opset_version=17, dynamic_axes={"input_ids": {0: "batch"}} if dynamic_batch else None)


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
    if mode.startswith("base"):
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
        so.enable_mem_pattern = so.enable_mem_reuse = mode != "base_nopattern"
        session = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
        times = []
        for _ in range(steps + 2):
            t = time.perf_counter()
            session.run(None, {"input_ids": x})
            times.append(time.perf_counter() - t)
        out.update(forward_ms=1e3 * float(np.median(times[2:])), peak_rss_mb=_peak_mb())
        return out
    kind, _, what = mode.partition("-")
    directory = os.path.join(workdir, what)
    if kind == "generate":
        from onnxtrain.artifacts import LoRA, LossType, OptimType, generate_artifacts

        t = time.perf_counter()
        lora = None  # lora: the base weights frozen in the checkpoint; lora_constants: constants of the graphs
        if what.startswith("lora"):
            lora = LoRA(rank=8, alpha=16, targets=["*query*", "*value*"], freeze_base=what != "lora_constants")
        paths = generate_artifacts(model, requires_grad=["classifier.*"] if lora else None,
                                   loss=LossType.CrossEntropyLoss, optimizer=OptimType.AdamW,
                                   artifact_directory=directory, lora=lora)
        out.update(generate_s=time.perf_counter() - t, generate_peak_rss_mb=_peak_mb(),
                   checkpoint_mb=os.path.getsize(paths["checkpoint"]) / 2**20,
                   artifacts_mb=sum(os.path.getsize(p) for p in paths.values()) / 2**20)
        return out
    if kind == "interleaved":
        return _interleaved(workdir, ["full", "lora"], x, y, steps, threads)
    if kind == "arena":
        return {**out, **_arena(os.path.join(workdir, what), x, y, threads)}
    module, optimizer, out["trainable_params"] = _load(os.path.join(workdir, what), threads)
    times, cpu, losses = [], [], []
    for _ in range(steps + 2):
        wall, used, loss = _step(module, optimizer, x, y)
        times.append(wall)
        cpu.append(used)
        losses.append(loss)
    out.update(step_ms=1e3 * float(np.median(times[2:])), step_cpu_ms=1e3 * float(np.median(cpu[2:])),
               step_ms_each=[round(1e3 * s, 1) for s in times], losses=[round(v, 4) for v in losses],
               peak_rss_mb=_peak_mb())
    return out


def _arena(directory: str, x, y, threads: int) -> dict:
    """onnxruntime's own account of its arena at the step's peak, from its profiler (per node: bytes in use,
    bytes the arena holds): the activations alone, without the imports, weights and sessions in the RSS."""
    import gc
    import glob

    prefix = os.path.join(directory, "arena_profile")
    module, optimizer, _ = _load(directory, threads, profile=prefix)
    for _ in range(3):
        _step(module, optimizer, x, y)
    del module, optimizer
    gc.collect()  # the sessions write their profiles when they close
    in_use = held = 0
    for path in glob.glob(prefix + "*.json"):
        with open(path) as f:
            for event in json.load(f):
                args = event.get("args", {})
                in_use = max(in_use, int(args.get("mem_bytes_in_use", 0)))
                held = max(held, int(args.get("mem_arena_held", 0)))
        os.remove(path)
    return {"arena_in_use_mb": in_use / 2**20, "arena_held_mb": held / 2**20}


def _load(directory: str, threads: int, profile: str | None = None):
    import onnxruntime as ort

    from onnxtrain.api import CheckpointState, Module, Optimizer

    paths = {k: os.path.join(directory, f"{k}_model.onnx") for k in ("training", "eval", "optimizer")}
    state = CheckpointState.load_checkpoint(os.path.join(directory, "checkpoint"))
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    if profile:
        so.enable_profiling, so.profile_file_prefix = True, profile
    module = Module(paths["training"], state, paths["eval"], session_options=so)
    module.train()
    trainable = int(sum(p.data.size for _, p in state.parameters if p.requires_grad))
    return module, Optimizer(paths["optimizer"], module), trainable


def _step(module, optimizer, x, y) -> tuple[float, float, float]:
    """One training step: (wall seconds, this process's CPU seconds, loss)."""
    t, c = time.perf_counter(), time.process_time()
    loss = float(module(x, y))  # the loss alone: no additional outputs
    optimizer.step()
    module.lazy_reset_grad()
    return time.perf_counter() - t, time.process_time() - c, loss


def _interleaved(workdir: str, what: list[str], x, y, rounds: int, threads: int) -> dict:
    """Load every variant in this process, then run one step of each in turn, ``rounds`` times after 2 warm-up
    rounds: per variant the median wall and CPU time, and per round the ratio of each to the first."""
    import numpy as np

    runs = {w: _load(os.path.join(workdir, w), threads) for w in what}
    wall: dict[str, list[float]] = {w: [] for w in what}
    cpu: dict[str, list[float]] = {w: [] for w in what}
    for r in range(rounds + 2):
        for w in what if r % 2 else reversed(what):  # alternate the order: neither always follows the other
            t, c, _ = _step(*runs[w][:2], x, y)
            if r >= 2:
                wall[w].append(t)
                cpu[w].append(c)
    first = what[0]
    return {"mode": "interleaved", "rounds": rounds, **{w: {
        "step_ms": 1e3 * float(np.median(wall[w])), "step_cpu_ms": 1e3 * float(np.median(cpu[w])),
        "ratio_per_round": [round(a / b, 3) for a, b in zip(wall[w], wall[first])],
        "cpu_ratio_per_round": [round(a / b, 3) for a, b in zip(cpu[w], cpu[first])]} for w in what}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--rounds", type=int, default=8, help="rounds of the interleaved full/LoRA timing")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=os.path.join(HERE, "results", "lora.json"))
    p.add_argument("--markdown", default=os.path.join(os.path.dirname(HERE), "BENCHMARKS.md"),
                   help="the file whose LoRA section to update (empty: none)")
    p.add_argument("--child", nargs=3, metavar=("MODE", "MODEL", "WORKDIR"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        steps = args.rounds if args.child[0] == "interleaved" else args.steps
        print(json.dumps(measure(*args.child, steps=steps, threads=args.threads)))
        return
    with tempfile.TemporaryDirectory(prefix="onnxtrain_lora_") as workdir:
        model, dynamic = os.path.join(workdir, "bert.onnx"), os.path.join(workdir, "bert_dynamic.onnx")
        export(model)
        export(dynamic, dynamic_batch=True)
        results = []
        for mode in ("base", "base_nopattern", "generate-lora", "train-lora", "generate-full", "train-full",
                     "generate-lora_constants", "train-lora_constants", "generate-lora_dynamic",
                     "train-lora_dynamic", "arena-lora", "interleaved"):
            env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
            proc = subprocess.run([sys.executable, __file__, "--steps", str(args.steps), "--rounds", str(args.rounds),
                                   "--threads", str(args.threads), "--child", mode,
                                   dynamic if mode.endswith("_dynamic") else model, workdir],
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
    base, base_np = r["base"]["peak_rss_mb"], r["base_nopattern"]["peak_rss_mb"]
    inter = r["interleaved"]
    rows = []
    for what, label in (("full", "full fine-tuning"), ("lora", "LoRA r=8 query/value + classifier"),
                        ("lora_constants", "same, base weights as graph constants (freeze_base=False)"),
                        ("lora_dynamic", "same as LoRA, model exported with a dynamic batch axis")):
        if f"train-{what}" not in r:  # a record from before the variant existed
            continue
        gen, train = r[f"generate-{what}"], r[f"train-{what}"]
        if what in inter:
            ratios = sorted(inter[what]["ratio_per_round"])
            spread = f"; rounds {ratios[0]:.2f}-{ratios[-1]:.2f}x" if what != "full" else ""
            step = (f"{inter[what]['step_ms']:.0f} ({inter[what]['step_ms'] / inter['full']['step_ms']:.2f}x"
                    f"{spread}) | {inter[what]['step_cpu_ms']:.0f} "
                    f"({inter[what]['step_cpu_ms'] / inter['full']['step_cpu_ms']:.2f}x)")
        else:
            step = (f"{train['step_ms']:.0f} alone ({train['step_ms'] / r['train-full']['step_ms']:.2f}x of full "
                    f"alone) | {train['step_cpu_ms']:.0f} alone")
        rows.append(f"| {label} | {train['trainable_params']:,} | {step} | "
                    f"{train['peak_rss_mb']:.0f} (+{100 * (train['peak_rss_mb'] / base - 1):.0f} % / "
                    f"+{100 * (train['peak_rss_mb'] / base_np - 1):.0f} %) | "
                    f"{gen['checkpoint_mb']:.2f} | {gen['artifacts_mb']:.0f} | {gen['generate_s']:.1f} | "
                    f"{train['losses'][0]:.3f} -> {train['losses'][-1]:.3f} |")
    load = ", ".join(f"{v:.1f}" for v in record["load_avg"])
    arena = ""
    if "arena-lora" in r:  # records from before the mode existed have none
        peak = r["arena-lora"]
        arena = (f" onnxruntime's arena at the LoRA step's peak (its profiler): {peak['arena_in_use_mb']:.1f} MB in "
                 f"use, {peak['arena_held_mb']:.1f} MB held.")
    return "\n".join([
        BEGIN,
        "## LoRA vs full fine-tuning",
        "",
        f"`python bench/lora.py` ({record['date']}): a random BertForSequenceClassification (6 layers, hidden 384, "
        f"12 heads, intermediate 1536, vocab 30522, 2 classes) exported by torch, batch {record['batch']}, "
        f"sequence {record['seq']}, AdamW, 2 threads. Step = forward + backward + optimizer + gradient reset. "
        f"Step times: full and LoRA loaded in one process, their steps alternating, median of {inter['rounds']} "
        "rounds after 2 warm-up rounds (both see the same load); the range is the per-round ratio; CPU ms is the "
        "process's CPU time per step. Peak RSS = VmHWM of a process that trains one variant alone (no torch "
        f"imported), against the base model's forward in an InferenceSession: {base:.0f} MB with onnxruntime's "
        f"defaults / {base_np:.0f} MB with `enable_mem_pattern=False` and `enable_mem_reuse=False` as onnxtrain "
        "runs its sessions "
        f"({r['base']['forward_ms']:.0f} ms).{arena} **Timings under load**: the 2-core machine was shared with other "
        f"agents (load average {load} at the end). Targets: step <= 0.6x full fine-tuning, peak RSS <= base "
        "model + 30 %.",
        "",
        "| what trains | trainable parameters | step ms (/ full) | CPU ms per step (/ full) "
        "| peak RSS MB (vs base / base without memory pattern) | checkpoint MB | artifacts MB | generate s "
        "| loss, 8 steps |",
        "|---|---|---|---|---|---|---|---|---|",
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
