"""The JavaScript package (js/) on onnxruntime-node, onnxruntime-web (WebAssembly) and in headless Chromium.

The Node.js test runner trains the artifacts reference.py writes and compares with Python's results (see
js/test/); here we run it, then load every checkpoint JavaScript wrote back in Python. Skipped, with the
reason, when node/npm or Chromium are missing (.ci/run installs them).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from onnxtrain.api import CheckpointState
from onnxtrain.checkpoint import load_checkpoint
from tests.js import reference

JS = reference.ROOT / "js"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory) -> Path:
    if shutil.which("node") is None:
        pytest.skip("node is not installed: the JavaScript tests need Node.js >= 18 and npm (see .ci/run)")
    if not (JS / "node_modules").is_dir():
        if shutil.which("npm") is None:
            pytest.skip("npm is not installed: it installs js/'s dependencies (npm ci in js/)")
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=JS, check=True)
    out = tmp_path_factory.mktemp("js")
    reference.main(out)
    return out


def run_node_tests(fixtures: Path, *files: str) -> None:
    env = {**os.environ, "ONNXTRAIN_JS_FIXTURES": str(fixtures)}
    result = subprocess.run(["node", "--test", *files], cwd=JS, env=env, capture_output=True, text=True, timeout=300)
    output = f"{result.stdout[-6000:]}\n{result.stderr[-3000:]}"
    assert result.returncode == 0, f"node --test {' '.join(files)} failed:\n{output}"


def assert_loads_back(js_file: Path, expected_file: Path) -> None:
    """The checkpoint JavaScript wrote loads in Python and holds Python's result (relative 1e-5)."""
    got, want = load_checkpoint(js_file), load_checkpoint(expected_file)
    assert got.step == want.step
    pairs = [(got.trainable[n], w) for n, w in want.trainable.items()]
    pairs += [(got.optimizer[p][s], w) for p, states in want.optimizer.items() for s, w in states.items()]
    for actual, wanted in pairs:
        assert np.abs(actual - wanted).max() <= 1e-5 * max(np.abs(wanted).max(), 1e-30)
    assert CheckpointState.load_checkpoint(js_file).step == want.step


def assert_exports_as_evaluated(fixtures: Path, case: str, js_file: Path) -> None:
    """The inference model exported (in Python) from the checkpoint JavaScript trained gives the eval output
    JavaScript's runEvalStep matched (reference.safetensors' ``eval/output``, relative 1e-5)."""
    import onnxruntime as ort
    import safetensors.numpy

    from onnxtrain.api import Module

    folder = fixtures / case
    info = reference.CASES[case]
    steps, output = info[3], reference.build_model(info[0])[2]
    module = Module(folder / "training_model.onnx", CheckpointState.load_checkpoint(js_file),
                    folder / "eval_model.onnx")
    exported = folder / f"{js_file.stem}.inference.onnx"
    module.export_model_for_inferencing(exported, [output])
    session = ort.InferenceSession(str(exported), providers=["CPUExecutionProvider"])
    x = safetensors.numpy.load_file(str(folder / "data.safetensors"))[f"x/{steps}"]
    got = session.run([output], {session.get_inputs()[0].name: x})[0]
    want = safetensors.numpy.load_file(str(folder / "reference.safetensors"))["eval/output"]
    assert np.abs(got - want).max() <= 1e-5 * max(np.abs(want).max(), 1e-30), case


def test_node_and_wasm(fixtures):
    run_node_tests(fixtures, "test/checkpoint.test.js", "test/training.test.js", "test/train-step.test.js")
    for engine in ("node", "web"):
        for case in reference.CASES:
            assert_loads_back(fixtures / case / f"js_{engine}.ckpt", fixtures / case / "expected.ckpt")
            assert_exports_as_evaluated(fixtures, case, fixtures / case / f"js_{engine}.ckpt")
        assert_loads_back(fixtures / "resume" / f"js_{engine}.ckpt", fixtures / reference.RESUME_CASE / "expected.ckpt")


def test_input_and_engine_errors(fixtures):
    """Labels checked before a run (as runtime/inputs.py does) and engine failures named (as engine_errors.py)."""
    run_node_tests(fixtures, "test/input-checks.test.js", "test/engine-errors.test.js", "test/size-limits.test.js")


