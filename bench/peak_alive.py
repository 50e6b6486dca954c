"""What is alive in onnxruntime's arena at a training step's peak, in the order onnxruntime actually ran it.

    python bench/peak_alive.py --workload resnet18                 # generate (spawned child), train, report
    python bench/peak_alive.py --workload resnet18 --artifacts DIR # artifacts generated beforehand
    options: --steps 3 --threads 2 --top 30 --keep DIR (keep the profiles and optimized models)
             --update-in-backward (the Optimizer updates each parameter during the backward)

Runs the artifacts with onnxtrain.api like the benchmark, with onnxruntime's profiler on and each session's
optimized graph saved (what onnxruntime runs after its own fusions). From the last profiled run of each
session it takes the execution order and the output shapes of every node, and the allocator's own counters
that onnxruntime records per node (bytes in use after the node ran, the arena's size). Then it replays the
run: a node's outputs are allocated when it runs and released after the last node that reads them ran
(onnxruntime's release plan), a Reshape-like node's output is its input's buffer. At the step where the
replay peaks it lists every live tensor: its producer, shape, MB and the node that reads it last.

The replayed peak counts tensors, not the kernels' scratch (a Conv's im2col buffer) nor the arena's
fragmentation; onnxruntime's own counters (printed beside it) count the scratch, and the arena's size minus
its peak use is the fragmentation. Process RSS (VmHWM) is printed after each step.
"""

import argparse
import collections
import gc
import glob
import json
import os
import sys
import tempfile

import common
import profile_ops

# Ops whose output is a view of their first input in onnxruntime's CPU kernels (no allocation).
ALIAS_OPS = {"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"}
DTYPE_BYTES = {"float": 4, "float16": 2, "double": 8, "int64": 8, "int32": 4, "int8": 1, "uint8": 1, "bool": 1}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", required=True, choices=sorted(common.SPECS))
    p.add_argument("--artifacts", metavar="DIR", help="artifacts generated beforehand (default: generate them)")
    p.add_argument("--steps", type=int, default=3, help="training steps; the last one is replayed (default 3)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--top", type=int, default=30, help="live tensors listed at the peak (default 30)")
    p.add_argument("--keep", metavar="DIR", help="write the profiles and optimized models here and keep them")
    p.add_argument("--update-in-backward", action="store_true", help="Optimizer(..., update_in_backward=True)")
    return p.parse_args(argv)


def status_mb():
    """(VmRSS, VmHWM) of this process in MiB."""
    values = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(rest.split()[0]) / 1024
    return values["VmRSS"], values["VmHWM"]


def record_sessions(so, prefix, labels):
    """Give each onnxruntime session its own profile file and optimized-model file under prefix."""
    import onnxruntime

    init = onnxruntime.InferenceSession.__init__

    def patched(self, path_or_bytes, sess_options=None, *args, **kwargs):
        if sess_options is so:
            if isinstance(path_or_bytes, bytes):  # name every node, so that the profile's names find them
                path_or_bytes = named_nodes(path_or_bytes)
            tag = f"{prefix}_{len(labels)}"
            so.profile_file_prefix = tag
            so.optimized_model_filepath = tag + ".onnx"
            labels.append(tag)
        init(self, path_or_bytes, sess_options, *args, **kwargs)

    onnxruntime.InferenceSession.__init__ = patched


def named_nodes(model_bytes):
    """The model with a name on every node (onnxruntime names unnamed nodes in its profile by its own index)."""
    import onnx

    model = onnx.load_from_string(model_bytes)
    names = {n.name for n in model.graph.node}
    for i, node in enumerate(model.graph.node):
        if not node.name:
            node.name = f"unnamed_{node.op_type}_{i}"
            assert node.name not in names
    return model.SerializeToString()


def train(args, prefix):
    """Run the training steps with profiling; return the session tags (profile prefix = optimized model)."""
    import run_onnxtrain as runner
    from onnxtrain import api

    outdir = args.artifacts
    if outdir is None:
        outdir = tempfile.mkdtemp(prefix="onnxtrain_peak_")
        common.generate_in_child({}, outdir, runner.generate, args.workload, outdir)
    so = common.session_options(args.threads, prefix)
    labels = []
    record_sessions(so, prefix, labels)
    print(f"after the imports: RSS {status_mb()[0]:.0f} MiB")
    options = {"update_in_backward": True} if args.update_in_backward else None
    train_step, eval_step = common.load_training(api, outdir, args.workload, so, {}, options)
    print(f"after loading: RSS {status_mb()[0]:.0f} MiB")
    for i in range(args.steps):
        train_step()
        rss, hwm = status_mb()
        print(f"after step {i + 1}: RSS {rss:.0f} MiB, peak (VmHWM) {hwm:.0f} MiB")
    del train_step, eval_step  # closes the sessions: onnxruntime writes the profiles then
    gc.collect()
    return labels


def last_run(profile_path):
    """The node events of a profile's last run, in execution order."""
    with open(profile_path) as f:
        events = json.load(f)
    runs = sorted((e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"),
                  key=lambda e: e["ts"])
    if not runs:
        return []
    start, end = runs[-1]["ts"], runs[-1]["ts"] + runs[-1]["dur"]
    nodes = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")
             and start <= e["ts"] <= end]
    return sorted(nodes, key=lambda e: e["ts"])


