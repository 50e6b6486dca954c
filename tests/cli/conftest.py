"""Fixtures for the command-line tests: the demo CNN, a digits dataset, and generated artifacts (built once)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from onnxtrain.demo.model import build_cnn


def run_cli(*args: str, cwd: Path | None = None, env_path: Path | None = None, timeout: float = 120,
            ) -> subprocess.CompletedProcess:
    """``python -m onnxtrain.cli ARGS`` in a subprocess; ``env_path`` goes first on PYTHONPATH (to hide modules)."""
    env = dict(os.environ)
    if env_path is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(env_path), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "onnxtrain.cli", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def assert_one_line_error(proc: subprocess.CompletedProcess, *fragments: str) -> str:
    """A user error: non-zero exit, exactly one stderr line ``onnxtrain: error: ...``, no traceback."""
    err = proc.stderr.strip()
    assert proc.returncode != 0, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, proc.stderr
    assert len(err.splitlines()) == 1, err
    assert err.startswith("onnxtrain: error: "), err
    for fragment in fragments:
        assert fragment in err, err
    return err


def hide_modules(folder: Path, *names: str) -> Path:
    """A folder to put first on PYTHONPATH so that ``import NAME`` fails as if NAME were not installed."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / f"{name}.py").write_text(f"raise ImportError('{name} is hidden by the test')\n")
    return folder


@pytest.fixture(scope="session")
def workdir(tmp_path_factory) -> Path:
    """Session folder holding a CNN model, digits datasets and one generated artifact folder."""
    from sklearn.datasets import load_digits

    root = tmp_path_factory.mktemp("cli")
    onnx.save(build_cnn(seed=0), root / "cnn.onnx")
    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None]
    y = digits.target.astype(np.int64)
    np.savez(root / "train.npz", x=x[:320], y=y[:320])
    np.savez(root / "val.npz", x=x[320:400], y=y[320:400])
    proc = run_cli("generate", root / "cnn.onnx", "-o", root / "arts", "--loss", "cross-entropy", "--epochs", "2",
                   "--lr", "3e-3", "--batch-size", "32")
    assert proc.returncode == 0, proc.stderr
    return root


@pytest.fixture
def arts(workdir, tmp_path) -> Path:
    """A private copy of the generated artifacts (tests train into it)."""
    target = tmp_path / "arts"
    shutil.copytree(workdir / "arts", target)
    return target
