"""Zoo fixtures: each (model, exporter) is exported and its artifacts generated once per session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def zoo_run(tmp_path_factory):
    """``zoo_run(name, exporter)`` -> harness.Run, built once per session (export and generation errors are
    recorded on the Run, and each check that needs the artifacts fails with them)."""
    pytest.importorskip("torch")
    from tests.zoo.harness import Run, initial_model
    from tests.zoo.models import ZOO

    runs, models = {}, {}

    def get(name: str, exporter: str):
        if (name, exporter) not in runs:
            if name not in models:
                models[name] = initial_model(ZOO[name])
            folder = tmp_path_factory.mktemp(f"{name}-{exporter}")
            runs[name, exporter] = Run(ZOO[name], exporter, folder, models[name])
        return runs[name, exporter]

    return get
