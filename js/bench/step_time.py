"""Python onnxtrain's step time on the same cases as bench/step-time.js: python bench/step_time.py FIXTURES_DIR.

As there: 20 warm-up steps, then the median over 7 rounds of 10 (CNN) or 50 (MLP) steps.
"""

import statistics
import sys
import time
from pathlib import Path

import safetensors.numpy

from onnxtrain.api import CheckpointState, Module, Optimizer


def train(module: Module, optimizer: Optimizer, data: dict, steps: int) -> float:
    """Milliseconds per step over ``steps`` steps on the first batch."""
    started = time.perf_counter()
    for _ in range(steps):
        module(data["x/0"], data["y/0"])
        optimizer.step()
        module.lazy_reset_grad()
    return (time.perf_counter() - started) * 1000 / steps


for case in ("mlp_adamw", "cnn_adamw"):
    folder = Path(sys.argv[1]) / case
    data = safetensors.numpy.load_file(str(folder / "data.safetensors"))
    module = Module(folder / "training_model.onnx", CheckpointState.load_checkpoint(folder / "checkpoint"))
    optimizer = Optimizer(folder / "optimizer_model.onnx", module)
    train(module, optimizer, data, 20)
    steps = 50 if case.startswith("mlp") else 10
    rounds = [train(module, optimizer, data, steps) for _ in range(7)]
    print(f"{case}: Python onnxtrain {statistics.median(rounds):.2f} ms")
