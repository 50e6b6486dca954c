# From /work/shared/bench/report.py (the reference harness); rewritten for the three-way comparison.
"""BENCHMARKS.md from one run of bench/run.py (standard library only).

    python bench/report.py [bench/results/DATE.jsonl] [--run-id ID] [--out BENCHMARKS.md]

Without a file it takes the newest bench/results/*.jsonl; without --run-id, the last run in it.
Repeated passes of one (workload, impl) are merged: a time is the lowest of the passes' medians (the
least disturbed pass on a shared machine), memory is the highest peak. p10/p90 come from the pass
with the lowest step median.
"""

import argparse
import glob
import json
import os
import re

__all__ = ["load", "render", "main"]

HERE = os.path.dirname(os.path.abspath(__file__))
IMPLS = ["onnxtrain", "onnxtrain-uib", "peer", "torch"]
# onnxtrain's variants judged against the same targets, each in rows of its own (run on request)
VARIANTS = {"onnxtrain-uib": "update_in_backward=True"}
WORKLOADS = ["mlp", "lenet", "mobilenetv2", "mobilenetv2_head", "transformer", "bert_small", "bert_small_seq32",
             "bert_small_head", "bert_base", "resnet18", "resnet18_head"]
ARTIFACTS = ["training_model.onnx", "eval_model.onnx", "optimizer_model.onnx", "checkpoint"]
_HISTORY = os.path.join(HERE, "design_history.md")  # kept by hand, appended to every report
# (metric, baseline impl, target ratio onnxtrain/baseline or None, column title)
RATIOS = [
    ("step_ms", "peer", 0.9, "step / peer"),
    ("step_ms", "torch", 0.9, "step / torch"),
    ("eval_ms", "peer", None, "eval / peer"),
    ("eval_ms", "torch", None, "eval / torch"),
    ("peak_rss_mb", "peer", 0.7, "peak RSS / peer"),
    ("peak_rss_mb", "torch", None, "peak RSS / torch"),
    ("rss_growth_mb", "peer", None, "RSS growth / peer"),
    ("gen_seconds", "peer", 1.0, "gen / peer"),
]


def fmt(v, spec=".1f"):
    return "–" if v is None else format(v, spec)


def newest_results():
    files = sorted(glob.glob(os.path.join(HERE, "results", "*.jsonl")), key=os.path.getmtime)
    if not files:
        raise SystemExit("no bench/results/*.jsonl yet: run `python bench/run.py` first")
    return files[-1]


def load(path, run_id=None):
    """The records of one run_id (default: the last one in the file) and that run_id."""
    with open(path) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    if run_id is None:
        run_id = next((r["run_id"] for r in reversed(recs) if r.get("run_id")), None)
    return [r for r in recs if r.get("run_id") == run_id], run_id


def summarize(runs):
    """Merge the passes of one (workload, impl) into one row of figures."""
    ok = [r for r in runs if r.get("step_ms_median") is not None]
    failed = [r for r in runs if "error" in r]
    row = dict(runs=len(runs), ok=len(ok), failed=failed)
    if not ok:
        last = runs[-1]
        row.update(gen_seconds=last.get("gen_seconds"), artifact_bytes=last.get("artifact_bytes"))
        return row
    best = min(ok, key=lambda r: r["step_ms_median"])
    fat = max(ok, key=lambda r: r["peak_rss_mb"])
    gens = [r["gen_seconds"] for r in ok if r.get("gen_seconds") is not None]
    row.update(
        step_ms=best["step_ms_median"], step_runs=[r["step_ms_median"] for r in ok],
        p10=best["step_ms_p10"], p90=best["step_ms_p90"], steps=best.get("steps"),
        steps_planned=best.get("steps_planned"),
        eval_ms=min(r["eval_ms_median"] for r in ok if r.get("eval_ms_median") is not None),
        peak_rss_mb=fat["peak_rss_mb"], rss_after_import_mb=fat.get("rss_after_import_mb"),
        rss_growth_mb=fat["peak_rss_mb"] - fat["rss_after_import_mb"] if fat.get("rss_after_import_mb") else None,
        gen_seconds=min(gens) if gens else None, export_seconds=best.get("export_seconds"),
        artifact_bytes=best.get("artifact_bytes"), loss_first=best["loss_first"], loss_last=best["loss_last"],
        eval_loss=best.get("eval_loss"), torch_imported=best.get("torch_imported"),
        load=max(best.get("loadavg_start") or 0, best.get("loadavg_end") or 0),
    )
    return row


def ratio_cell(rows, w, metric, base, target, impl="onnxtrain"):
    a, b = rows.get((w, impl), {}).get(metric), rows.get((w, base), {}).get(metric)
    r = a / b if a is not None and b else None
    if target is None:
        return fmt(r, ".2f"), None
    if b is None:
        return f"{fmt(r, '.2f')} ?", None  # no baseline figure: the target cannot be judged
    met = r is not None and r <= target
    return f"{fmt(r, '.2f')} {'✓' if met else '✗'}", met


