"""Generation time, training-step time and peak RSS of one export, measured without torch in the process.

    python -m tests.zoo.measure MODEL.onnx BATCH.npz OUT_DIR [generate|train|both]   # prints one JSON line

BATCH.npz holds ``inputs`` and ``labels``. The report runs generation and training each in a fresh process,
so each peak RSS is onnxtrain's alone (generation; loading the artifacts and 20 AdamW steps), not torch's.
"""

from __future__ import annotations

import json
import resource
import sys
import time

import numpy as np


def measure(model_path: str, batch_path: str, out_dir: str, what: str = "both", steps: int = 20) -> dict:
    from onnxtrain import blocks
    from onnxtrain.api import CheckpointState, Module, Optimizer
    from onnxtrain.artifacts import LossType, generate_artifacts

    result = {"torch_loaded": "torch" in sys.modules, "rss": "VmHWM"}
    if what in ("generate", "both"):
        start = time.perf_counter()
        generate_artifacts(model_path, loss=LossType.CrossEntropyLoss, optimizer=blocks.AdamW(mode="torch"),
                           artifact_directory=out_dir)
        result["generate_s"] = time.perf_counter() - start
        if what == "generate":
            return {**result, "peak_rss_mb": _peak_rss_mb()}
    batch = np.load(batch_path)
    state = CheckpointState.load_checkpoint(f"{out_dir}/checkpoint")
    module = Module(f"{out_dir}/training_model.onnx", state)
    optimizer = Optimizer(f"{out_dir}/optimizer_model.onnx", module)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        module(batch["inputs"], batch["labels"])
        optimizer.step()
        module.lazy_reset_grad()
        times.append(time.perf_counter() - start)
    return {**result, "step_ms": 1e3 * float(np.median(times[2:])), "peak_rss_mb": _peak_rss_mb()}


def _peak_rss_mb() -> float:
    """This process's own peak RSS: VmHWM (ru_maxrss keeps the forking parent's high-water mark across exec,
    so a child of the torch-laden report would report the report's memory)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


if __name__ == "__main__":
    print(json.dumps(measure(*sys.argv[1:5])))
