"""Parity with onnxruntime-training 1.19.2 (the peer): the same 20-step script, the same losses.

The peer needs its own environment (torch at import, an old onnxruntime): the test looks for its interpreter
in $ONNXTRAIN_PEER_PYTHON or bench/.peer-venv (created by `python bench/run.py`) and is skipped without one.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import textwrap
from pathlib import Path

import numpy as np
import pytest

from onnxtrain.api import CheckpointState, Module, Optimizer
from onnxtrain.artifacts import LossType, OptimType, generate_artifacts

ROOT = Path(__file__).resolve().parents[2]
STEPS = 20

PEER_SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    sys.path.insert(0, sys.argv[1])
    import run_peer
    from onnxruntime.training import artifacts
    from onnxruntime.training.api import CheckpointState, Module, Optimizer
    model, out, optim, lr, steps = sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5]), int(sys.argv[6])
    import os
    os.makedirs(out, exist_ok=True)
    data = np.load(sys.argv[7])
    import onnx
    m = onnx.load(model)
    params = [i.name for i in m.graph.initializer]
    artifacts.generate_artifacts(m, requires_grad=params, loss=artifacts.LossType.CrossEntropyLoss,
                                 optimizer=getattr(artifacts.OptimType, optim), artifact_directory=out)
    run_peer.fix_artifacts(out)
    state = CheckpointState.load_checkpoint(f"{out}/checkpoint")
    module = Module(f"{out}/training_model.onnx", state, f"{out}/eval_model.onnx")
    opt = Optimizer(f"{out}/optimizer_model.onnx", module)
    opt.set_learning_rate(lr)
    losses = []
    for i in range(steps):
        losses.append(float(module(data["x"][i], data["y"][i])))
        opt.step()
        module.lazy_reset_grad()
    print(json.dumps(losses))
""")


def _clean_env() -> dict[str, str]:
    """The environment without PYTHONPATH/PYTHONHOME, which would put this venv's onnxruntime first."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


@functools.lru_cache(maxsize=1)
def peer_python() -> str | None:
    for candidate in (os.environ.get("ONNXTRAIN_PEER_PYTHON"), ROOT / "bench" / ".peer-venv" / "bin" / "python"):
        if candidate and Path(candidate).exists():
            probe = subprocess.run([str(candidate), "-c", "import onnxruntime.training.api"], env=_clean_env(),
                                   capture_output=True, timeout=300)
            if probe.returncode == 0:
                return str(candidate)
    return None


@pytest.mark.skipif(peer_python() is None, reason="onnxruntime-training 1.19.2 environment not found "
                    "(set ONNXTRAIN_PEER_PYTHON or run `python bench/run.py` once to create bench/.peer-venv)")
@pytest.mark.parametrize("optimizer, lr", [("AdamW", 1e-3), ("SGD", 0.05)])
def test_losses_agree_with_the_peer_at_every_step(optimizer, lr, workloads, tmp_path):
    w = workloads("mlp")
    rng = np.random.default_rng(0)
    x = np.tile(rng.standard_normal((4, 64, 784)).astype(np.float32), (STEPS // 4, 1, 1))  # 4 batches, cycled
    y = np.tile(rng.integers(0, 10, (4, 64)).astype(np.int64), (STEPS // 4, 1))
    np.savez(tmp_path / "data.npz", x=x, y=y)
    script = tmp_path / "peer.py"
    script.write_text(PEER_SCRIPT)
    result = subprocess.run([peer_python(), str(script), str(ROOT / "bench"), str(w.onnx_path), str(tmp_path / "peer"),
                             optimizer, str(lr), str(STEPS), str(tmp_path / "data.npz")],
                            capture_output=True, text=True, timeout=600, env=_clean_env())
    assert result.returncode == 0, result.stderr[-2000:]
    peer = json.loads(result.stdout.strip().splitlines()[-1])

    generate_artifacts(str(w.onnx_path), requires_grad=w.trainable, loss=LossType.CrossEntropyLoss,
                       optimizer=getattr(OptimType, optimizer), artifact_directory=tmp_path / "ours")
    state = CheckpointState.load_checkpoint(tmp_path / "ours" / "checkpoint")
    module = Module(tmp_path / "ours" / "training_model.onnx", state)
    opt = Optimizer(tmp_path / "ours" / "optimizer_model.onnx", module)
    opt.set_learning_rate(lr)
    ours = []
    for i in range(STEPS):
        ours.append(float(module(x[i], y[i])))
        opt.step()
        module.lazy_reset_grad()
    np.testing.assert_allclose(ours, peer, rtol=1e-4)
    assert ours[-1] < ours[0]
