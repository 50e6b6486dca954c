"""The personalization demo: its model and data, and a quick end-to-end run through the real entry point."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from onnxtrain.demo.digits import load_demo_data, user_style
from onnxtrain.demo.model import build_cnn


def test_model_is_valid_and_runs():
    model = build_cnn(seed=3)
    onnx.checker.check_model(model, full_check=True)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert session.run(None, {"image": np.zeros((5, 1, 8, 8), np.float32)})[0].shape == (5, 10)
    assert onnx.helper.printable_graph(build_cnn(3).graph) == onnx.helper.printable_graph(model.graph)


def test_user_style_and_splits():
    data = load_demo_data(seed=0)
    assert len(data.global_train) + len(data.global_val) == 1797 - 500
    assert (len(data.user_train), len(data.user_val), len(data.user_test)) == (200, 100, 200)
    styled, clean = data.user_test.x, data.user_clean.x
    assert styled.shape == clean.shape == (200, 1, 8, 8) and 0 <= styled.min() and styled.max() <= 1
    assert np.array_equal(data.user_test.y, data.user_clean.y)
    assert (styled > 0.5).mean() > (clean > 0.5).mean()  # bolder strokes
    assert np.abs(styled - clean).mean() > 0.1
    assert np.array_equal(user_style(clean[:3, 0]), styled[:3, 0])


def test_quick_demo_personalizes(tmp_path):
    out = tmp_path / "demo"
    proc = subprocess.run([sys.executable, "-m", "onnxtrain.demo", "--quick", "-o", str(out), "--progress", "none"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    text = proc.stdout
    for step in range(1, 7):
        assert f"[{step}/6]" in text
    before, after = (float(v) for v in re.search(r"went from ([\d.]+)% to ([\d.]+)%", text).groups())
    assert after >= before + 15, text
    assert "(same as in training)" in text  # the exported model gives the same accuracy in a plain session
    for path in ("model.onnx", "pretrained.onnx", "personalized.onnx", "device/run/last.ckpt",
                 "device/run/metrics.jsonl", "server/run/best.ckpt", "data/user_test.npz"):
        assert (out / path).is_file(), path
    session = ort.InferenceSession(str(out / "personalized.onnx"), providers=["CPUExecutionProvider"])
    test = np.load(out / "data" / "user_test.npz")
    accuracy = np.mean(session.run(None, {"image": test["x"]})[0].argmax(1) == test["y"])
    assert abs(100 * accuracy - after) < 0.06


def test_demo_never_replaces_a_folder_it_did_not_make(tmp_path, capsys):
    from onnxtrain.cli.main import main

    (tmp_path / "mine.txt").write_text("keep me")
    assert main(["demo", "--quick", "-o", str(tmp_path)]) == 1
    assert "was not made by the demo" in capsys.readouterr().err
    assert (tmp_path / "mine.txt").read_text() == "keep me"


def _distribution_closure(requirements: list[str]) -> set[str]:
    """Distributions that installing ``requirements`` pulls in, read from the installed packages' metadata."""
    from importlib import metadata

    from packaging.requirements import Requirement

    seen: set[str] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        name = req.name.lower().replace("_", "-")
        if name in seen or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
            continue
        seen.add(name)
        try:
            todo += [Requirement(r) for r in metadata.requires(name) or []]
        except metadata.PackageNotFoundError:
            pytest.skip(f"{name}, which the main job installs, is not installed here")
    return seen


def test_the_readme_main_job_installs_no_torch():
    """The main job's extras stay light: a transitive torch costs a fresh machine a multi-GB CUDA build."""
    tomllib = pytest.importorskip("tomllib")

    root = Path(__file__).resolve().parents[2]
    block = root.joinpath("README.md").read_text().split("```")[1]
    main_job = block.splitlines()[1]
    extras = re.search(r"-e '\.\[([^\]]*)\]'", main_job).group(1).split(",")
    project = tomllib.loads(root.joinpath("pyproject.toml").read_text())["project"]
    requirements = project["dependencies"] + [r for e in extras for r in project["optional-dependencies"][e]]
    pulled = _distribution_closure(requirements)
    assert "tqdm" in pulled and "onnxruntime" in pulled
    heavy = pulled & {"torch", "tensorflow", "jax"}
    assert not heavy, f"the main job's extras {extras} pull in {sorted(heavy)}"
