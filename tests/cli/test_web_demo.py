"""`onnxtrain web-demo` without a browser: the artifacts it prepares, what its server serves, its errors.
(tests/js/test_web_demo.py drives the page in Chromium.)"""

from __future__ import annotations

import http.client
import json
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest
from safetensors.numpy import load_file

from onnxtrain.api import CheckpointState
from onnxtrain.cli.common import CliError
from onnxtrain.cli.web_demo import (
    DEMO_FILE,
    FORMAT,
    HELDOUT_FILE,
    REPLAY_FILE,
    find_js_dir,
    make_server,
    prepare_artifacts,
)
from onnxtrain.conventions import TrainStepMeta
from tests.cli.conftest import assert_one_line_error, run_cli

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("web-demo") / "artifacts"
    prepare_artifacts(folder, epochs=1, say=lambda *_: None)
    return folder


def test_artifacts_train_the_head_and_ship_digits(artifacts):
    meta = json.loads((artifacts / DEMO_FILE).read_text())
    assert meta["classes"] == 10 and meta["steps"] > 0 and meta["learning_rate"] > 0
    state = CheckpointState.load_checkpoint(str(artifacts / "checkpoint"))
    trainable = sorted(n for n, p in state.parameters.items() if p.requires_grad)
    assert trainable == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]
    heldout, replay = load_file(str(artifacts / HELDOUT_FILE)), load_file(str(artifacts / REPLAY_FILE))
    assert heldout["x"].shape == (meta["heldout"], 1, 8, 8) and heldout["y"].dtype == np.int64
    assert np.bincount(replay["y"], minlength=10).tolist() == [20] * 10
    assert 0 <= heldout["x"].min() and heldout["x"].max() <= 1  # the page multiplies by 16
    # The held-out digits are not among the pre-training ones (of which the replay digits are a part).
    seen = {row.tobytes() for row in replay["x"]}
    assert not any(row.tobytes() in seen for row in heldout["x"])
    # The page trains with one session run per step: the train-step model, built for the usual loop.
    assert TrainStepMeta.from_model(onnx.load(artifacts / "train_step_model.onnx")).reset is True


def test_artifacts_are_reused_and_foreign_folders_refused(artifacts, tmp_path):
    said = []
    before = (artifacts / "checkpoint").stat().st_mtime_ns
    assert prepare_artifacts(artifacts, say=said.append)["format"] == FORMAT
    assert "reusing" in said[0] and (artifacts / "checkpoint").stat().st_mtime_ns == before
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(CliError, match="was not made by the web demo"):
        prepare_artifacts(tmp_path, epochs=1, say=lambda *_: None)
    assert (tmp_path / "notes.txt").read_text() == "mine"
    # A folder an interrupted run left (marked, no demo.json) is made again.
    unfinished = tmp_path / "unfinished"
    shutil.copytree(artifacts, unfinished)
    (unfinished / DEMO_FILE).unlink()
    said.clear()
    prepare_artifacts(unfinished, epochs=1, say=said.append)
    assert "pre-training" in said[0] and (unfinished / DEMO_FILE).is_file()
    # A folder of an older format (no train-step model) is made again too.
    (unfinished / "train_step_model.onnx").unlink()
    said.clear()
    prepare_artifacts(unfinished, epochs=1, say=said.append)
    assert "pre-training" in said[0] and (unfinished / "train_step_model.onnx").is_file()


def get(server, path: str) -> http.client.HTTPResponse:
    connection = http.client.HTTPConnection(*server.server_address[:2], timeout=10)
    connection.request("GET", path)
    return connection.getresponse()


