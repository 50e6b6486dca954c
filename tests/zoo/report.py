"""Run the model-zoo matrix and write docs/models.md.

    python -m tests.zoo.report                      # every model (about 20-30 minutes on 2 cores)
    python -m tests.zoo.report --models resnet18,bert --out /tmp/models.md
    python -m tests.zoo.report --results zoo.json    # keeps results per model; rerun to resume after a stop
    python -m tests.zoo.report --results zoo.json --no-run   # only rewrite the table

Each model runs in its own process (``--one NAME --json PATH``): an export that crashes or hangs costs only
its own row, and timings are not disturbed by the previous model's memory. Where the fully dynamic export
does not generate, the checks also run on an export with only the batch axis dynamic (marked "static size").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COLUMNS = ("generates", "base", "batch", "size", "trains", "exports")
HEADERS = ("generates", "gradients vs torch", "dynamic batch", "dynamic size", "trains (20 AdamW steps)",
           "eval + inference export")
TIMEOUT = 1800


def _attempt(check, *args) -> str | None:
    """None when the check passes, else the one-line error."""
    from tests.zoo.harness import one_line

    try:
        check(*args)
        return None
    except Exception as exc:  # noqa: BLE001 - every failure is a result here
        return one_line(exc)


def _measure(run, folder: Path) -> dict:
    """Generation time and peak RSS, then step time and peak RSS of training, each in a process without torch
    (tests/zoo/measure.py)."""
    import numpy as np

    inputs, labels = run.batch("base")
    np.savez(folder / "batch.npz", inputs=inputs[0], labels=labels)
    measured = {}
    for what in ("generate", "train"):
        proc = subprocess.run([sys.executable, "-m", "tests.zoo.measure", str(run.onnx_path),
                               str(folder / "batch.npz"), str(folder / "measured"), what],
                              capture_output=True, text=True, cwd=ROOT, timeout=TIMEOUT, env=os.environ)
        if proc.returncode != 0:
            return {"error": (proc.stderr.strip().splitlines() or ["?"])[-1][:300]}
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        measured.update(result, **{f"{what}_rss_mb": result["peak_rss_mb"]})
    return measured


def run_model(name: str, folder: Path) -> dict:
    """Every exporter's row for one model."""
    from tests.zoo.harness import EXPORTERS, Run, check_artifacts, check_exports, check_gradients, check_training
    from tests.zoo.harness import initial_model as build
    from tests.zoo.models import ZOO

    spec = ZOO[name]
    model = build(spec)
    rows = {}
    for exporter in EXPORTERS:
        if exporter in spec.skip:
            rows[exporter] = {"export_error": "not run (tests/zoo/models.py says why)"}
            continue
        start = time.perf_counter()
        run = Run(spec, exporter, folder / exporter, model)
        row = {"static_size": False, "dynamic_generate_error": None}
        if (run.export_error is None and run.generate_error and spec.sizes[1] is not None):
            row["dynamic_generate_error"] = run.generate_error
            run = Run(spec, exporter, folder / f"{exporter}-static", model, dynamic_size=False)
            row["static_size"] = True
        if run.export_error:
            row["export_error"] = run.export_error
            rows[exporter] = row
            continue
        row["generates"] = run.generate_error or _attempt(check_artifacts, run)
        for case in ("base", "batch"):
            row[case] = _attempt(check_gradients, run, case)
        if spec.sizes[1] is None:
            row["size"] = "n/a"
        elif row["static_size"]:
            row["size"] = row["dynamic_generate_error"]
        else:
            row["size"] = _attempt(check_gradients, run, "size")
        row["trains"] = _attempt(check_training, run)
        row["exports"] = _attempt(check_exports, run, run.folder)
        if not run.generate_error:
            row["measured"] = _measure(run, run.folder)
        row["seconds"] = time.perf_counter() - start
        rows[exporter] = row
    return rows


def _rss(measured: dict) -> str:
    if measured.get("rss") != "VmHWM":  # older runs read ru_maxrss: the forking report's memory, not onnxtrain's
        return "not measured"
    return f"{measured['generate_rss_mb']:.0f} / {measured['train_rss_mb']:.0f} MB"


def _cell(row: dict, column: str, notes: list[str]) -> str:
    value = row.get(column)
    if column == "size" and value == "n/a":
        return "n/a (fixed by the model)"
    if value is None:
        return "yes (static size)" if column == "generates" and row["static_size"] else "yes"
    if value not in notes:
        notes.append(value)
    return f"**no** [{notes.index(value) + 1}]"


def _minutes(results: dict) -> str:
    return f"{sum(r.get('model_seconds', 0) for r in results.values()) / 60:.0f}"