def test_chromium(fixtures):
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}: apt-get install -y chromium (or set CHROMIUM) to run the browser test")
    run_node_tests(fixtures, "test/browser.test.js")
    for case in ("mlp_sgd", "mlp_adamw", "cnn_adamw"):
        assert_loads_back(fixtures / case / "js_browser.ckpt", fixtures / case / "expected.ckpt")
        assert_exports_as_evaluated(fixtures, case, fixtures / case / "js_browser.ckpt")
    assert_loads_back(fixtures / "resume" / "js_browser.ckpt", fixtures / reference.RESUME_CASE / "expected.ckpt")


def test_type_declarations(fixtures):
    """The .d.ts files describe the documented usage (tsc, no emit)."""
    result = subprocess.run(["npx", "--no-install", "tsc", "-p", "tsconfig.json"], cwd=JS, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_javascript_reads_the_labels_range_python_reads(fixtures, tmp_path):
    """classLabelInputs (JavaScript) and class_label_inputs (Python) agree on a graph whose loss has a negative
    ignore_index (a 10-byte int64 varint) and labels reshaped before the loss."""
    import json

    from onnxtrain import blocks
    from onnxtrain.artifacts import generate_artifacts
    from onnxtrain.runtime.inputs import class_label_inputs
    from tests import models

    paths = generate_artifacts(models.mlp(classes=6), loss=blocks.CrossEntropyLoss(ignore_index=-100),
                               artifact_directory=tmp_path)
    script = ("import { readFileSync } from 'node:fs';"
              "import { classLabelInputs } from './src/runtime/model-metadata.js';"
              "const found = classLabelInputs(new Uint8Array(readFileSync(process.argv[1])));"
              "console.log(JSON.stringify(found, (k, v) => typeof v === 'bigint' ? Number(v) : v));")
    for kind in ("training", "eval"):
        result = subprocess.run(["node", "--input-type=module", "-e", script, str(paths[kind])], cwd=JS,
                                capture_output=True, text=True, timeout=60, check=True)
        python = class_label_inputs(__import__("onnx").load(paths[kind]))["labels"]
        assert json.loads(result.stdout) == {"labels": {"loss": python.loss, "classes": python.classes,
                                                        "ignoreIndex": python.ignore_index}}
        assert python.classes == 6 and python.ignore_index == -100


def test_javascript_reads_the_token_id_tables_python_reads(fixtures, tmp_path):
    """tableIndexInputs (JavaScript) and table_index_inputs (Python) agree on generated artifacts whose token ids
    index a trained embedding, and on the same graphs with that embedding frozen (a table of the checkpoint's
    frozen parameters) or trained and passed as trainable only."""
    import json

    import onnx

    from onnxtrain.artifacts import LossType, generate_artifacts
    from onnxtrain.conventions import TrainingMeta
    from onnxtrain.runtime.inputs import table_index_inputs
    from tests import models

    script = ("import { readFileSync } from 'node:fs';"
              "import { tableIndexInputs } from './src/runtime/model-metadata.js';"
              "const found = tableIndexInputs(new Uint8Array(readFileSync(process.argv[1])), "
              "JSON.parse(process.argv[2]));"
              "console.log(JSON.stringify(found));")
    for requires_grad in (None, ["fc"]):
        folder = tmp_path / ("all" if requires_grad is None else "head")
        paths = generate_artifacts(models.position_classifier("slice"), requires_grad=requires_grad,
                                   loss=LossType.CrossEntropyLoss, artifact_directory=folder)
        for kind in ("training", "eval"):
            model = onnx.load(paths[kind])
            meta = TrainingMeta.from_model(model)
            parameters = [*meta.trainable, *meta.frozen]
            result = subprocess.run(["node", "--input-type=module", "-e", script, str(paths[kind]),
                                     json.dumps(parameters)], cwd=JS, capture_output=True, text=True, timeout=60,
                                    check=True)
            python = {name: {"table": t.table, "rows": t.rows}
                      for name, t in table_index_inputs(model, parameters).items()}
            assert json.loads(result.stdout) == python, (requires_grad, kind)
            assert python == {"ids": {"table": "tokens", "rows": models.VOCAB}}, (requires_grad, kind)