def test_server_serves_only_the_page_files(artifacts):
    server = make_server(REPO / "js", artifacts, port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        root = get(server, "/")
        assert root.status == 302 and root.getheader("Location") == "/js/demo/index.html"
        page = get(server, "/js/demo/index.html")
        assert page.status == 200 and b"/js/demo/demo.js" in page.read()
        assert page.getheader("Cross-Origin-Embedder-Policy") == "require-corp"
        assert get(server, "/js/src/index.js").getheader("Content-Type") == "text/javascript"
        meta = get(server, f"/artifacts/{DEMO_FILE}")
        assert meta.status == 200 and json.loads(meta.read())["classes"] == 10
        for outside in ("/js/src/../../pyproject.toml", "/js/src/%2e%2e/package.json", "/js/package.json",
                        "/artifacts/../", "/js/node_modules/puppeteer-core/package.json", "/js/demo/missing.js"):
            assert get(server, outside).status == 404, outside
    finally:
        server.shutdown()
        server.server_close()


def test_busy_port_is_a_clear_error(artifacts):
    first = make_server(REPO / "js", artifacts, port=0)
    try:
        with pytest.raises(CliError, match=f"cannot listen on 127.0.0.1:{first.server_address[1]}.*--port"):
            make_server(REPO / "js", artifacts, port=first.server_address[1])
    finally:
        first.server_close()


def test_symlinked_node_modules_are_served(artifacts, tmp_path):
    if not (REPO / "js" / "node_modules" / "onnxruntime-web").is_dir():
        pytest.skip("js/node_modules/onnxruntime-web is missing: run `npm ci` in js/ (see .ci/run)")
    js = tmp_path / "js"
    for part in ("src", "demo", "node_modules"):
        (js / part).parent.mkdir(exist_ok=True)
        (js / part).symlink_to(REPO / "js" / part)
    server = make_server(find_js_dir(js), artifacts, port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert get(server, "/js/node_modules/onnxruntime-web/dist/ort.wasm.min.mjs").status == 200
        assert get(server, "/js/demo/index.html").status == 200
    finally:
        server.shutdown()
        server.server_close()


def test_js_dir_errors_say_what_to_do(tmp_path):
    with pytest.raises(CliError, match="is not onnxtrain's js/ folder"):
        find_js_dir(tmp_path)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "index.js").write_text("")
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "index.html").write_text("")
    with pytest.raises(CliError, match=f"run `npm ci` in {tmp_path}"):
        find_js_dir(tmp_path)


def test_command_errors_are_one_line(tmp_path):
    proc = run_cli("web-demo", "--js-dir", tmp_path, "--no-open", "--artifacts", tmp_path / "a")
    assert_one_line_error(proc, "is not onnxtrain's js/ folder")
    assert not (tmp_path / "a").exists()  # nothing is trained before the page's files are found


def test_command_serves_until_interrupted(artifacts):
    if not (REPO / "js" / "node_modules" / "onnxruntime-web").is_dir():
        pytest.skip("js/node_modules/onnxruntime-web is missing: run `npm ci` in js/ (see .ci/run)")
    # Ctrl-C in a terminal: SIGINT with its default action. A test run started in the background (`cmd &` in a
    # script) hands its children SIGINT ignored, and Python then installs no KeyboardInterrupt handler, so the
    # server would not stop. -X faulthandler: a server that does not stop prints where it is stuck when SIGABRT
    # ends it below.
    proc = subprocess.Popen([sys.executable, "-X", "faulthandler", "-m", "onnxtrain.cli", "web-demo", "--port", "0",
                             "--no-open", "--artifacts", str(artifacts)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        lines = [proc.stdout.readline(), proc.stdout.readline()]
        assert "reusing" in lines[0], lines
        url = re.search(r"http://127\.0\.0\.1:(\d+)/", lines[1])
        assert url, lines
        connection = http.client.HTTPConnection("127.0.0.1", int(url.group(1)), timeout=10)
        connection.request("GET", "/js/node_modules/onnxruntime-web/dist/ort.wasm.min.mjs")
        assert connection.getresponse().status == 200
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            out, err = proc.communicate(timeout=20)
            pytest.fail(f"the server did not stop within 60 s of SIGINT; its threads then:\n{err[-4000:]}")
    assert proc.returncode == 0 and out.strip().endswith("stopped"), (out, err)