def render(recs, run_id, source):
    machine = next((r for r in recs if r.get("impl") == "machine"), {})
    envs = [r for r in recs if r.get("impl") == "env"]
    done = next((r for r in recs if r.get("impl") == "done"), {})
    runs = [r for r in recs if r.get("impl") not in ("machine", "env", "done")]
    groups = {}
    for r in runs:
        groups.setdefault((r["workload"], r["impl"]), []).append(r)
    rows = {k: summarize(v) for k, v in groups.items()}
    workloads = [w for w in WORKLOADS if any(k[0] == w for k in rows)]
    impls = [i for i in IMPLS if any(k[1] == i for k in rows)] + sorted({k[1] for k in rows} - set(IMPLS))
    loads = [x for r in runs for x in (r.get("loadavg_start"), r.get("loadavg_end")) if x is not None]

    out = ["# Benchmarks: onnxtrain vs onnxruntime-training 1.19.2 (the peer) vs PyTorch", ""]
    out.append(f"Generated by `python bench/run.py` from `{source}` (run `{run_id}`); regenerate with "
               f"`python bench/report.py {source} --out BENCHMARKS.md`. Do not edit by hand.")
    out.append("")
    minutes = f", {done['total_seconds'] / 60:.1f} minutes in all" if done.get("total_seconds") else ""
    out.append(f"- Date: {machine.get('date', '?')} (UTC){minutes}. Passes: {done.get('passes', '?')}, "
               f"threads: {machine.get('threads', '?')}, each workload x implementation in its own process, "
               "interleaved.")
    cpu_id = f" ({machine['cpu_id']})" if machine.get("cpu_id") else ""
    out.append(f"- Machine: {machine.get('cpu_model', '?')}{cpu_id}, {machine.get('cores', '?')} cores, "
               f"{fmt(machine.get('mem_gib'), '.0f')} GiB RAM, {machine.get('platform', '?')}. "
               f"Load average during the runs: {fmt(min(loads, default=None), '.1f')}–"
               f"{fmt(max(loads, default=None), '.1f')}. The machine is shared and noisy: only ratios within "
               "one run mean anything, and differences under about 20 % are not significant.")
    cores = machine.get("cores") or 2
    if max(loads, default=0) > cores:
        out.append(f"- **Warning: the load average reached {max(loads):.1f} on {cores} cores: neighbours took "
                   "much of the machine during this run, so its figures and ratios are indicative only.**")
    out.append(f"- onnxtrain checkout: {machine.get('git', '?')}.")
    out += ["", "| environment | python | onnxruntime | onnxruntime-training | torch | onnx | numpy | runs |",
            "|---|---|---|---|---|---|---|---|"]
    for e in envs:
        v = e.get("versions", {})
        out.append(f"| {e['env']} | {e.get('python', '?')} | {v.get('onnxruntime') or '–'} "
                   f"| {v.get('onnxruntime-training') or '–'} | {v.get('torch') or '–'} | {v.get('onnx') or '–'} "
                   f"| {v.get('numpy') or '–'} | {', '.join(e.get('impls', []))} |")

    out += ["", "## Targets and ratios (onnxtrain / baseline)", "",
            "Targets (issue 14): step time ≤ 0.9× the peer and ≤ 0.9× torch, peak memory ≤ 0.7× the peer, "
            "artifact generation ≤ the peer's time. Lower is better everywhere. RSS growth is the peak minus the RSS "
            "right after the imports: the peer's `import onnxruntime.training.api` alone takes about 285 MB "
            "because it imports torch, which the peak-memory target counts in onnxtrain's favour.", ""]
    out.append("| workload | " + " | ".join(c[3] + (f" (≤ {c[2]})" if c[2] else "") for c in RATIOS) + " |")
    out.append("|---|" + "---|" * len(RATIOS))
    met = judged = 0
    for w in workloads:
        cells = []
        for metric, base, target, _ in RATIOS:
            text, ok = ratio_cell(rows, w, metric, base, target)
            cells.append(text)
            if target is not None:
                judged += ok is not None
                met += bool(ok)
        out.append(f"| {w} | " + " | ".join(cells) + " |")
    variant_lines = []
    for impl, option in VARIANTS.items():
        v_met = v_judged = 0
        for w in workloads:
            if (w, impl) not in rows:
                continue
            cells = []
            for metric, base, target, _ in RATIOS:
                text, ok = ratio_cell(rows, w, metric, base, target, impl)
                cells.append(text)
                if target is not None:
                    v_judged += ok is not None
                    v_met += bool(ok)
            out.append(f"| {w}, `{option}` | " + " | ".join(cells) + " |")
        if v_judged:
            variant_lines.append(f"With `{option}` ({impl}): {v_met} of {v_judged} on the workloads it ran.")
    out += ["", f"Targets met: {met} of {judged} (the default Optimizer)."] + ([""] + variant_lines if variant_lines
                                                                             else [])

    out += ["", "## Figures", "",
            "Step = forward + backward + optimizer step + gradient reset, one fixed batch, after 5 warm-up "
            "steps. Times are the lowest of the passes' medians (each pass listed), p10–p90 of that pass. "
            "Peak RSS is the training process's `ru_maxrss` (in brackets: right after the imports; the "
            "peer's imports include torch). `gen s` times `generate_artifacts` alone, in its own process. "
            "Loss: first warm-up step → last timed step (eval loss after training). Load: the higher "
            "1-minute load average at the start and end of that pass's process (2 cores: above 1 means a "
            "neighbour competed for them).", ""]
    out.append("| workload | impl | step ms (passes) [p10–p90] | eval ms | peak RSS MB (after import) | gen s "
               "| artifacts KB train/eval/optim/ckpt | loss first → last (eval) | trains | load | error |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|")
    errors = {}
    for w in workloads:
        for impl in impls:
            row = rows.get((w, impl))
            if row is None:
                continue
            out.append(figures_row(w, impl, row, errors))
    if errors:
        out.append("")
        for (stage, e), i in errors.items():
            out.append(f"- E{i} ({stage}): `{e}`")
    notes = []
    for (w, impl), group in sorted(groups.items(), key=lambda kv: (WORKLOADS.index(kv[0][0]), kv[0][1])):
        fixes = next((r["workarounds_applied"] for r in group if r.get("workarounds_applied")), None)
        if fixes:
            notes.append(f"- {w} / {impl} workarounds: {'; '.join(fixes)}")
    leaks = sorted({w for (w, impl), row in rows.items() if impl == "onnxtrain" and row.get("torch_imported")})
    if leaks:
        notes.append(f"- Warning: torch was imported in onnxtrain's training process ({', '.join(leaks)}): "
                     "its peak RSS includes torch.")
    if notes:
        out += [""] + notes
    if os.path.isfile(_HISTORY):  # kept by hand, carried into every regenerated report
        with open(_HISTORY) as f:
            out += ["", f.read().rstrip()]
    return "\n".join(out) + "\n"


