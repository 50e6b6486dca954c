"""Where a training step's time goes: onnxruntime's per-node profiler on one workload.

    python bench/profile_ops.py --workload mobilenetv2              # onnxtrain
    python bench/profile_ops.py --workload mobilenetv2 --impl peer  # onnxruntime-training 1.19.2
    options: --steps 20 --eval-steps 0 --threads 2 --top 20 --keep DIR (keep the profile JSON files)

Generates the artifacts like the benchmark (spawned child), loads them with SessionOptions.enable_profiling,
runs 5 warm-up + 20 training steps (and --eval-steps eval steps), closes the sessions (which writes one profile
JSON per onnxruntime session) and prints the top op types and nodes by kernel time, per session and
over all of them. Each session's first run (allocation, first-touch) is left out.

It picks its interpreter like bench/run.py (re-executing itself if needed): the onnxtrain environment
with the checkout's src/ first on PYTHONPATH, or bench/.peer-venv for --impl peer.
"""

import argparse
import collections
import gc
import glob
import json
import os
import shutil
import sys
import tempfile

import common

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", required=True, choices=sorted(common.SPECS))
    p.add_argument("--impl", default="onnxtrain", choices=["onnxtrain", "peer"])
    p.add_argument("--steps", type=int, default=20, help="training steps after 5 warm-up steps (default 20)")
    p.add_argument("--eval-steps", type=int, default=0, help="eval steps to profile too (default 0)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--top", type=int, default=20)
    p.add_argument("--keep", metavar="DIR", help="write the profile JSON files here and keep them")
    return p.parse_args(argv)


def ensure_interpreter(impl, script=__file__):
    """Re-exec ``script`` under the interpreter bench/run.py would use for impl, unless this one already fits."""
    import run  # standard library only

    env = dict(os.environ)
    if impl == "peer":
        info = run.ensure_env("peer", None, [os.path.join(run.PEER_VENV, "bin", "python")], run.PEER_VENV,
                              run.PEER_PACKAGES, run.peer_problems)
    else:
        candidates = [sys.executable, os.path.join(run.REPO, ".venv", "bin", "python"),
                      os.path.join(run.ONNXTRAIN_VENV, "bin", "python")]
        info = run.ensure_env("onnxtrain", None, candidates, run.ONNXTRAIN_VENV, run.ONNXTRAIN_PACKAGES,
                              run.onnxtrain_problems)
        path = os.environ.get("PYTHONPATH", "")
        if path.split(os.pathsep)[0] != SRC:
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC] + [x for x in [path] if x]))
    if os.path.abspath(info["executable"]) != os.path.abspath(sys.executable) or env != dict(os.environ):
        os.execve(info["executable"], [info["executable"], os.path.abspath(script), *sys.argv[1:]], env)


def profile(args, prefix):
    """Train with profiling on; return the profile files written under prefix."""
    if args.impl == "peer":
        from onnxruntime.training import api

        import run_peer as runner

        workarounds = (True,)
    else:
        import run_onnxtrain as runner
        from onnxtrain import api

        workarounds = ()
    outdir = tempfile.mkdtemp(prefix=f"{args.impl}_bench_")
    rec = {}
    common.generate_in_child(rec, outdir, runner.generate, args.workload, outdir, *workarounds)
    print(f"{args.impl} {args.workload}: generated in {rec['gen_seconds']:.2f} s, "
          f"artifacts {', '.join(f'{k} {v / 1024:.0f} KB' for k, v in rec['artifact_bytes'].items())}")
    so = common.session_options(args.threads, prefix)
    labels = {prefix: "all"}
    if args.impl == "onnxtrain":
        unique_profile_per_session(so, labels)
    train_step, eval_step = common.load_training(api, outdir, args.workload, so, rec)
    for _ in range(5 + args.steps):
        train_step()
    for _ in range(args.eval_steps):
        eval_step()
    del train_step, eval_step  # closes the sessions: onnxruntime writes the profiles then
    gc.collect()
    shutil.rmtree(outdir, ignore_errors=True)  # the artifacts; the profiles are under prefix
    files = [(f, next(v for k, v in sorted(labels.items(), reverse=True) if f.startswith(k)))
             for f in glob.glob(prefix + "*.json")]
    return sorted(files, key=lambda fl: fl[1])


