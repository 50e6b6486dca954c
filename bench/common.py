# From /work/shared/bench/common.py (the reference harness); adapted for onnxtrain's bench/.
"""Framework-free parts of the benchmark: workload specs, fixed data, timing, the JSON line.

Only numpy is imported at module level, so a runner can measure its own memory without paying for torch.
An implementation plugs in with:

    from common import run
    def setup(args, rec):            # build/load everything, fill rec (gen_seconds, artifact_bytes, ...)
        ...
        return train_step, eval_step  # callables returning the loss as a float
    run("myimpl", setup)

The peer and onnxtrain share the rest: `generate_in_child` (artifacts made in a spawned process, so
the training process never pays for the exporter) and `load_training` (the onnxruntime.training.api
calls, which onnxtrain.api mirrors).
"""

import argparse
import concurrent.futures
import json
import multiprocessing
import os
import resource
import statistics
import sys
import time
import traceback

import numpy as np

__all__ = ["ADAMW", "SPECS", "make_batch", "peak_rss_mb", "error_text", "run", "emit", "generate_in_child",
           "session_options", "load_training"]

# Same math on every side: ORT's OptimType.AdamW defaults (onnxblock.optim.AdamW) with lr 1e-3.
ADAMW = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0)

# input: per-sample shape; vocab: integer token input; steps: default timed steps (after warmup).
SPECS = {
    "mlp": dict(input=(784,), batch=64, classes=10, steps=50),
    "lenet": dict(input=(1, 28, 28), batch=64, classes=10, steps=50),
    "mobilenetv2": dict(input=(3, 96, 96), batch=16, classes=10, steps=50),
    "mobilenetv2_head": dict(input=(3, 96, 96), batch=16, classes=10, steps=50, head_only=True),
    "transformer": dict(input=(64,), batch=16, classes=2, vocab=1000, steps=50),
    # Real scale (issue 14): a transformers BERT (6 layers, 384 wide, 22.7M parameters) and a ResNet-18 (11.2M).
    "bert_small": dict(input=(128,), batch=8, classes=2, vocab=30522, steps=20),
    "bert_small_head": dict(input=(128,), batch=8, classes=2, vocab=30522, steps=20, head_only=True),
    # issue 14's own table (sequence 32); for profile_ops.py and --workloads, not in run.py's default list
    "bert_small_seq32": dict(input=(32,), batch=8, classes=2, vocab=30522, steps=20),
    # BERT-base's shape (12 layers, 768 wide, 109.5M parameters): for --workloads, not in run.py's default list
    "bert_base": dict(input=(128,), batch=8, classes=2, vocab=30522, steps=10),
    "resnet18": dict(input=(3, 224, 224), batch=8, classes=10, steps=20),
    "resnet18_head": dict(input=(3, 224, 224), batch=8, classes=10, steps=20, head_only=True),
}
MIN_STEPS = 10  # the time budget never cuts the timed loop below this


def make_batch(name):
    """One fixed batch (numpy seed 0): float32 inputs or int64 token ids, int64 labels."""
    s = SPECS[name]
    rng = np.random.default_rng(0)
    shape = (s["batch"], *s["input"])
    if "vocab" in s:
        x = rng.integers(0, s["vocab"], size=shape, dtype=np.int64)
    else:
        x = rng.standard_normal(shape, dtype=np.float32)
    y = rng.integers(0, s["classes"], size=s["batch"], dtype=np.int64)
    return x, y


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def error_text(exc):
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def _timed(fn, n, budget_s=None, min_s=0.0):
    """Run fn n times (or, with a budget, stop early once budget_s passed and MIN_STEPS were done); keep going
    past n until min_s seconds passed (up to 20 n), so that millisecond steps get a long enough window."""
    values, ms = [], []
    start = time.perf_counter()
    i = 0
    while i < n or (time.perf_counter() - start < min_s and i < 20 * n):
        t = time.perf_counter()
        values.append(fn())
        ms.append((t2 := time.perf_counter()) - t)
        i += 1
        if budget_s is not None and i >= MIN_STEPS and t2 - start > budget_s:
            break
    return values, [x * 1e3 for x in ms]


def _pct(xs, q):
    return float(np.percentile(xs, q)) if xs else None


def parse_args(argv=None, add_arguments=None):
    p = argparse.ArgumentParser()
    p.add_argument("--workload", required=True, choices=sorted(SPECS))
    p.add_argument("--steps", type=int, help="timed training steps (default: per workload)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--eval-steps", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--train-budget", type=float, default=None, metavar="S",
                   help=f"stop the timed training loop after S seconds (at least {MIN_STEPS} steps)")
    p.add_argument("--min-seconds", type=float, default=0.0, metavar="S",
                   help="time at least S seconds of training steps (more than --steps if they are fast)")
    if add_arguments:
        add_arguments(p)
    return p.parse_args(argv)


