"""Resident memory growth over many training steps (issue 14's target: under 5 MB over 1,000 steps).

    python bench/rss_growth.py WORKLOAD [STEPS]     # default 1000; run with the onnxtrain environment

Generates the workload's artifacts as the benchmark does (in a spawned child), trains 50 warm-up steps through
onnxtrain.api, then STEPS more, and prints the RSS (/proc/self/statm) before and after them.
"""

import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import common  # noqa: E402


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main():
    import run_onnxtrain as runner

    workload, steps = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1000
    outdir = tempfile.mkdtemp(prefix="rss_growth_")
    rec = {}
    common.generate_in_child(rec, outdir, runner.generate, workload, outdir)
    from onnxtrain import api

    train_step, _ = common.load_training(api, outdir, workload, common.session_options(2), rec)
    for _ in range(50):
        train_step()
    before, t = rss_mib(), time.perf_counter()
    for _ in range(steps):
        loss = train_step()
    after = rss_mib()
    print(f"{workload}: RSS after 50 warm-up steps {before:.1f} MiB, after {steps} more {after:.1f} MiB: growth "
          f"{after - before:+.2f} MiB ({time.perf_counter() - t:.0f} s, loss {loss:.3g}, "
          f"load {os.getloadavg()[0]:.1f})", flush=True)


if __name__ == "__main__":
    main()
