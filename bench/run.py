# Replaces /work/shared/bench/run_all.sh (the reference harness): same one-process-per-run protocol.
"""The benchmark in one command: onnxtrain vs onnxruntime-training 1.19.2 (the peer) vs PyTorch.

    python bench/run.py                      # full run: envs, 5 workloads x 3 implementations, report
    python bench/run.py --quick              # smoke test: few steps, results in bench/results/scratch/
    python bench/run.py --impls peer,torch --workloads mlp,lenet --repeat 1

Two interpreters (standard library only here):
- the peer environment, bench/.peer-venv (created if missing): onnxruntime-training 1.19.2, onnx,
  torch 2.13.0, numpy. It runs the peer and PyTorch. onnxruntime-training ships the `onnxruntime`
  module itself, so onnxtrain (which needs the stock onnxruntime) cannot share it.
- the onnxtrain environment: the first of this interpreter, the repo's .venv and bench/.onnxtrain-venv
  that has the stock onnxruntime, onnx, numpy, safetensors and torch (the exporter, in the generation
  child only) and not onnxruntime-training; else bench/.onnxtrain-venv is created with
  `pip install -e <repo> torch==2.13.0`. The checkout's src/ goes first on PYTHONPATH, so the code
  measured is always this working tree.

Each (workload, implementation) runs in its own process, interleaved: per pass and workload the three
implementations take turns in a rotating order. Raw lines go to bench/results/<UTC date>.jsonl, the
runners' stderr to bench/results/<UTC date>.log, and BENCHMARKS.md at the repo root is regenerated.
"""

import argparse
import datetime
import json
import os
import platform
import signal
import subprocess
import sys
import time

import report

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
WORKLOADS = ["mlp", "lenet", "mobilenetv2", "mobilenetv2_head", "transformer", "bert_small", "bert_small_head",
             "resnet18", "resnet18_head"]