def figures_row(w, impl, row, errors):
    err = ""
    if row["failed"]:
        last = row["failed"][-1]
        e = (last.get("error_stage", "?"), re.sub(r"/tmp/[^ /]*bench_\w+", "<tmpdir>", last["error"]))
        errors.setdefault(e, len(errors) + 1)
        err = f"{e[0]} failed {len(row['failed'])}/{row['runs']} [E{errors[e]}]"
    sizes = row.get("artifact_bytes") or {}
    art = "/".join(fmt(sizes[f] / 1024, ".0f") if f in sizes else "–" for f in ARTIFACTS) if sizes else "–"
    if impl == "torch":
        art = "n/a"
    if row["ok"] == 0:
        return f"| {w} | {impl} | – | – | – | {fmt(row.get('gen_seconds'), '.2f')} | {art} | – | – | – | {err} |"
    passes = ", ".join(format(x, ".1f") for x in row["step_runs"])
    cut = f", {row['steps']} steps" if row.get("steps") and row["steps"] < (row.get("steps_planned") or 0) else ""
    step = f"{row['step_ms']:.1f} ({passes}{cut}) [{row['p10']:.1f}–{row['p90']:.1f}]"
    rss = f"{row['peak_rss_mb']:.0f} ({fmt(row.get('rss_after_import_mb'), '.0f')})"
    loss = f"{row['loss_first']:.4g} → {row['loss_last']:.3g} ({fmt(row.get('eval_loss'), '.3g')})"
    trains = "✓" if row["loss_last"] < 0.5 * row["loss_first"] else "✗"
    gen = "n/a" if impl == "torch" else fmt(row.get("gen_seconds"), ".2f")
    return (f"| {w} | {impl} | {step} | {row['eval_ms']:.1f} | {rss} | {gen} | {art} | {loss} | {trains} "
            f"| {row['load']:.1f} | {err} |")


# Sections other scripts or measurements maintain in the same file, between <!-- NAME:begin ... --> and
# <!-- NAME:end -->: bench/lora.py's, the browser / Node.js figures (js/bench), bench/floor.py's.
KEPT_SECTIONS = ("web", "lora", "floor")


def _kept_sections(path: str) -> str:
    """The kept sections of the file at ``path``, to append when the file is rewritten."""
    if not os.path.exists(path):
        return ""
    text = open(path).read()
    kept = ""
    for name in KEPT_SECTIONS:
        begin, end = f"<!-- {name}:begin", f"<!-- {name}:end -->"
        if begin in text and end in text:
            kept += "\n" + text[text.index(begin):text.index(end) + len(end)] + "\n"
    return kept


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", nargs="?", help="a bench/results/*.jsonl file (default: the newest)")
    p.add_argument("--run-id", help="default: the last run in the file")
    p.add_argument("--out", help="write the markdown here (default: print it)")
    args = p.parse_args(argv)
    path = args.results or newest_results()
    recs, run_id = load(path, args.run_id)
    if not recs:
        raise SystemExit(f"{path}: no records for run {run_id!r}")
    root = os.path.dirname(HERE)
    source = os.path.relpath(os.path.abspath(path), root) if os.path.abspath(path).startswith(root) else path
    text = render(recs, run_id, source)
    if args.out:
        text += _kept_sections(args.out)
        with open(args.out, "w") as f:
            f.write(text)
    else:
        print(text, end="")
    return text


if __name__ == "__main__":
    main()