def tensor_bytes(type_shape):
    ((dtype, shape),) = type_shape.items()
    size = DTYPE_BYTES.get(dtype, 4)
    for d in shape:
        size *= d
    return size


def replay(model, events):
    """Replay one run. Returns (order, steps, live_at): the nodes in execution order, steps[i] = (event, live bytes
    after node i ran), and a function giving the live tensors after node i as (name, bytes, producer index, last
    reader index, shape)."""
    graph = model.graph
    by_name = {n.name: n for n in graph.node}
    outputs = {o.name for o in graph.output}
    # Nodes onnxruntime made itself (an inlined function's) have no name in the saved graph; the profile names
    # them after their op type and index. Match those to the unnamed nodes of that op type, in graph order.
    unnamed = collections.defaultdict(collections.deque)
    for n in graph.node:
        if not n.name:
            unnamed[n.op_type].append(n)
    order = [by_name.get(e["name"][: -len("_kernel_time")]) or unnamed[e["args"]["op_name"]].popleft()
             for e in events]
    position = {id(n): i for i, n in enumerate(order)}
    last_read = {}
    for i, node in enumerate(order):
        for name in node.input:
            if name:
                last_read[name] = i
    owner = {}   # tensor -> the tensor whose buffer it is (itself unless an alias)
    info = {}    # buffer -> [bytes, producer index, release index, shape]
    for i, (event, node) in enumerate(zip(events, order)):
        shapes = event["args"].get("output_type_shape", [])
        for k, name in enumerate(node.output):
            if not name or name in outputs or k >= len(shapes):
                continue
            if node.op_type in ALIAS_OPS and node.input[0] in owner:
                owner[name] = owner[node.input[0]]
            else:
                owner[name] = name
                info[name] = [tensor_bytes(shapes[k]), i, i, shapes[k]]
    for name, buffer in owner.items():
        info[buffer][2] = max(info[buffer][2], last_read.get(name, position.get(id(by_name.get(name)), 0)))
    delta = collections.Counter()
    for size, made, released, _ in info.values():
        delta[made] += size
        delta[released + 1] -= size
    steps, live = [], 0
    for i, event in enumerate(events):
        live += delta[i]
        steps.append((event, live))

    def live_at(i):
        return sorted(((name, size, made, released, shape) for name, (size, made, released, shape) in info.items()
                       if made <= i <= released), key=lambda t: -t[1])

    return order, steps, live_at


def report(tag, top):
    import onnx

    profiles = glob.glob(tag + "_*.json")
    if not profiles or not os.path.exists(tag + ".onnx"):
        return None
    events = last_run(max(profiles, key=os.path.getmtime))
    if not events:
        return None
    model = onnx.load(tag + ".onnx", load_external_data=False)
    order, steps, live_at = replay(model, events)
    peak_i = max(range(len(steps)), key=lambda i: steps[i][1])
    args = [e["args"] for e in events]
    in_use = [int(a.get("mem_bytes_in_use", 0)) for a in args]
    held = max(int(a.get("mem_arena_held", 0)) for a in args)
    ort_peak_i = max(range(len(in_use)), key=lambda i: in_use[i])
    mb = 1 / 2**20
    print(f"\n{os.path.basename(tag)}: {len(events)} nodes ({model.graph.name})")
    print(f"  replayed peak {steps[peak_i][1] * mb:.1f} MiB after node {peak_i} "
          f"({order[peak_i].op_type} {order[peak_i].name})")
    print(f"  onnxruntime's allocator: in use at most {max(in_use) * mb:.1f} MiB after node {ort_peak_i} "
          f"({order[ort_peak_i].op_type} {order[ort_peak_i].name}); arena held {held * mb:.1f} MiB "
          "(shared by every session of the process)")
    alive = live_at(peak_i)
    kinds = collections.Counter()
    for _, size, made, _, _ in alive:
        kinds[order[made].op_type] += size
    print("  live at the replayed peak, by producer op: "
          + ", ".join(f"{op} {size * mb:.1f}" for op, size in kinds.most_common()))
    print(f"  {'MiB':>7} {'shape':<22} {'made by (index op name)':<58} {'last read by':<40}")
    for _, size, made, released, shape in alive[:top]:
        dims = "x".join(map(str, next(iter(shape.values()))))
        maker = f"{made} {order[made].op_type} {order[made].name}"[:58]
        reader = f"{released} {order[released].op_type} {order[released].name}"[:40]
        print(f"  {size * mb:7.2f} {dims:<22} {maker:<58} {reader:<40}")
    return steps[peak_i][1]


def main(argv=None):
    args = parse_args(argv)
    profile_ops.ensure_interpreter("onnxtrain", __file__)
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    keep = args.keep or tempfile.mkdtemp(prefix="bench_peak_")
    os.makedirs(keep, exist_ok=True)
    tags = train(args, os.path.join(keep, args.workload))
    for tag in tags:
        report(tag, args.top)
    if args.keep:
        print(f"\nprofiles and optimized models: {keep}")


if __name__ == "__main__":
    sys.exit(main())
