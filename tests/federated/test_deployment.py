"""Flower's deployment runtime on loopback: a SuperLink, two SuperNodes and `flwr run`, as docs/federated.md says.

Slow (about a minute: every message starts a ClientApp process), so not part of the default run:
``pytest -m slow tests/federated/test_deployment.py``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr")

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_port(port: int, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with code {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout}s")


@pytest.fixture
def federation(tmp_path):
    """Start a SuperLink and two SuperNodes on loopback; stop them (and their children) afterwards."""
    env = dict(os.environ, FLWR_HOME=str(tmp_path / "flwr-home"), FLWR_TELEMETRY_ENABLED="0",
               FLWR_DISABLE_UPDATE_CHECK="1", RAY_USAGE_STATS_ENABLED="0",
               PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")   # they start flower-superexec, flwr-*app
    link_port, procs = _free_port(), []

    def start(*args, log):
        procs.append(subprocess.Popen([str(BIN / args[0]), *args[1:]], env=env, stdout=open(tmp_path / log, "w"),
                                      stderr=subprocess.STDOUT, start_new_session=True))
        return procs[-1]

    try:
        link = start("flower-superlink", "--insecure", "--disable-runtime-dependency-installation",
                     "--host", "127.0.0.1", "--port", str(link_port), log="superlink.log")
        _wait_for_port(link_port, link)
        for pid in range(2):
            node_port = _free_port()
            node = start("flower-supernode", "--insecure", "--superlink", f"127.0.0.1:{link_port}",
                         "--port", str(node_port), "--node-config", f"partition-id={pid} num-partitions=2",
                         log=f"supernode{pid}.log")
            _wait_for_port(node_port, node)
        Path(env["FLWR_HOME"]).mkdir(exist_ok=True)
        (Path(env["FLWR_HOME"]) / "config.toml").write_text(
            f'[superlink]\ndefault = "loopback"\n\n[superlink.loopback]\naddress = "127.0.0.1:{link_port}"\n'
            "insecure = true\n")
        yield env
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def test_flwr_run_on_superlink_and_supernodes(tmp_path, federation):
    from onnxtrain.api import CheckpointState
    from onnxtrain.federated.app import app_pyproject
    from onnxtrain.federated.example import build_artifacts, test_set

    build_artifacts(tmp_path / "artifacts")
    x, y = test_set()
    import numpy as np

    np.savez(tmp_path / "test.npz", x=x, y=y)
    app_dir = tmp_path / "app"
    app_dir.mkdir()
    (app_dir / "pyproject.toml").write_text(app_pyproject(
        artifacts_dir=str(tmp_path / "artifacts"), output_dir=str(tmp_path / "global"), num_server_rounds=2,
        min_nodes=2, test_data=str(tmp_path / "test.npz")))
    result = subprocess.run([str(BIN / "flwr"), "run", str(app_dir), "loopback", "--stream"], env=federation,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    history = [json.loads(line) for line in (tmp_path / "global" / "history.jsonl").read_text().splitlines()]
    assert [r["round"] for r in history] == [0, 1, 2], result.stdout[-3000:]
    assert all(r["accepted"] == 2 for r in history[1:])
    assert history[2]["accuracy"] > history[0]["accuracy"] + 0.3
    CheckpointState.load_checkpoint(tmp_path / "global" / "checkpoint")
