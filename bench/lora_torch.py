"""LoRA vs full fine-tuning step time in PyTorch + Hugging Face PEFT, on the model and workload of bench/lora.py:
an independent data point for the ratio onnxtrain measures there (issue 17's target: a LoRA step <= 0.6x the full
fine-tuning step).

    python bench/lora_torch.py [--threads 2] [--rounds 8] [--steps 4] [--out bench/results/lora_torch.json]

The model is ``export()``'s in bench/lora.py: a random BertForSequenceClassification (6 layers, hidden 384, 12
heads, intermediate 1536, vocab 30522, 2 labels, dropout 0, ``torch.manual_seed(0)``), batch 8, sequence 128,
one fixed batch (numpy ``default_rng(0)``, as bench/lora.py trains on). Two setups in one process, from the same
weights: *full* fine-tuning (every parameter trainable, ``torch.optim.AdamW``) and *LoRA* (``peft.get_peft_model``
on a copy, ``LoraConfig(r=8, lora_alpha=16, target_modules=["query", "value"], lora_dropout=0.0,
modules_to_save=["classifier"])``, AdamW over the trainable parameters). AdamW with torch's defaults (lr 1e-3; on
CPU the per-tensor loop, as a user gets it). A step is forward + cross-entropy loss + backward +
``optimizer.step()`` + ``zero_grad(set_to_none=True)``.

After 2 warm-up steps of each, full and LoRA rounds of ``--steps`` steps alternate for ``--rounds`` rounds (the
order flips every round), so both see the same load on a shared machine. Per step: wall time
(``time.perf_counter``) and this process's CPU time (``time.process_time``, every thread: with 2 threads it
includes OpenMP's spin-waiting). Reported: the median step of each, the ratio of the medians (wall and CPU), the
range of the per-round ratios (median LoRA step of a round / median full step of the same round pair), and the
wall time split into forward+loss, backward and optimizer+zero_grad. Not a test: timings are under load.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
import types

BATCH, SEQ, VOCAB, CLASSES = 8, 128, 30522, 2

# torchvision here is a CUDA build beside the CPU torch: importing transformers (or peft) imports torchvision, whose
# meta registrations then fail ("operator torchvision::nms does not exist"). Nothing here needs them.
sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations"))


def build():
    """The random BertForSequenceClassification of bench/lora.py's ``export()``, in training mode."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(vocab_size=VOCAB, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                        intermediate_size=1536, max_position_embeddings=512, num_labels=CLASSES,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    return BertForSequenceClassification(config).train()


def batch():
    """bench/lora.py's training batch: ids and labels from numpy's ``default_rng(0)``."""
    import numpy as np
    import torch

    rng = np.random.default_rng(0)
    ids = rng.integers(0, VOCAB, (BATCH, SEQ)).astype(np.int64)
    labels = rng.integers(0, CLASSES, BATCH).astype(np.int64)
    return torch.from_numpy(ids), torch.from_numpy(labels)


def setups():
    """``{"full": (model, optimizer), "lora": (peft model, optimizer)}`` and their trainable parameter counts."""
    import torch
    from peft import LoraConfig, get_peft_model

    full = build()
    lora = get_peft_model(copy.deepcopy(full), LoraConfig(r=8, lora_alpha=16, target_modules=["query", "value"],
                                                          lora_dropout=0.0, modules_to_save=["classifier"]))
    lora.train()
    runs, trainable = {}, {}
    for name, model in (("full", full), ("lora", lora)):
        params = [p for p in model.parameters() if p.requires_grad]
        runs[name] = (model, torch.optim.AdamW(params))
        trainable[name] = sum(p.numel() for p in params)
    return runs, trainable


def step(model, optimizer, ids, labels) -> tuple[float, float, float, float, float, float]:
    """One training step: (wall s, CPU s, forward+loss wall s, backward wall s, optimizer+reset wall s, loss)."""
    import torch.nn.functional as F

    t0, c0 = time.perf_counter(), time.process_time()
    loss = F.cross_entropy(model(input_ids=ids).logits, labels)
    t1 = time.perf_counter()
    loss.backward()
    t2 = time.perf_counter()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    t3, c3 = time.perf_counter(), time.process_time()
    return t3 - t0, c3 - c0, t1 - t0, t2 - t1, t3 - t2, float(loss.detach())


