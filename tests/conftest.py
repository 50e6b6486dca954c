"""Shared fixtures: the benchmark workloads (torch models from bench/workloads.py) exported to ONNX once."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


class Workload:
    """A bench workload: its torch model, ONNX export, parameter split and fixed batch."""

    def __init__(self, name: str, folder: Path):
        torch = pytest.importorskip("torch")
        if str(BENCH) not in sys.path:
            sys.path.insert(0, str(BENCH))
        import common
        import workloads

        self.name = name
        self.onnx_path = folder / f"{name}.onnx"
        self.model = workloads.export_onnx(name, str(self.onnx_path))
        self.trainable, frozen = workloads.param_split(self.model)
        self.frozen_params = [n for n, p in self.model.named_parameters() if not p.requires_grad]
        self.x, self.y = common.make_batch(name)
        self.torch = torch

    def fresh_model(self):
        """A new torch model with the exported initial weights (build() is seeded)."""
        import workloads

        return workloads.build(self.name)


@pytest.fixture(scope="session")
def workloads(tmp_path_factory):
    """``workloads(name)`` -> Workload, exported once per session."""
    folder = tmp_path_factory.mktemp("workloads")
    cache: dict[str, Workload] = {}

    def get(name: str) -> Workload:
        if name not in cache:
            cache[name] = Workload(name, folder)
        return cache[name]

    return get


@pytest.fixture
def rng():
    return np.random.default_rng(0)
