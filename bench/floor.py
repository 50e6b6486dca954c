"""How fast can a training step be on standard ONNX? Floors from this machine's measured rates (issue 14, item 4).

    python bench/floor.py [--workloads mlp,mobilenetv2,bert_small] [--write]

Measures, with onnxruntime and 2 threads (the benchmark's setting):
- memory bandwidth: an Add of two vectors of 16M float32 into a third, bound with IOBinding (bytes read and
  written per second, the lowest time of 60 runs);
- the matmul rate: a 1024 x 1024 x 1024 MatMul (FLOP/s, lowest time of 60 runs);
- the cost of one node: a chain of 200 Adds on 16 floats (per node, lowest of 200 runs);
each measured at the start and at the end, the better of the two kept; then trains each workload for a few
steps with onnxruntime's profiler on (as profile_ops.py) and reads, from
the sessions a training step runs (the training graph fused with the optimizer's, or both one after the other
when the update runs in place, as on the large models), the node count and the bytes each node reads and
writes (onnxruntime's activation + parameter + output sizes), split into the optimizer's nodes and the rest.

Floors, per step: bytes / bandwidth (every byte a node touches goes through memory once: an upper bound on
the traffic, so a pessimistic floor where tensors stay in the cache), FLOPs / matmul rate (workloads.flops),
nodes x the cost of one node. For the optimizer, the bytes a fused AdamW kernel must move (the peer's: read
parameters, gradients and both moments, write parameters and moments: 7 x 4 bytes per parameter) next to what
onnxtrain's graph moves. ``--write`` puts the table into BENCHMARKS.md between the floor markers (kept by
report.py), with the newest benchmark run's step times beside it.
"""

import argparse
import collections
import datetime
import glob
import json
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402

MARK_BEGIN, MARK_END = "<!-- floor:begin (bench/floor.py; kept by bench/report.py) -->", "<!-- floor:end -->"


def _session(model, threads):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _lowest(fn, n):
    fn()
    best = float("inf")
    for _ in range(n):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def machine_rates(threads):
    """(bandwidth bytes/s, matmul FLOP/s, seconds per node) measured with onnxruntime."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    def model(nodes, inputs, outputs):
        graph = helper.make_graph(nodes, "m", inputs, outputs)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    vec = lambda n, size: helper.make_tensor_value_info(n, TensorProto.FLOAT, size)  # noqa: E731
    n = 1 << 24
    add = _session(model([helper.make_node("Add", ["a", "b"], ["c"])], [vec("a", [n]), vec("b", [n])],
                         [vec("c", [n])]), threads)
    arrays = {k: np.random.default_rng(0).standard_normal(n).astype(np.float32) for k in "abc"}
    io = add.io_binding()
    for k in "ab":
        io.bind_ortvalue_input(k, ort.OrtValue.ortvalue_from_numpy(arrays[k]))
    io.bind_ortvalue_output("c", ort.OrtValue.ortvalue_from_numpy(arrays["c"]))
    bandwidth = 3 * 4 * n / _lowest(lambda: add.run_with_iobinding(io), 60)

    k = 1024
    mm = _session(model([helper.make_node("MatMul", ["a", "b"], ["c"])], [vec("a", [k, k]), vec("b", [k, k])],
                        [vec("c", [k, k])]), threads)
    feeds = {x: np.random.default_rng(1).standard_normal((k, k)).astype(np.float32) for x in "ab"}
    matmul = 2 * k ** 3 / _lowest(lambda: mm.run(None, feeds), 60)

    chain = [helper.make_node("Add", [f"x{i}", "one"], [f"x{i + 1}"]) for i in range(200)]
    one = helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])
    m = model(chain, [vec("x0", [16])], [vec("x200", [16])])
    m.graph.initializer.append(one)
    nodes = _session(m, threads)
    x = {"x0": np.zeros(16, np.float32)}
    per_node = _lowest(lambda: nodes.run(None, x), 200) / 200
    return bandwidth, matmul, per_node


def profile_step(workload, threads, steps=6):
    """(nodes, bytes of the optimizer's nodes, bytes of the others) per training step.

    A step runs the training graph fused with the optimizer graph (one session, the optimizer's nodes named
    ``optimizer/...``) or, when the update runs in place (large models), the two graphs' sessions one after the
    other: every session that ran at every timed step counts, the optimizer's own session as optimizer bytes."""
    import profile_ops

    args = argparse.Namespace(workload=workload, impl="onnxtrain", steps=steps, eval_steps=0, threads=threads,
                              top=0, keep=None)
    keep = tempfile.mkdtemp(prefix="bench_floor_")
    try:
        return _step_bytes(profile_ops.profile(args, os.path.join(keep, workload)), steps)
    finally:
        shutil.rmtree(keep, ignore_errors=True)


def _step_bytes(files, steps):
    count, by = 0.0, collections.Counter()
    for path, label in files:
        with open(path) as f:
            events = json.load(f)
        runs = sorted((e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"),
                      key=lambda e: e["ts"])
        if len(runs) < steps:  # a session of the first step only (before the gradients were reset), or eval
            continue
        start = runs[0]["ts"] + runs[0]["dur"]
        per_run = len(runs) - 1
        optimizer_session = label.endswith("(optimizer)")
        for e in events:
            if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] >= start:
                a = e.get("args", {})
                moved = sum(int(a.get(key, 0)) for key in ("activation_size", "parameter_size", "output_size"))
                optimizer = optimizer_session or e["name"].startswith("optimizer/")
                by["optimizer" if optimizer else "training"] += moved / per_run
                count += 1 / per_run
    return count, by["optimizer"], by["training"]


def newest_steps():
    """{(workload, impl): step ms} of the newest benchmark run (lowest of its passes), or {}."""
    files = sorted(glob.glob(os.path.join(HERE, "results", "*.jsonl")))
    if not files:
        return {}, None
    lines = [json.loads(line) for line in open(files[-1])]
    run_id = [r for r in lines if r.get("impl") == "machine"][-1]["run_id"]
    steps = {}
    for r in lines:
        if r.get("run_id") == run_id and r.get("step_ms_median") is not None:
            key = (r["workload"], r["impl"])
            steps[key] = min(steps.get(key, float("inf")), r["step_ms_median"])
    return steps, run_id


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", default="mlp,mobilenetv2,bert_small")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--write", action="store_true", help="write the section into BENCHMARKS.md")
    args = p.parse_args(argv)
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    load = os.getloadavg()[0]
    bandwidth, matmul, per_node = machine_rates(args.threads)
    import workloads

    steps, run_id = newest_steps()
    rows = []
    for w in args.workloads.split(","):
        nodes, opt_bytes, train_bytes = profile_step(w, args.threads)
        f = workloads.flops(w)
        p_train = f["trainable_params"]
        rows.append(dict(workload=w, nodes=nodes, opt_bytes=opt_bytes, train_bytes=train_bytes,
                         flops=f["train_step_flops"], params=p_train, fused_adamw_bytes=7 * 4 * p_train,
                         onnxtrain=steps.get((w, "onnxtrain")), peer=steps.get((w, "peer")),
                         torch=steps.get((w, "torch"))))
    # The machine is shared: measured again at the end, the best of the two is its rate (a rate measured in a busy
    # moment made the FLOP floor exceed BERT's actual step).
    again = machine_rates(args.threads)
    bandwidth, matmul, per_node = max(bandwidth, again[0]), max(matmul, again[1]), min(per_node, again[2])
    end_load = os.getloadavg()[0]
    text = render(rows, bandwidth, matmul, per_node, (load, end_load), run_id)
    print(text)
    if args.write:
        path = os.path.join(os.path.dirname(HERE), "BENCHMARKS.md")
        old = open(path).read() if os.path.exists(path) else ""
        if MARK_BEGIN in old and MARK_END in old:
            new = old[:old.index(MARK_BEGIN)] + text + old[old.index(MARK_END) + len(MARK_END):]
        else:
            new = old.rstrip("\n") + "\n\n" + text + "\n"
        with open(path, "w") as f:
            f.write(new)