def run(threads: int, rounds: int, steps: int) -> dict:
    import peft
    import torch
    import transformers

    torch.set_num_threads(threads)
    load_before = os.getloadavg()
    runs, trainable = setups()
    ids, labels = batch()
    names = ("full", "lora")
    times: dict[str, dict[str, list[float]]] = {
        n: {k: [] for k in ("wall", "cpu", "forward", "backward", "optimizer")} for n in names}
    losses: dict[str, list[float]] = {n: [] for n in names}
    per_round: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    for n in names:  # warm-up
        for _ in range(2):
            losses[n].append(round(step(*runs[n], ids, labels)[-1], 4))
    for r in range(rounds):
        for n in names if r % 2 == 0 else reversed(names):
            wall, cpu = [], []
            for _ in range(steps):
                w, c, f, b, o, loss = step(*runs[n], ids, labels)
                wall.append(w)
                cpu.append(c)
                for k, v in zip(("wall", "cpu", "forward", "backward", "optimizer"), (w, c, f, b, o)):
                    times[n][k].append(v)
                losses[n].append(round(loss, 4))
            per_round[n].append({"wall": statistics.median(wall), "cpu": statistics.median(cpu)})
    load_after = os.getloadavg()

    def ms(values: list[float]) -> float:
        return round(1e3 * statistics.median(values), 1)

    out: dict = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "threads": threads, "rounds": rounds,
                 "steps_per_round": steps, "batch": BATCH, "seq": SEQ, "load_avg_before": load_before,
                 "load_avg_after": load_after, "torch": torch.__version__, "transformers": transformers.__version__,
                 "peft": peft.__version__}
    for n in names:
        out[n] = {"trainable_params": trainable[n], "step_ms": ms(times[n]["wall"]),
                  "step_cpu_ms": ms(times[n]["cpu"]), "forward_ms": ms(times[n]["forward"]),
                  "backward_ms": ms(times[n]["backward"]), "optimizer_ms": ms(times[n]["optimizer"]),
                  "step_ms_each": [round(1e3 * v, 1) for v in times[n]["wall"]],
                  "step_cpu_ms_each": [round(1e3 * v, 1) for v in times[n]["cpu"]], "losses": losses[n]}
    full_wall, full_cpu = statistics.median(times["full"]["wall"]), statistics.median(times["full"]["cpu"])
    out["ratio_wall"] = round(statistics.median(times["lora"]["wall"]) / full_wall, 3)
    out["ratio_cpu"] = round(statistics.median(times["lora"]["cpu"]) / full_cpu, 3)
    out["ratio_wall_per_round"] = [round(a["wall"] / b["wall"], 3) for a, b in zip(per_round["lora"],
                                                                                    per_round["full"])]
    out["ratio_cpu_per_round"] = [round(a["cpu"] / b["cpu"], 3) for a, b in zip(per_round["lora"], per_round["full"])]
    return out


def table(r: dict) -> str:
    wall, cpu = r["ratio_wall_per_round"], r["ratio_cpu_per_round"]
    lines = [f"PyTorch {r['torch']} + PEFT {r['peft']}, {r['threads']} thread(s), {r['rounds']} rounds x "
             f"{r['steps_per_round']} steps, load {r['load_avg_before'][0]:.2f} -> {r['load_avg_after'][0]:.2f}",
             f"{'':6} {'trainable':>11} {'step ms':>8} {'CPU ms':>8} {'fwd ms':>7} {'bwd ms':>7} {'opt ms':>7}"]
    for n in ("full", "lora"):
        x = r[n]
        lines.append(f"{n:6} {x['trainable_params']:>11,} {x['step_ms']:>8.1f} {x['step_cpu_ms']:>8.1f} "
                     f"{x['forward_ms']:>7.1f} {x['backward_ms']:>7.1f} {x['optimizer_ms']:>7.1f}")
    lines.append(f"LoRA / full: wall {r['ratio_wall']:.3f}x (rounds {min(wall):.3f}-{max(wall):.3f}x, median "
                 f"{statistics.median(wall):.3f}x), CPU {r['ratio_cpu']:.3f}x (rounds {min(cpu):.3f}-{max(cpu):.3f}x,"
                 f" median {statistics.median(cpu):.3f}x)")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    p.add_argument("--rounds", type=int, default=8, help="rounds of each setup, alternating")
    p.add_argument("--steps", type=int, default=4, help="timed steps per round")
    p.add_argument("--out", default="", help="write the record (JSON) here")
    args = p.parse_args()
    record = run(args.threads, args.rounds, args.steps)
    print(table(record))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