EXTRA_WORKLOADS = ["bert_small_seq32", "bert_base"]  # on request only (--workloads): issue 14 sequence, BERT-base
IMPLS = ["onnxtrain", "peer", "torch"]
# on request (--impls): onnxtrain with Optimizer(..., update_in_backward=True), for the large workloads' memory
EXTRA_IMPLS = ["onnxtrain-uib"]
CPU_FLAGS_OF_NOTE = frozenset({"avx2", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_bf16", "amx_tile"})
PEER_VENV = os.path.join(HERE, ".peer-venv")
ONNXTRAIN_VENV = os.path.join(HERE, ".onnxtrain-venv")
# torch pinned: 2.13.0 is a local CPU wheel here; an unpinned torch pulls the multi-GB CUDA build.
PEER_PACKAGES = ["onnxruntime-training==1.19.2", "onnx", "torch==2.13.0", "numpy", "transformers"]
ONNXTRAIN_PACKAGES = ["-e", REPO, "torch==2.13.0", "transformers"]

PROBE = """
import importlib.metadata as md, json, platform, sys
versions = {}
for name in ("onnxruntime", "onnxruntime-training", "torch", "onnx", "numpy", "safetensors", "onnxtrain"):
    try:
        versions[name] = md.version(name)
    except md.PackageNotFoundError:
        versions[name] = None
print(json.dumps({"python": platform.python_version(), "executable": sys.executable, "versions": versions}))
"""


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def probe(python):
    """Versions of the packages that matter in the interpreter `python`, or None if it does not run."""
    try:
        out = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, timeout=60, check=True)
        return json.loads(out.stdout)
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def peer_problems(info):
    v = info["versions"]
    problems = [f"needs {p.split('==')[0]}" for p in ("onnxruntime-training", "torch", "onnx", "numpy") if not v[p]]
    if v["onnxruntime-training"] and v["onnxruntime-training"] != "1.19.2":
        problems.append(f"has onnxruntime-training {v['onnxruntime-training']}, not 1.19.2")
    if v["onnxruntime"]:
        problems.append(f"has onnxruntime {v['onnxruntime']}, which overwrites onnxruntime-training's module")
    return problems


def onnxtrain_problems(info):
    v = info["versions"]
    problems = [f"needs {p}" for p in ("onnxruntime", "onnx", "numpy", "safetensors", "torch") if not v[p]]
    if v["onnxruntime-training"]:
        problems.append("has onnxruntime-training: onnxtrain runs on the stock onnxruntime")
    return problems


def make_venv(path, packages):
    log(f"creating {os.path.relpath(path, REPO)}: pip install {' '.join(packages)}")
    if not os.path.exists(os.path.join(path, "bin", "python")):
        subprocess.run([sys.executable, "-m", "venv", path], check=True)
    subprocess.run([os.path.join(path, "bin", "python"), "-m", "pip", "install", "-q", *packages], check=True)


def ensure_env(name, given, candidates, venv, packages, problems_of):
    """An interpreter for env `name`: the one given, else the first fit candidate, else a fresh venv."""
    if given:
        info = probe(given)
        if info is None or problems_of(info):
            raise SystemExit(f"{name} interpreter {given}: {problems_of(info) if info else 'does not run'}")
        return info
    seen = set()
    for python in candidates:
        if not os.path.exists(python) or os.path.abspath(python) in seen:
            continue
        seen.add(os.path.abspath(python))
        info = probe(python)
        if info and not problems_of(info):
            return info
        log(f"{name}: skipping {python}: {problems_of(info) if info else 'does not run'}")
    make_venv(venv, packages)  # creates it, or repairs an existing one that lacks something
    info = probe(os.path.join(venv, "bin", "python"))
    if info is None or problems_of(info):
        raise SystemExit(f"{venv}: still unusable after pip install: {problems_of(info) if info else 'no python'}")
    return info


def machine_record(args, run_id):
    cpu, info = "?", {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                info.setdefault(key.strip(), value.strip())
        cpu = info.get("model name", "?")
    except OSError:
        pass
    # "Intel(R) Xeon(R) Processor" names several generations whose kernels differ (torch's matrix products against
    # MLAS's): the family, model and vector extensions say which one ran
    flags = sorted(set(info.get("flags", "").split()) & CPU_FLAGS_OF_NOTE)
    cpu_id = f"family {info.get('cpu family', '?')} model {info.get('model', '?')}"
    cpu_id += f", {' '.join(flags)}" if flags else ""
    mem_gib = None
    try:
        with open("/proc/meminfo") as f:
            mem_gib = int(next(line.split()[1] for line in f if line.startswith("MemTotal"))) / 2**20
    except (OSError, StopIteration):
        pass
    now = datetime.datetime.now(datetime.timezone.utc)
    return dict(impl="machine", run_id=run_id, date=now.isoformat("T", "minutes"),
                cpu_model=cpu, cpu_id=cpu_id, cores=os.cpu_count(), usable_cores=len(os.sched_getaffinity(0)),
                mem_gib=mem_gib,
                platform=platform.platform(), threads=args.threads, repeat=args.repeat, argv=sys.argv[1:],
                git=git_state())


def git_state():
    def git(*a):
        r = subprocess.run(["git", "-C", REPO, *a], capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else None

    commit = git("rev-parse", "--short", "HEAD")
    dirty = git("status", "--porcelain", "--", "src")
    return f"{commit or 'no commit yet'}{' + uncommitted changes in src/' if dirty else ''}"


def run_one(cmd, env, timeout, logf):
    """Run one runner process; return its JSON line (or an error line), never raise."""
    logf.write(f"== {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%dT%H:%M:%SZ} {' '.join(cmd)}\n")
    logf.flush()
    t = time.perf_counter()
    # own process group, so a timeout also ends the runner's artifact-generation child
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=logf, text=True, env=env, cwd=HERE,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        error = f"no result line, exit code {proc.returncode}"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        error = f"timed out after {timeout} s"
    except BaseException:  # Ctrl-C: the runner is in its own session and would not get the signal
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    lines = [line for line in out.splitlines() if line.startswith('{"impl"')]
    rec = json.loads(lines[-1]) if lines else dict(error=error, error_stage="process")
    rec.update(wall_seconds=time.perf_counter() - t, exit_code=proc.returncode)
    return rec


def progress(i, total, rec):
    what = f"[{i}/{total}] pass {rec['pass']} {rec['workload']:<16} {rec['impl']:<9}"
    if rec.get("step_ms_median") is not None:
        return (f"{what} step {rec['step_ms_median']:8.1f} ms  eval {rec['eval_ms_median']:7.1f} ms  "
                f"RSS {rec['peak_rss_mb']:5.0f} MB  loss {rec['loss_first']:.3g} -> {rec['loss_last']:.3g}  "
                f"({rec['wall_seconds']:.0f} s, load {rec.get('loadavg_start', 0):.1f})")
    return f"{what} {rec.get('error_stage', '?')} failed: {rec.get('error', '?')[:100]} ({rec['wall_seconds']:.0f} s)"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--repeat", type=int, default=4, help="passes over everything (default 4)")
    p.add_argument("--threads", type=int, default=2, help="intra-op / torch threads (default 2)")
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated (default: all)")
    p.add_argument("--impls", default=",".join(IMPLS), help="comma-separated (default: onnxtrain,peer,torch)")
    p.add_argument("--steps", type=int, help="timed training steps (default: per workload, 50)")
    p.add_argument("--warmup", type=int, help="warm-up steps (default 5)")
    p.add_argument("--eval-steps", type=int, help="timed eval steps (default 20)")
    p.add_argument("--train-budget", type=float, default=60,
                   help="seconds after which a timed training loop stops early (default 60; >= 10 steps)")
    p.add_argument("--min-seconds", type=float, default=2.0,
                   help="each timed training loop lasts at least this long (default 2; millisecond steps)")
    p.add_argument("--settle", type=float, default=2.0,
                   help="pause before each runner, so none is timed while the previous one exits (default 2 s)")
    p.add_argument("--timeout", type=float, default=300, help="seconds per process (default 300)")
    p.add_argument("--max-minutes", type=float, default=14,
                   help="start another pass only if it is expected to end within this (default 14)")
    p.add_argument("--quick", action="store_true",
                   help="smoke test: 1 pass of 10 steps; results in bench/results/scratch/, BENCHMARKS.md kept")
    p.add_argument("--peer-python", help="use this interpreter for the peer and torch instead of bench/.peer-venv")
    p.add_argument("--onnxtrain-python", help="use this interpreter for onnxtrain (default: see above)")
    p.add_argument("--setup-only", action="store_true", help="create/check the two environments and stop")
    args = p.parse_args(argv)
    args.workloads, args.impls = args.workloads.split(","), args.impls.split(",")
    checks = (("workload", args.workloads, WORKLOADS + EXTRA_WORKLOADS), ("impl", args.impls, IMPLS + EXTRA_IMPLS))
    for name, values, allowed in checks:
        bad = sorted(set(values) - set(allowed))
        if bad:
            p.error(f"unknown {name} {bad}; choose from {allowed}")
    if args.quick:
        args.repeat, args.min_seconds, args.settle = 1, 0.0, 0.0
        for name, value in (("steps", 10), ("warmup", 2), ("eval_steps", 5)):
            if getattr(args, name) is None:
                setattr(args, name, value)
    return args


def main(argv=None):
    args = parse_args(argv)
    t0 = time.perf_counter()
    need_peer = bool({"peer", "torch"} & set(args.impls)) or args.setup_only
    need_onnxtrain = bool({"onnxtrain", "onnxtrain-uib"} & set(args.impls)) or args.setup_only
    envs = {}
    if need_peer:
        envs["peer"] = ensure_env("peer", args.peer_python, [os.path.join(PEER_VENV, "bin", "python")], PEER_VENV,
                                  PEER_PACKAGES, peer_problems)
    if need_onnxtrain:
        candidates = [sys.executable, os.path.join(REPO, ".venv", "bin", "python"),
                      os.path.join(ONNXTRAIN_VENV, "bin", "python")]
        envs["onnxtrain"] = ensure_env("onnxtrain", args.onnxtrain_python, candidates, ONNXTRAIN_VENV,
                                       ONNXTRAIN_PACKAGES, onnxtrain_problems)
    for name, info in envs.items():
        log(f"{name} environment: {info['executable']} (python {info['python']}, "
            + ", ".join(f"{k} {v}" for k, v in info["versions"].items() if v) + ")")
    if args.setup_only:
        return

    now = datetime.datetime.now(datetime.timezone.utc)
    run_id = now.strftime("%Y%m%dT%H%M%SZ")
    outdir = os.path.join(HERE, "results", "scratch" if args.quick else "")
    os.makedirs(outdir, exist_ok=True)
    results = os.path.join(outdir, f"{now:%Y-%m-%d}.jsonl")
    env_of = {"onnxtrain": "onnxtrain", "onnxtrain-uib": "onnxtrain", "peer": "peer", "torch": "peer"}
    records = [machine_record(args, run_id)]
    for name, info in envs.items():
        impls = [i for i in args.impls if env_of[i] == name]
        records.append(dict(impl="env", env=name, run_id=run_id, impls=impls, **info))

    child_env = dict(os.environ, BENCH_RUN_ID=run_id, PYTHONUNBUFFERED="1")
    onnxtrain_env = dict(child_env, PYTHONPATH=os.pathsep.join(
        [os.path.join(REPO, "src")] + [x for x in [os.environ.get("PYTHONPATH")] if x]))
    scripts = {"onnxtrain": ["run_onnxtrain.py"], "onnxtrain-uib": ["run_onnxtrain.py", "--update-in-backward"],
               "peer": ["run_peer.py", "--workarounds"], "torch": ["run_torch.py"]}
    extra = ["--threads", str(args.threads), "--train-budget", str(args.train_budget),
             "--min-seconds", str(args.min_seconds)]
    for flag, value in (("--steps", args.steps), ("--warmup", args.warmup), ("--eval-steps", args.eval_steps)):
        if value is not None:
            extra += [flag, str(value)]

    total = args.repeat * len(args.workloads) * len(args.impls)
    load = os.getloadavg()[0]
    if load > 0.5 * (os.cpu_count() or 1):
        log(f"warning: load average {load:.1f} on {os.cpu_count()} cores: other work competes, figures will be noisy")
    log(f"run {run_id}: up to {total} runs -> {os.path.relpath(results, REPO)}")
    i, passes = 0, 0
    with open(results, "a") as out, open(results[:-len(".jsonl")] + ".log", "a") as logf:
        for rec in records:
            out.write(json.dumps(rec) + "\n")
        for p in range(args.repeat):
            elapsed = time.perf_counter() - t0
            if p and elapsed + elapsed / p > args.max_minutes * 60:
                log(f"stopping after {p} pass(es): another would end after --max-minutes {args.max_minutes:g}")
                break
            for wi, w in enumerate(args.workloads):
                k = (p + wi) % len(args.impls)  # rotate who goes first, so no one always follows a given run
                for impl in args.impls[k:] + args.impls[:k]:
                    env = env_of[impl]
                    cmd = [envs[env]["executable"], *scripts[impl], "--workload", w, *extra]
                    time.sleep(args.settle)
                    rec = run_one(cmd, onnxtrain_env if env == "onnxtrain" else child_env, args.timeout, logf)
                    rec.setdefault("impl", impl)
                    rec.setdefault("workload", w)
                    rec.update({"run_id": run_id, "pass": p + 1})
                    out.write(json.dumps(rec) + "\n")
                    out.flush()
                    i += 1
                    log(progress(i, total, rec))
            passes = p + 1
        done = dict(impl="done", run_id=run_id, passes=passes, total_seconds=time.perf_counter() - t0)
        out.write(json.dumps(done) + "\n")
    log(f"done in {done['total_seconds'] / 60:.1f} minutes; raw lines in {os.path.relpath(results, REPO)}")
    report_args = [results, "--run-id", run_id]
    if not args.quick:
        report_args += ["--out", os.path.join(REPO, "BENCHMARKS.md")]
        log("BENCHMARKS.md regenerated")
    text = report.main(report_args)
    if not args.quick:
        print(text, end="")


if __name__ == "__main__":
    main()
