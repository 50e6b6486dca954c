# From /work/shared/bench/run_onnxtrain.py (the reference harness); adapted for onnxtrain's bench/.
"""The project under test: onnxtrain, through its onnxruntime.training.api-compatible API.

    python run_onnxtrain.py --workload NAME [--steps N] [--warmup W] [--threads T] [--update-in-backward]

Same protocol as run_peer.py: the torch export and onnxtrain.artifacts.generate_artifacts run in a
spawned child, then this process loads the artifacts with onnxtrain.api on the stock onnxruntime and is
timed (with --update-in-backward, `Optimizer(..., update_in_backward=True)`, reported as the implementation
"onnxtrain-uib"). This process never imports torch (the JSON line says so in torch_imported), so peak_rss_mb is
onnxtrain's own. bench/run.py puts the checkout's src/ first on PYTHONPATH.
"""

import os
import sys
import tempfile
import time

from common import error_text, generate_in_child, load_training, peak_rss_mb, run, session_options

_TMP = []  # keeps the artifact directory alive until exit


def generate(workload, outdir):
    """Child process: export + generate_artifacts. Returns timings (and error/error_stage); never raises."""
    out, stage = {}, "export"
    try:
        import onnx

        import workloads

        t = time.perf_counter()
        path = os.path.join(outdir, "model.onnx")
        model = workloads.export_onnx(workload, path)
        out["export_seconds"] = time.perf_counter() - t
        trainable = [n for n, p in model.named_parameters() if p.requires_grad]
        frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
        onnx_model = onnx.load(path)
        missing = set(trainable) - {i.name for i in onnx_model.graph.initializer}
        if missing:
            raise KeyError(f"trainable parameters not among the ONNX initializers: {sorted(missing)[:3]}")
        stage = "generate"
        from onnxtrain import artifacts

        t = time.perf_counter()
        artifacts.generate_artifacts(onnx_model, requires_grad=trainable, frozen_params=frozen,
                                     loss=artifacts.LossType.CrossEntropyLoss,
                                     optimizer=artifacts.OptimType.AdamW, artifact_directory=outdir)
        out["gen_seconds"] = time.perf_counter() - t
    except Exception as exc:
        out.update(error=error_text(exc), error_stage=stage)
    out["gen_peak_rss_mb"] = peak_rss_mb()
    return out


def setup(args, rec):
    _TMP.append(tempfile.TemporaryDirectory(prefix="onnxtrain_bench_"))
    d = _TMP[-1].name
    generate_in_child(rec, d, generate, args.workload, d)

    rec["stage"] = "load"
    import onnxruntime

    import onnxtrain
    from onnxtrain import api

    rec.update(ort_version=onnxruntime.__version__, onnxtrain_version=getattr(onnxtrain, "__version__", None),
               onnxtrain_path=os.path.dirname(onnxtrain.__file__), rss_after_import_mb=peak_rss_mb())
    options = {"update_in_backward": True} if args.update_in_backward else None
    return load_training(api, d, args.workload, session_options(args.threads), rec, options)


def add_arguments(p):
    p.add_argument("--update-in-backward", action="store_true",
                   help="Optimizer(..., update_in_backward=True): no gradient vector (docs/memory.md)")


if __name__ == "__main__":
    run("onnxtrain-uib" if "--update-in-backward" in sys.argv[1:] else "onnxtrain", setup, add_arguments=add_arguments)