def unique_profile_per_session(so, labels):
    """Give each onnxruntime.InferenceSession its own profile file.

    Labels each file with its creation order (Module's sessions before Optimizer's) and model file.
    Old onnxruntime names a profile prefix + creation second + ".json", so sessions created in the same
    second write one file. The peer (1.19.2) is such a case, and its sessions are C++ ones that cannot
    be relabelled: with --impl peer the one file holds one session, in practice the training graph.
    """
    import onnxruntime

    init, base = onnxruntime.InferenceSession.__init__, so.profile_file_prefix

    def patched(self, path_or_bytes, sess_options=None, *args, **kwargs):
        if sess_options is so:
            name = os.path.basename(path_or_bytes) if isinstance(path_or_bytes, str) else "from bytes"
            so.profile_file_prefix = f"{base}_{len(labels)}"
            label = so.profile_file_prefix
            labels[label] = f"#{len(labels)} {name}"
            init(self, path_or_bytes, sess_options, *args, **kwargs)
            if "learning_rate" in {i.name for i in self.get_inputs()}:  # the optimizer graph's own session
                labels[label] += " (optimizer)"
            return
        init(self, path_or_bytes, sess_options, *args, **kwargs)

    onnxruntime.InferenceSession.__init__ = patched


def read_profile(path):
    """(runs after the first, {node: (op_type, total us)}) of one session's profile."""
    with open(path) as f:
        events = json.load(f)
    runs = sorted((e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"),
                  key=lambda e: e["ts"])
    start = runs[0]["ts"] + runs[0]["dur"] if runs else 0
    nodes = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] >= start:
            name = e["name"][: -len("_kernel_time")]
            op, us = nodes.get(name, (e.get("args", {}).get("op_name", "?"), 0))
            nodes[name] = (op, us + e["dur"])
    return max(len(runs) - 1, 0), nodes


def table(title, nodes, runs, top):
    by_op = collections.defaultdict(lambda: [0, 0])
    for op, us in nodes.values():
        by_op[op][0] += us
        by_op[op][1] += 1
    total = sum(us for _, us in nodes.values()) or 1
    per = f"ms/run (over {runs} runs)" if runs else "ms total"
    print(f"\n{title}: kernel time {total / 1e3 / max(runs, 1):.2f} ms per run, {len(nodes)} nodes")
    print(f"  {'op type':<32} {per:>24} {'share':>7} {'nodes':>6}")
    for op, (us, n) in sorted(by_op.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"  {op:<32} {us / 1e3 / max(runs, 1):>24.3f} {100 * us / total:>6.1f}% {n:>6}")
    print(f"  {'top nodes':<66} {'ms/run':>8}")
    for name, (op, us) in sorted(nodes.items(), key=lambda kv: -kv[1][1])[: min(top, 10)]:
        print(f"  {op + ' ' + name[-50:]:<66} {us / 1e3 / max(runs, 1):>8.3f}")


def main(argv=None):
    args = parse_args(argv)
    ensure_interpreter(args.impl)
    os.environ.setdefault("PYTHONWARNINGS", "ignore")  # the exporter's warnings, in the generation child
    keep = args.keep or tempfile.mkdtemp(prefix="bench_profile_")
    os.makedirs(keep, exist_ok=True)
    files = profile(args, os.path.join(keep, f"{args.impl}_{args.workload}"))
    if not files:
        raise SystemExit(f"no profile written under {keep}: does {args.impl}'s Module pass session_options "
                         "(enable_profiling) on to its onnxruntime sessions?")
    combined = {}
    for path, label in files:
        try:
            runs, nodes = read_profile(path)
        except ValueError as exc:
            print(f"\n{path}: unreadable ({exc}); two sessions probably wrote it at once")
            continue
        if nodes:
            table(f"session {label} ({os.path.basename(path)})", nodes, runs, args.top)
        combined.update({f"{label}:{k}": v for k, v in nodes.items()})
    title = "all sessions, per training step" + (" (eval runs included)" if args.eval_steps else "")
    table(title, combined, 5 + args.steps - 1, args.top)
    print(f"\nprofiles: {keep}" if args.keep else "")


if __name__ == "__main__":
    main()
