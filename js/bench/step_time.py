"""Python onnxtrain's step time on the same cases as bench/step-time.js: python bench/step_time.py FIXTURES_DIR."""

import statistics
import sys
import time
from pathlib import Path

import safetensors.numpy

from onnxtrain.api import CheckpointState, Module, Optimizer

for case in ("mlp_adamw", "cnn_adamw"):
    folder = Path(sys.argv[1]) / case
    data = safetensors.numpy.load_file(str(folder / "data.safetensors"))
    module = Module(folder / "training_model.onnx", CheckpointState.load_checkpoint(folder / "checkpoint"))
    optimizer = Optimizer(folder / "optimizer_model.onnx", module)
    times = []
    for i in range(33):
        started = time.perf_counter()
        module(data["x/0"], data["y/0"])
        optimizer.step()
        module.lazy_reset_grad()
        if i >= 3:
            times.append((time.perf_counter() - started) * 1000)
    print(f"{case}: Python onnxtrain {statistics.median(times):.2f} ms")
