"""A head-only step cannot be faster than the model's forward: that floor, measured for onnxtrain and the peer.

    python bench/forward_floor.py [--workloads bert_small_head,resnet18_head] [--threads 1] [--rounds 8]
                                  [--peer-python PATH]

With a frozen backbone the training step is the whole forward, the backward of the small head and an update of
its few parameters. Each implementation runs in a process of its own (the peer's in its own environment) that
loads its artifacts and alternates blocks of three calls of: the training step (forward + backward + optimizer
step + gradient reset, as bench/run.py times it), the eval call, and the exported model's plain forward in an
``onnxruntime.InferenceSession`` with the same session options. Figures are CPU milliseconds per call, the
lowest block of ``--rounds`` (CPU time, so a neighbour on the shared machine inflates them less than wall time;
with one intra-op thread onnxruntime computes on the calling thread).

The floor for a target of ``0.9x the peer's step``: 0.9 x the peer's step against the plain forward of the same
model, in either build of onnxruntime. When the first is below the second, the target asks for a training step
faster than inference alone.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import common  # noqa: E402


def measure(impl: str, workload: str, outdir: str, threads: int, rounds: int) -> dict:
    """In this process: generate (in a child) and load the artifacts, then time the three calls."""
    if not os.path.exists(os.path.join(outdir, "checkpoint")):
        rec: dict = {}
        if impl == "peer":
            import run_peer as runner

            common.generate_in_child(rec, outdir, runner.generate, workload, outdir, True)
        else:
            import run_onnxtrain as runner

            common.generate_in_child(rec, outdir, runner.generate, workload, outdir)
        if "error" in rec:
            raise RuntimeError(f"{impl} {workload}: {rec['error']}")
    import onnxruntime

    if impl == "peer":
        from onnxruntime.training import api
    else:
        from onnxtrain import api
    x, y = common.make_batch(workload)
    so = common.session_options(threads)
    state = api.CheckpointState.load_checkpoint(os.path.join(outdir, "checkpoint"))
    module = api.Module(os.path.join(outdir, "training_model.onnx"), state,
                        os.path.join(outdir, "eval_model.onnx"), device="cpu", session_options=so)
    optimizer = api.Optimizer(os.path.join(outdir, "optimizer_model.onnx"), module)
    forward_session = onnxruntime.InferenceSession(os.path.join(outdir, "model.onnx"),
                                                   common.session_options(threads),
                                                   providers=["CPUExecutionProvider"])
    feed = {forward_session.get_inputs()[0].name: x}

    def step():
        module.train()
        loss = module(x, y)
        optimizer.step()
        module.lazy_reset_grad()
        float(loss)

    def evaluate():
        module.eval()
        module(x, y)

    def forward():
        forward_session.run(None, feed)

    calls = {"step": step, "eval": evaluate, "forward": forward}
    for f in calls.values():
        f(), f()
    best = dict.fromkeys(calls, float("inf"))
    for _ in range(rounds):
        for name, f in calls.items():
            c = time.process_time()
            for _ in range(3):
                f()
            best[name] = min(best[name], (time.process_time() - c) / 3 * 1e3)
    return {"impl": impl, "workload": workload, "threads": threads, "load": os.getloadavg()[0],
            "onnxruntime": onnxruntime.__version__, **{f"{k}_cpu_ms": v for k, v in best.items()}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workloads", default="bert_small_head,resnet18_head")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--peer-python", default=os.path.join(HERE, ".peer-venv", "bin", "python"))
    p.add_argument("--child", nargs=3, metavar=("IMPL", "WORKLOAD", "OUTDIR"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(measure(*args.child, args.threads, args.rounds)), flush=True)
        return 0
    src = os.path.join(os.path.dirname(HERE), "src")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    rows = []
    for workload in args.workloads.split(","):
        results = {}
        for impl, python in (("onnxtrain", sys.executable), ("peer", args.peer_python)):
            outdir = tempfile.mkdtemp(prefix=f"floor_{impl}_{workload}_")
            cmd = [python, os.path.abspath(__file__), "--threads", str(args.threads), "--rounds", str(args.rounds),
                   "--child", impl, workload, outdir]
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
            results[impl] = json.loads(out.strip().splitlines()[-1])
        ours, peer = results["onnxtrain"], results["peer"]
        forward = min(ours["forward_cpu_ms"], peer["forward_cpu_ms"])
        rows.append(f"| {workload} | {ours['step_cpu_ms']:.1f} | {peer['step_cpu_ms']:.1f} | "
                    f"{ours['step_cpu_ms'] / peer['step_cpu_ms']:.2f} | {ours['forward_cpu_ms']:.1f} / "
                    f"{peer['forward_cpu_ms']:.1f} | {0.9 * peer['step_cpu_ms']:.1f} | "
                    f"{forward / peer['step_cpu_ms']:.2f} | {ours['load']:.1f} / {peer['load']:.1f} |")
    print(f"CPU ms per call, lowest of {args.rounds} blocks, {args.threads} intra-op thread(s)\n")
    print("| workload | step onnxtrain | step peer | ratio | plain forward onnxtrain's / peer's onnxruntime | "
          "0.9x peer step | floor: fastest forward / peer step | load |")
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