def render(rows, bandwidth, matmul, per_node, loads, run_id):
    ms = lambda s: f"{1e3 * s:.1f}"  # noqa: E731
    now = datetime.datetime.now(datetime.timezone.utc)
    out = [MARK_BEGIN, "## Floors: how fast a step can be on standard ONNX (issue 14)", "",
           f"`python bench/floor.py --write` ({now:%Y-%m-%dT%H:%MZ}, load average {loads[0]:.1f} -> {loads[1]:.1f} "
           "on 2 cores: the rates are the lowest times of many runs, the machine's best under that load). "
           f"Measured with onnxruntime, 2 threads: **memory bandwidth {bandwidth / 1e9:.1f} GB/s** (Add of two "
           f"64 MB vectors), **matmul {matmul / 1e9:.0f} GFLOP/s** (1024³ MatMul), **{1e6 * per_node:.1f} µs "
           "per node** (a chain of 200 tiny Adds). Bytes are what the profiled nodes of a training "
           "step read and write (onnxruntime's profiler: activation + parameter + output sizes), an upper bound "
           "on memory traffic. Floors in ms: bytes / bandwidth, FLOPs / matmul rate, nodes × node cost; "
           f"step times from benchmark run `{run_id}` (lowest pass). The last column divides the step's FLOPs by each "
           "step time: where it exceeds the measured matmul rate, the workload's matrix shapes run faster than the "
           "1024³ probe, and the FLOP floor is an estimate, not a bound.", "",
           "| workload | trainable params | nodes | training-graph MB | optimizer MB (fused AdamW kernel) | "
           "matmul GFLOP | floor: bytes | floor: FLOPs | floor: nodes | optimizer floor: graph / fused kernel "
           "| step onnxtrain / peer / torch | achieved GFLOP/s onnxtrain / peer / torch |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        step = " / ".join("–" if r[k] is None else f"{r[k]:.1f}" for k in ("onnxtrain", "peer", "torch"))
        achieved = " / ".join("–" if r[k] is None else f"{r['flops'] / r[k] / 1e6:.0f}"
                              for k in ("onnxtrain", "peer", "torch"))
        out.append(
            f"| {r['workload']} | {r['params']:,} | {r['nodes']:.0f} | {r['train_bytes'] / 1e6:.0f} | "
            f"{r['opt_bytes'] / 1e6:.0f} ({r['fused_adamw_bytes'] / 1e6:.0f}) | {r['flops'] / 1e9:.2f} | "
            f"{ms((r['train_bytes'] + r['opt_bytes']) / bandwidth)} | {ms(r['flops'] / matmul)} | "
            f"{ms(r['nodes'] * per_node)} | {ms(r['opt_bytes'] / bandwidth)} / "
            f"{ms(r['fused_adamw_bytes'] / bandwidth)} | {step} | {achieved} |")
    out.append(MARK_END)
    return "\n".join(out)


if __name__ == "__main__":
    main()