def run(impl, setup, argv=None, add_arguments=None):
    """Parse args, call setup(args, rec) -> (train_step, eval_step), time them, print ONE JSON line.

    setup may set rec["stage"] (reported as error_stage on failure) and rec["error"] before raising.
    """
    args = parse_args(argv, add_arguments)
    steps = args.steps or SPECS[args.workload]["steps"]
    rec = dict(impl=impl, workload=args.workload, steps_planned=steps, warmup=args.warmup, threads=args.threads,
               run_id=os.environ.get("BENCH_RUN_ID"), loadavg_start=os.getloadavg()[0], stage="setup")
    try:
        t = time.perf_counter()
        train_step, eval_step = setup(args, rec)
        rec["setup_seconds"] = time.perf_counter() - t
        rec["rss_after_setup_mb"] = peak_rss_mb()
        rec["stage"] = "train"
        first, _ = _timed(train_step, args.warmup)
        losses, ms = _timed(train_step, steps, args.train_budget, args.min_seconds)
        rec.update(steps=len(ms), step_ms_median=statistics.median(ms), step_ms_p10=_pct(ms, 10),
                   step_ms_p90=_pct(ms, 90), step_ms_min=min(ms), loss_first=(first + losses)[0],
                   loss_last=losses[-1])
        rec["stage"] = "eval"
        eval_losses, ems = _timed(eval_step, args.eval_steps)
        rec.update(eval_loss=eval_losses[-1], eval_ms_median=statistics.median(ems), eval_ms_p10=_pct(ems, 10),
                   eval_ms_p90=_pct(ems, 90))
    except Exception as exc:  # failures of an implementation are findings, not crashes
        traceback.print_exc()  # the full story goes to stderr (the run log); the line keeps one line of it
        rec.setdefault("error", error_text(exc))
        rec.setdefault("error_stage", rec["stage"])
    del rec["stage"]
    rec["peak_rss_mb"] = peak_rss_mb()
    rec["torch_imported"] = "torch" in sys.modules  # the peer's API imports torch; onnxtrain's must not
    rec["loadavg_end"] = os.getloadavg()[0]
    emit(rec)
    return rec


def emit(rec):
    sys.stdout.flush()
    print(json.dumps(rec, sort_keys=False, default=float), flush=True)


def generate_in_child(rec, outdir, fn, *args):
    """Run fn(*args) -> dict in a spawned process; merge its dict and the artifact sizes into rec.

    fn runs the torch export and the artifact generation there, so the training process's peak RSS
    and imports are its own. fn reports failures as error/error_stage instead of raising.
    """
    rec["stage"] = "generate"
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        rec.update(pool.submit(fn, *args).result())
    rec["artifact_bytes"] = {f: os.path.getsize(os.path.join(outdir, f)) for f in sorted(os.listdir(outdir))}
    if "error" in rec:
        raise RuntimeError(rec["error"])


def session_options(threads, profile_prefix=None):
    """1 inter-op thread, `threads` intra-op threads; optionally onnxruntime's per-node profiler."""
    import onnxruntime

    so = onnxruntime.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    if profile_prefix:
        so.enable_profiling = True
        so.profile_file_prefix = profile_prefix
    return so


def load_training(api, outdir, workload, so, rec, optimizer_options=None):
    """Load the artifacts in outdir with `api` (onnxruntime.training.api or onnxtrain.api); optimizer_options
    are keyword arguments of api.Optimizer beyond the peer's (onnxtrain's update_in_backward).

    Returns (train_step, eval_step); a step is forward + backward + optimizer step + gradient reset.
    The two closures hold the only references to the sessions: drop both to close them.
    """
    t = time.perf_counter()
    state = api.CheckpointState.load_checkpoint(os.path.join(outdir, "checkpoint"))
    module = api.Module(os.path.join(outdir, "training_model.onnx"), state, os.path.join(outdir, "eval_model.onnx"),
                        device="cpu", session_options=so)
    optimizer = api.Optimizer(os.path.join(outdir, "optimizer_model.onnx"), module, **(optimizer_options or {}))
    optimizer.set_learning_rate(ADAMW["lr"])
    rec["load_seconds"] = time.perf_counter() - t
    x, y = make_batch(workload)

    def train_step():
        module.train()
        loss = module(x, y)
        optimizer.step()
        module.lazy_reset_grad()
        return float(loss)

    def eval_step():
        module.eval()
        return float(module(x, y))

    return train_step, eval_step
