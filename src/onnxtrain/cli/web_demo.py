"""`onnxtrain web-demo`: personalize a pretrained digit classifier in the browser, on the stock onnxruntime-web.

The command prepares the artifacts once (a small CNN pre-trained for a few seconds on scikit-learn's 8x8 digits,
then training artifacts for its classifier head, with the train-step model so that a step is one session run,
and a held-out set of digits), and serves, on 127.0.0.1, a page where one draws digits, labels a few, trains
the head in the browser with js/'s TrainingSession and downloads the checkpoint (it loads in Python's
``CheckpointState.load_checkpoint``). The page and the JavaScript package live in the repository's js/ folder,
which the Python wheel does not ship: run from a clone, after ``npm ci`` in js/. Nothing is downloaded at run
time.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import webbrowser
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np

from onnxtrain.cli.common import CliError
from onnxtrain.conventions import ARTIFACT_FILES, artifact_file

__all__ = ["add_parser", "run", "prepare_artifacts", "find_js_dir", "make_server", "DEMO_FILE", "HELDOUT_FILE",
           "REPLAY_FILE"]

DEMO_FILE = "demo.json"           # what the page needs to know; written last, so it marks a finished folder
MARKER = ".onnxtrain-web-demo"    # written first: a folder the web demo made (and may fill again)
HELDOUT_FILE = "heldout.safetensors"
REPLAY_FILE = "replay.safetensors"  # pre-training digits the page mixes into each step, so the head keeps them
FORMAT = 2                        # bump when the page needs different artifacts; older folders are rebuilt
ORT_WEB = ("node_modules", "onnxruntime-web", "dist", "ort.wasm.min.mjs")
PRETRAIN_EPOCHS = 8
HELDOUT = 300                     # digits the pre-training never sees: the page's "held-out" accuracy
REPLAY_PER_CLASS = 20
TRAINABLE_OPS = 3                 # fc1 -> Relu -> fc2: the classifier head, as in `onnxtrain demo`

# URL prefix -> folder (relative to js/, or the artifacts folder); nothing outside these is served.
_JS_ROUTES = {"/js/demo/": ("demo",), "/js/src/": ("src",), "/js/node_modules/onnxruntime-web/dist/": ORT_WEB[:-1]}
_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript", ".mjs": "text/javascript",
          ".wasm": "application/wasm", ".json": "application/json", ".css": "text/css", ".png": "image/png"}


def add_parser(sub) -> None:
    p = sub.add_parser("web-demo", help="draw digits and personalize a digit classifier in the browser",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000; 0 picks a free one)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--artifacts", default="onnxtrain-web-demo", metavar="DIR",
                   help="folder for the pretrained model's artifacts (default ./onnxtrain-web-demo; made once, "
                        "then reused)")
    p.add_argument("--js-dir", metavar="DIR", help="the repository's js/ folder (default: found next to src/)")
    p.add_argument("--no-open", action="store_true", help="do not open the page in a web browser")
    p.add_argument("--seed", type=int, default=0, help="seed of the pre-training (when the artifacts are made)")
    p.set_defaults(run=run)


def find_js_dir(js_dir: str | os.PathLike | None = None) -> Path:
    """The js/ folder with the demo page, the package and onnxruntime-web; a CliError says what is missing."""
    if js_dir is None:
        js = Path(__file__).resolve().parents[3] / "js"  # src/onnxtrain/cli/web_demo.py -> the repository
        if not (js / "src" / "index.js").is_file():
            raise CliError("the web demo needs the repository's js/ folder, which the Python package does not ship; "
                           "run it from a clone of onnxtrain (pip install -e .) or pass --js-dir PATH/TO/js")
    else:
        js = Path(js_dir).resolve()
        if not (js / "src" / "index.js").is_file():
            raise CliError(f"{js_dir} is not onnxtrain's js/ folder (src/index.js is missing)")
    if not (js / "demo" / "index.html").is_file():
        raise CliError(f"{js} has no demo/index.html: this checkout's js/ folder predates the web demo")
    if not js.joinpath(*ORT_WEB).is_file():
        raise CliError(f"onnxruntime-web is not installed in {js}: run `npm ci` in {js} (needs Node.js >= 18 and npm)")
    return js


def _load_digits():
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise ImportError("the web demo needs scikit-learn for its digits data set: pip install 'onnxtrain[cli]'"
                          ) from None
    return load_digits()


def _is_ready(folder: Path) -> bool:
    files = (*ARTIFACT_FILES.values(), artifact_file("train_step"), HELDOUT_FILE, REPLAY_FILE)
    try:
        meta = json.loads((folder / DEMO_FILE).read_text())
    except (OSError, ValueError):
        return False
    return meta.get("format") == FORMAT and all((folder / f).is_file() for f in files)


def prepare_artifacts(folder: str | os.PathLike, seed: int = 0, epochs: int = PRETRAIN_EPOCHS, say=print) -> dict:
    """Make (or reuse) the demo's artifacts in ``folder``; returns the page's settings (``demo.json``).

    A folder is reused when an earlier run made it completely (its ``demo.json`` is current); one made by
    something else is never overwritten.
    """
    from safetensors.numpy import save_file

    from onnxtrain.api import CheckpointState, Module, Optimizer
    from onnxtrain.artifacts import LossType, OptimType, generate_artifacts
    from onnxtrain.artifacts.fused import write_train_step_model
    from onnxtrain.cli.common import quiet_onnxruntime
    from onnxtrain.demo.model import OUTPUT, build_cnn
    from onnxtrain.runtime.loop import batches, evaluate, train_epoch

    out = Path(folder)
    if _is_ready(out):
        say(f"reusing the pretrained digits model in {out} (delete the folder to make it again)")
        return json.loads((out / DEMO_FILE).read_text())
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / MARKER).exists())):
        raise CliError(f"{out} exists and was not made by the web demo; choose another folder with --artifacts")
    quiet_onnxruntime()
    digits = _load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None]   # the page scales its drawings the same way
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order], y[order]
    (xt, yt), (xh, yh) = (x[:-HELDOUT], y[:-HELDOUT]), (x[-HELDOUT:], y[-HELDOUT:])

    say(f"pre-training a small CNN on {len(xt)} of scikit-learn's digits ({epochs} epochs)")
    with tempfile.TemporaryDirectory(prefix="onnxtrain-web-demo-") as tmp:
        generate_artifacts(build_cnn(seed), loss=LossType.CrossEntropyLoss, optimizer=OptimType.AdamW,
                           artifact_directory=tmp, additional_output_names=[OUTPUT])
        state = CheckpointState.load_checkpoint(os.path.join(tmp, artifact_file("checkpoint")))
        module = Module(os.path.join(tmp, artifact_file("training")), state, os.path.join(tmp, artifact_file("eval")))
        optimizer = Optimizer(os.path.join(tmp, artifact_file("optimizer")), module)
        optimizer.set_learning_rate(3e-3)
        for epoch in range(epochs):
            train_epoch(module, optimizer, batches(xt, yt, 32, shuffle=True, seed=seed, epoch=epoch))
        accuracy = evaluate(module, batches(xh, yh, 256), metrics=["accuracy"]).metrics["accuracy"]
        out.mkdir(parents=True, exist_ok=True)
        (out / MARKER).write_text("made by onnxtrain web-demo; a rerun may replace the files in this folder\n")
        pretrained = str(out / "pretrained.onnx")
        module.export_model_for_inferencing(pretrained, [OUTPUT])
    generate_artifacts(pretrained, loss=LossType.CrossEntropyLoss, optimizer=OptimType.AdamW,
                       artifact_directory=str(out), additional_output_names=[OUTPUT], trainable_ops=TRAINABLE_OPS)
    write_train_step_model(out)  # the page trains with one session run per step
    save_file({"x": xh, "y": yh}, str(out / HELDOUT_FILE))
    replay = np.concatenate([np.flatnonzero(yt == c)[:REPLAY_PER_CLASS] for c in range(10)])
    save_file({"x": xt[replay], "y": yt[replay]}, str(out / REPLAY_FILE))
    meta = {"format": FORMAT, "classes": 10,
            "pretrained_heldout_accuracy": accuracy, "heldout": HELDOUT, "learning_rate": 3e-3, "steps": 40,
            "replay_batch": 32}
    (out / DEMO_FILE).write_text(json.dumps(meta, indent=1))  # last: a folder without it is unfinished
    say(f"held-out accuracy {100 * accuracy:.1f}%; artifacts for the classifier head in {out}")
    return meta


class _Handler(BaseHTTPRequestHandler):
    """GET of the page's files only: js/demo, js/src, onnxruntime-web's dist and the artifacts folder."""

    roots: dict[str, Path] = {}

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        path = self.path.split("?", 1)[0].split("#", 1)[0]
        if path in ("/", "/index.html"):
            self.send_response(HTTPStatus.FOUND)
            self.send_header("Location", "/js/demo/index.html")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        file = self._resolve(path)
        if file is None:
            self.send_error(HTTPStatus.NOT_FOUND)
            return
        body = file.read_bytes()
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", _TYPES.get(file.suffix, "application/octet-stream"))
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        # Cross-origin isolation lets onnxruntime-web use WebAssembly threads where the browser allows them.
        self.send_header("Cross-Origin-Opener-Policy", "same-origin")
        self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
        self.end_headers()
        self.wfile.write(body)

    def _resolve(self, path: str) -> Path | None:
        from urllib.parse import unquote

        path = unquote(path)
        for prefix, root in self.roots.items():
            if path.startswith(prefix):
                file = (root / path[len(prefix):]).resolve()
                if file.is_relative_to(root) and file.is_file():
                    return file
        return None

    def log_message(self, format: str, *args) -> None:  # the page's requests are not news
        pass


def make_server(js_dir: str | os.PathLike, artifacts: str | os.PathLike, host: str = "127.0.0.1",
                port: int = 0) -> ThreadingHTTPServer:
    """An HTTP server for the page (not started: call ``serve_forever``); ``port=0`` picks a free port."""
    # Resolved roots: a symlinked node_modules (pnpm, a shared install) still serves its files.
    roots = {prefix: Path(js_dir).joinpath(*parts).resolve() for prefix, parts in _JS_ROUTES.items()}
    roots["/artifacts/"] = Path(artifacts).resolve()
    handler = type("Handler", (_Handler,), {"roots": roots})
    try:
        return ThreadingHTTPServer((host, port), handler)
    except OSError as exc:
        raise CliError(f"cannot listen on {host}:{port} ({exc.strerror or exc}); choose another --port "
                       "(0 picks a free one)") from None


def run(args: argparse.Namespace) -> int:
    js = find_js_dir(args.js_dir)
    prepare_artifacts(args.artifacts, seed=args.seed)
    server = make_server(js, args.artifacts, args.host, args.port)
    host, port = server.server_address[:2]
    url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{port}/"
    print(f"serving the web demo on {url} (Ctrl-C stops it)", flush=True)
    if not args.no_open:
        threading.Timer(0.3, webbrowser.open, (url,)).start()
    try:
        server.serve_forever()
    except KeyboardInterrupt:  # the way to stop a server, not an error
        print("stopped")
    finally:
        server.server_close()
    return 0
