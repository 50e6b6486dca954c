"""LoRA vs full fine-tuning on a BERT (6 layers, hidden 384, 12 heads, intermediate 1536, vocab 30522), batch 8,
sequence 128: trainable parameters, training step time, peak RSS and checkpoint size.

    python bench/lora.py [--steps 6] [--threads 2] [--out bench/results/lora.json]

Random weights (nothing is downloaded). The torch export runs once; then every measurement runs in a process
of its own that imports only onnxtrain's runtime (no torch), so its peak RSS (``ru_maxrss``) is the runtime's:
``base`` runs the forward model in an ``onnxruntime.InferenceSession``, ``full`` trains every weight, ``lora``
trains rank-8 adapters on query/value plus the classifier. The step is forward + backward + AdamW + gradient
reset, the median of ``--steps`` after 2 warm-up steps. Not a test: the machine is shared, timings are under load.
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
    from onnxtrain.artifacts import LoRA, LossType, OptimType, generate_artifacts

    t = time.perf_counter()
    lora = LoRA(rank=8, alpha=16, targets=["*query*", "*value*"]) if mode == "lora" else None
    paths = generate_artifacts(model, requires_grad=["classifier.*"] if lora else None,
                               loss=LossType.CrossEntropyLoss, optimizer=OptimType.AdamW,
                               artifact_directory=os.path.join(workdir, mode), lora=lora)
    out["generate_s"] = time.perf_counter() - t
    out["checkpoint_mb"] = os.path.getsize(paths["checkpoint"]) / 2**20
    out["artifacts_mb"] = sum(os.path.getsize(p) for p in paths.values()) / 2**20
    gen_peak = _peak_mb()
    state = CheckpointState.load_checkpoint(paths["checkpoint"])
    out["trainable_params"] = int(sum(p.data.size for _, p in state.parameters if p.requires_grad))
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    module = Module(paths["training"], state, paths["eval"], session_options=so)
    optimizer = Optimizer(paths["optimizer"], module)
    module.train()
    times, losses = [], []
    for _ in range(steps + 2):
        t = time.perf_counter()
        losses.append(float(module(x, y)[0]))
        optimizer.step()
        module.lazy_reset_grad()
        times.append(time.perf_counter() - t)
    out.update(step_ms=1e3 * float(np.median(times[2:])), step_ms_each=[round(1e3 * s, 1) for s in times],
               losses=[round(v, 4) for v in losses], peak_rss_mb=_peak_mb(), generate_peak_rss_mb=gen_peak)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=os.path.join(HERE, "results", "lora.json"))
    p.add_argument("--child", nargs=3, metavar=("MODE", "MODEL", "WORKDIR"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(measure(*args.child, steps=args.steps, threads=args.threads)))
        return
    with tempfile.TemporaryDirectory(prefix="onnxtrain_lora_") as workdir:
        model = os.path.join(workdir, "bert.onnx")
        export(model)
        results = []
        for mode in ("base", "lora", "full"):
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


if __name__ == "__main__":
    main()