def markdown(results: dict, planned: list[str]) -> str:
    from tests.zoo.harness import EXPORTERS
    from tests.zoo.models import ZOO

    lines = ["# Model zoo", "",
             "Real architectures from the packages that define them, with random weights, exported by torch 2.13 "
             "and trained by onnxtrain on stock onnxruntime (issue 12). Generated by `python -m tests.zoo.report` "
             f"({time.strftime('%Y-%m-%d')}, {_minutes(results)} minutes on the shared 2-core machine); the "
             "same checks run as tests: `pytest tests/zoo` (resnet18 and BERT) and `pytest -m slow tests/zoo`.", "",
             "Exports: the TorchScript exporter (`dynamo=False`, opset 17, `do_constant_folding=False`) in "
             "training mode (BatchNorm on batch statistics) and in eval mode, and the dynamo exporter (eval mode, "
             "`optimize=False`: its default rewrites fold BatchNorm into the Conv weights under the Conv weight "
             "names). Batch axis dynamic; height/width, sequence length or audio length dynamic where the model "
             "allows. Images 64 px (ViT, DeiT 32 px; MobileViT 64 and 128), sequences of 8 and 12 tokens, audio of "
             "400 and 640 samples; dropout, stochastic depth and masking off.", "",
             "Columns: **generates**: `generate_artifacts` succeeds and every artifact is default-domain ONNX that "
             "passes `onnx.checker.check_model(full_check=True)` (\"static size\": only with the size axes static; "
             "the dynamic export's error is in the dynamic-size column). **gradients vs torch**: the loss and every "
             "parameter's gradient at the exported batch and size match torch (float64 reference; norm-wise "
             "relative error below 1e-4 per tensor, or within 5x torch float32's own error, and the loss likewise; "
             "where float32 still "
             "disagrees on every batch tried, the training graph run in float64 by onnx.reference must match torch's "
             "float64 gradients within 1e-6). **dynamic batch** / "
             "**dynamic size**: the same check with the same artifacts at another batch size / input size. "
             "**trains**: 20 AdamW steps lower the loss, and training-mode BatchNorm running statistics move as "
             "torch's do. **exports**: after two steps, the eval model and `export_model_for_inferencing` give "
             "torch's eval outputs with the same weights (1e-4), at both batch sizes and both input sizes. "
             "Generation time, median step time (batch 4 images or 2 sequences) and peak RSS are measured in "
             "processes without torch: one generates, one loads the artifacts and runs 20 AdamW steps. The "
             "machine is shared with other jobs: times are upper bounds. Peak RSS is each process's VmHWM (\"not "
             "measured\": rows from a run that read ru_maxrss, which reports the forking report's memory).", ""]
    for exporter in EXPORTERS:
        notes: list[str] = []
        lines += [f"## {exporter}", "",
                  "| model | package | " + " | ".join(HEADERS) + " | generation | step | peak RSS (generate / train) |",
                  "|---|---|" + "---|" * (len(HEADERS) + 3)]
        for name in [n for n in planned if n in results] + [n for n in results if n not in planned]:
            rows = results[name]
            row = rows.get(exporter)
            if row is None or "export_error" in row:
                error = row["export_error"] if row else rows.get("error", "no result")
                if error not in notes:
                    notes.append(error)
                cells = [f"export fails [{notes.index(error) + 1}]"] + ["-"] * (len(HEADERS) + 2)
            else:
                cells = [_cell(row, c, notes) for c in COLUMNS]
                measured = row.get("measured") or {}
                if "error" in measured:
                    notes.append(measured["error"])
                    cells += [f"[{len(notes)}]", "", ""]
                elif measured:
                    cells += [f"{measured['generate_s']:.1f} s", f"{measured['step_ms']:.0f} ms",
                              _rss(measured)]
                else:
                    cells += ["-", "-", "-"]
            lines.append(f"| {name} | {ZOO[name].package} | " + " | ".join(cells) + " |")
        lines.append("")
        lines += [f"{i}. `{note}`" for i, note in enumerate(notes, 1)]
        lines.append("")
    missing = [n for n in planned if n not in results]
    if missing:
        lines += [f"Not run yet: {', '.join(missing)}.", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    from tests.zoo.models import ZOO

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(ZOO), help="comma-separated model names")
    parser.add_argument("--out", default=str(ROOT / "docs" / "models.md"))
    parser.add_argument("--results", help="also write the raw results (JSON) here")
    parser.add_argument("--no-run", action="store_true", help="only write the table from --results")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--json", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        with tempfile.TemporaryDirectory() as tmp:
            Path(args.json).write_text(json.dumps(run_model(args.one, Path(tmp))))
        return 0
    # results are kept after every model: an interrupted run resumes with the models not yet in --results
    results_path = Path(args.results) if args.results else None
    results = json.loads(results_path.read_text()) if results_path and results_path.exists() else {}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            if name in results or args.no_run:
                continue
            out = Path(tmp) / f"{name}.json"
            began = time.perf_counter()
            try:
                proc = subprocess.run([sys.executable, "-m", "tests.zoo.report", "--one", name, "--json", str(out)],
                                      cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT)
                results[name] = (json.loads(out.read_text()) if out.exists() else
                                 {"error": (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]})
            except subprocess.TimeoutExpired:
                results[name] = {"error": f"timed out after {TIMEOUT} s"}
            results[name]["model_seconds"] = time.perf_counter() - began
            print(f"{name}: {time.perf_counter() - began:.0f} s", file=sys.stderr, flush=True)
            if results_path:
                results_path.write_text(json.dumps(results, indent=1))
            Path(args.out).write_text(markdown(results, args.models.split(",")))
    Path(args.out).write_text(markdown(results, args.models.split(",")))
    print(f"wrote {args.out} ({time.perf_counter() - start:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
