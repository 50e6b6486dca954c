# From /work/shared/bench/run_ort.py (the reference harness); adapted for onnxtrain's bench/.
"""The peer: onnxruntime-training 1.19.2's on-device training API.

    python run_peer.py --workload NAME [--steps N] [--warmup W] [--threads T] [--workarounds]

Artifacts are generated (torch ONNX export + ORT's offline generate_artifacts) in a child process, so
peak_rss_mb covers the training process only (gen_peak_rss_mb is the child's). That process still holds
torch: importing onnxruntime.training.api imports it. Without --workarounds the peer runs as shipped and
fails on all five workloads with today's onnx (see /work/shared/bench/RESULTS.md, findings 1-3).
"""

import os
import tempfile
import time

from common import error_text, generate_in_child, load_training, peak_rss_mb, run, session_options

_TMP = []  # keeps the artifact directory alive until exit
MAX_IR_VERSION = 10  # highest ONNX IR version onnxruntime 1.19 loads


def add_arguments(p):
    p.add_argument("--workarounds", action="store_true",
                   help="apply the three known fixes below; without it the peer runs exactly as shipped")


def patch_layernorm(onnx_model):
    """onnxruntime#19427: ORT's LayerNormalization gradient needs the optional Mean/InvStdDev outputs."""
    n = 0
    for node in onnx_model.graph.node:
        if node.op_type == "LayerNormalization" and len(node.output) == 1:
            node.output.extend([node.output[0] + "_mean", node.output[0] + "_inv_std_dev"])
            n += 1
    return [f"LayerNormalization optional outputs added x{n}"] if n else []


def fix_artifacts(outdir):
    """Post-process the generated models so that ORT 1.19 loads them."""
    import onnx

    done = []
    for f in ("training_model.onnx", "eval_model.onnx", "optimizer_model.onnx"):
        path, notes = os.path.join(outdir, f), []
        m = onnx.load(path)
        if m.ir_version > MAX_IR_VERSION:  # onnxruntime#20726: stamped with the installed onnx's IR version
            notes.append(f"IR version {m.ir_version}->{MAX_IR_VERSION}")
            m.ir_version = MAX_IR_VERSION
        # eval model: training_mode is reset to 0 but the running-stat outputs are kept, which ORT rejects
        bns = [n for n in m.graph.node if n.op_type == "BatchNormalization" and len(n.output) > 1
               and not any(a.name == "training_mode" and a.i for a in n.attribute)]
        for n in bns:
            del n.output[1:]
        if bns:
            notes.append(f"eval-mode BatchNormalization extra outputs removed x{len(bns)}")
        if notes:
            onnx.save(m, path)
            done += [f"{f}: {x}" for x in notes]
    return done


def generate(workload, outdir, workarounds):
    """Child process: export + generate_artifacts. Returns timings (and error/error_stage); never raises."""
    out, stage = {}, "export"
    try:
        import onnx
        import onnxruntime

        onnxruntime.set_default_logger_severity(3)
        from onnxruntime.training import artifacts

        import workloads

        t = time.perf_counter()
        path = os.path.join(outdir, "model.onnx")
        model = workloads.export_onnx(workload, path)
        out["export_seconds"] = time.perf_counter() - t
        onnx_model = onnx.load(path)
        if workarounds:
            out["workarounds_applied"] = patch_layernorm(onnx_model)
        trainable, frozen = workloads.param_split(model)
        missing = set(trainable) - {i.name for i in onnx_model.graph.initializer}
        if missing:
            raise KeyError(f"trainable parameters not among the ONNX initializers: {sorted(missing)[:3]}")
        stage = "generate"
        t = time.perf_counter()
        artifacts.generate_artifacts(onnx_model, requires_grad=trainable, frozen_params=frozen,
                                     loss=artifacts.LossType.CrossEntropyLoss,
                                     optimizer=artifacts.OptimType.AdamW, artifact_directory=outdir)
        out["gen_seconds"] = time.perf_counter() - t
        if workarounds:
            out["workarounds_applied"] += fix_artifacts(outdir)
    except Exception as exc:
        out.update(error=error_text(exc), error_stage=stage)
    out["gen_peak_rss_mb"] = peak_rss_mb()
    return out


def setup(args, rec):
    rec["impl"] = "peer" if args.workarounds else "peer-as-shipped"
    _TMP.append(tempfile.TemporaryDirectory(prefix="peer_bench_"))
    d = _TMP[-1].name
    generate_in_child(rec, d, generate, args.workload, d, args.workarounds)

    rec["stage"] = "load"
    import onnxruntime
    from onnxruntime.training import api

    rec["ort_version"] = onnxruntime.__version__
    rec["rss_after_import_mb"] = peak_rss_mb()
    return load_training(api, d, args.workload, session_options(args.threads), rec)


if __name__ == "__main__":
    run("peer", setup, add_arguments=add_arguments)
