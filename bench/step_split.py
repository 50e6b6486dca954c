"""Where a small model's training step goes: Python around the engine, the training graph, the update.

    python bench/step_split.py --workload mlp                # onnxtrain
    python bench/step_split.py --workload mlp --impl peer    # onnxruntime-training 1.19.2
    options: --steps 400 --threads 2 --rounds 3

onnxtrain: one process holds two Modules on the same artifacts, one fusing the training and optimizer
graphs (the default) and one running them as two sessions, and alternates blocks of steps between them. Each
step's engine time is read around `InferenceSession.run_with_iobinding`; "python" is the rest of the step.
Then the same API path runs with the engine's run replaced by a no-op: the CPU time of that is the Python
overhead alone, free of the machine's load. The peer: `module(x, y)` and `optimizer.step()` timed apart.
Figures per round: median / p10 / min in ms (the lowest is the least disturbed by other processes).

It picks its interpreter like bench/profile_ops.py.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

import common
import profile_ops


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="mlp", choices=sorted(common.SPECS))
    p.add_argument("--impl", default="onnxtrain", choices=["onnxtrain", "peer"])
    p.add_argument("--steps", type=int, default=400, help="timed steps per round and variant (default 400)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    return p.parse_args(argv)


def summary(ms):
    return f"{statistics.median(ms):.3f} / {np.percentile(ms, 10):.3f} / {min(ms):.3f}"


def load(api, outdir, so):
    state = api.CheckpointState.load_checkpoint(os.path.join(outdir, "checkpoint"))
    module = api.Module(os.path.join(outdir, "training_model.onnx"), state, os.path.join(outdir, "eval_model.onnx"),
                        device="cpu", session_options=so)
    optimizer = api.Optimizer(os.path.join(outdir, "optimizer_model.onnx"), module)
    optimizer.set_learning_rate(common.ADAMW["lr"])
    return module, optimizer


def split_onnxtrain(args, outdir, x, y):
    import onnxruntime

    from onnxtrain import api

    engine = []
    run = onnxruntime.InferenceSession.run_with_iobinding

    def timed(self, *a, **k):
        t = time.perf_counter()
        result = run(self, *a, **k)
        engine.append((time.perf_counter() - t) * 1e3)
        return result

    onnxruntime.InferenceSession.run_with_iobinding = timed
    fused, separate = load(api, outdir, common.session_options(args.threads)), \
        load(api, outdir, common.session_options(args.threads))
    separate[0].training_run.fuse = False

    def step(module, optimizer):
        module.train()
        loss = module(x, y)
        optimizer.step()
        module.lazy_reset_grad()
        return float(loss)

    for _ in range(30):
        step(*fused), step(*separate)
    for r in range(args.rounds):
        rows = {"fused": [], "separate": []}
        for _ in range(8):
            for name, pair in (("fused", fused), ("separate", separate)):
                for _ in range(max(args.steps // 8, 1)):
                    engine.clear()
                    t = time.perf_counter()
                    step(*pair)
                    rows[name].append(((time.perf_counter() - t) * 1e3, *engine))
        f, s = rows["fused"], rows["separate"]
        print(f"round {r + 1} (load {os.getloadavg()[0]:.1f}), median / p10 / min ms:\n"
              f"  fused:    step {summary([a[0] for a in f])}, engine {summary([a[1] for a in f])}, "
              f"python {summary([a[0] - a[1] for a in f])}\n"
              f"  separate: step {summary([a[0] for a in s])}, training graph {summary([a[1] for a in s])}, "
              f"optimizer graph {summary([a[2] for a in s])}", flush=True)
    onnxruntime.InferenceSession.run_with_iobinding = lambda self, *a, **k: None
    for _ in range(20):
        step(*fused)
    blocks = []
    for _ in range(5):
        c = time.thread_time()
        for _ in range(2000):
            step(*fused)
        blocks.append((time.thread_time() - c) / 2000 * 1e6)
    print(f"python alone (engine run replaced by a no-op), CPU per step, lowest of 5 x 2000: {min(blocks):.1f} us")


def split_peer(args, outdir, x, y):
    from onnxruntime.training import api

    module, optimizer = load(api, outdir, common.session_options(args.threads))
    for r in range(args.rounds):
        rows = []
        for i in range(args.steps + 30):
            t0 = time.perf_counter()
            module.train()
            loss = module(x, y)
            t1 = time.perf_counter()
            optimizer.step()
            t2 = time.perf_counter()
            module.lazy_reset_grad()
            float(loss)
            t3 = time.perf_counter()
            if i >= 30:
                rows.append(((t3 - t0) * 1e3, (t1 - t0) * 1e3, (t2 - t1) * 1e3))
        print(f"round {r + 1} (load {os.getloadavg()[0]:.1f}), median / p10 / min ms: step "
              f"{summary([a[0] for a in rows])}, module(x, y) {summary([a[1] for a in rows])}, "
              f"optimizer.step() {summary([a[2] for a in rows])}", flush=True)


def main(argv=None):
    args = parse_args(argv)
    profile_ops.ensure_interpreter(args.impl, __file__)
    if args.impl == "peer":
        import run_peer as runner

        workarounds = (True,)
    else:
        import run_onnxtrain as runner

        workarounds = ()
    outdir = tempfile.mkdtemp(prefix=f"{args.impl}_split_")
    rec = {}
    common.generate_in_child(rec, outdir, runner.generate, args.workload, outdir, *workarounds)
    x, y = common.make_batch(args.workload)
    print(f"{args.impl} {args.workload}, {args.threads} intra-op threads")
    (split_peer if args.impl == "peer" else split_onnxtrain)(args, outdir, x, y)


if __name__ == "__main__":
    sys.exit(main())
