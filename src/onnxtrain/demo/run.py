"""The end-to-end demo: on-device personalization of a digit classifier, on the stock onnxruntime.

1. data     scikit-learn's digits: a "global" population, and one user whose digits share a personal style
2. model    a small CNN written with onnx.helper
3. server   pre-train every layer on the global digits (artifacts + onnxtrain training loop)
4. device   artifacts that train only the last layers; the user's accuracy before and after fine-tuning
5. export   the personalized inference model, run with a plain onnxruntime.InferenceSession
6. files    where the artifacts, checkpoints, logs and plots went

Training is written with the runtime's API as an app on the device would write it (``_train``: CheckpointState,
Module, Optimizer, a scheduler and ``onnxtrain.runtime.loop``), and the artifacts are those ``onnxtrain generate``
writes, so the printed ``onnxtrain train`` / ``eval`` commands repeat any step by hand; torch is not used.
``--quick`` trains fewer epochs (for tests).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from dataclasses import dataclass, field

import numpy as np

__all__ = ["DemoResult", "run_demo", "add_arguments", "main_args", "main"]

PRETRAIN_EPOCHS, FINETUNE_EPOCHS = 12, 25
QUICK_PRETRAIN_EPOCHS, QUICK_FINETUNE_EPOCHS = 5, 12
TRAINABLE_OPS = 3  # fc1 -> Relu -> fc2: the classifier head


@dataclass
class DemoResult:
    global_accuracy: float          # pre-trained model on held-out global digits
    before: float                   # the user's held-out digits, before personalization
    after: float                    # ... after
    clean_before: float             # the user's digits without their style, before
    clean_after: float              # ... after (how much general skill the personalization kept)
    onnxruntime_accuracy: float     # the exported model run by a plain InferenceSession
    seconds: float
    paths: dict[str, str] = field(default_factory=dict)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--out", default="onnxtrain-demo", metavar="DIR",
                   help="folder for everything the demo writes (default ./onnxtrain-demo; a rerun replaces it)")
    p.add_argument("--quick", action="store_true", help="fewer epochs (a reduced run for tests)")
    p.add_argument("--seed", type=int, default=0, help="seed of the data split, weights and shuffling")
    p.add_argument("--progress", choices=("auto", "bar", "plain", "none"), default="auto",
                   help="per-epoch progress display (default: a bar on a terminal)")


def _accuracy(module, dataset, fitted) -> float:
    """Accuracy of ``module`` on ``dataset`` (``fitted`` turns a Dataset into the model's (x, y))."""
    from onnxtrain.runtime.loop import batches, evaluate

    x, y = fitted(dataset)
    return evaluate(module, batches(x, y, 256), metrics=["accuracy"]).metrics["accuracy"]


@dataclass
class TrainRun:
    """What :func:`_train` leaves: the trained module and state, and the files of DIR/run/."""

    module: object
    state: object
    last_checkpoint: str
    best_checkpoint: str
    log: str


def _train(directory: str, train, val, *, epochs: int, batch_size: int, lr: float, seed: int, progress,
           log) -> TrainRun:
    """The on-device training loop, with the runtime's API: an epoch of optimizer steps under a cosine schedule,
    a validation pass, and DIR/run/last.ckpt, best.ckpt (lowest validation loss) and metrics.jsonl."""
    import json

    from onnxtrain.api import CheckpointState, CosineLRScheduler, Module, Optimizer
    from onnxtrain.conventions import artifact_file
    from onnxtrain.runtime.loop import batches, evaluate, format_metrics, num_batches, train_epoch

    state = CheckpointState.load_checkpoint(os.path.join(directory, artifact_file("checkpoint")))
    module = Module(os.path.join(directory, artifact_file("training")), state,
                    os.path.join(directory, artifact_file("eval")))
    optimizer = Optimizer(os.path.join(directory, artifact_file("optimizer")), module)
    (x, y), (x_val, y_val) = train, val
    steps = num_batches(len(x), batch_size)
    scheduler = CosineLRScheduler(optimizer, epochs * steps, lr)
    run_dir = os.path.join(directory, "run")
    os.makedirs(run_dir, exist_ok=True)
    run = TrainRun(module, state, *(os.path.join(run_dir, f) for f in ("last.ckpt", "best.ckpt", "metrics.jsonl")))
    best = float("inf")
    with open(run.log, "w") as records:
        for epoch in range(epochs):
            desc = f"epoch {epoch + 1}/{epochs}"
            with progress.epoch(desc, steps, len(x)) as update:
                res = train_epoch(module, optimizer, batches(x, y, batch_size, shuffle=True, seed=seed, epoch=epoch),
                                  scheduler=scheduler, metrics=["accuracy"], on_step=update)
            v = evaluate(module, batches(x_val, y_val, 256), metrics=["accuracy"])
            log(f"{desc}  train {format_metrics(res.loss, res.metrics)} | val {format_metrics(v.loss, v.metrics)}")
            records.write(json.dumps({"epoch": epoch + 1, "train_loss": res.loss, "val_loss": v.loss,
                                      **{f"val_{k}": m for k, m in v.metrics.items()}}) + "\n")
            CheckpointState.save_checkpoint(state, run.last_checkpoint)
            if v.loss < best:
                best = v.loss
                CheckpointState.save_checkpoint(state, run.best_checkpoint)
    return run


MARKER = ".onnxtrain-demo"  # marks a folder the demo made, so that a rerun may replace it


def _prepare_out(out: str) -> None:
    """Create ``out``; replace it only if an earlier demo made it (never delete a user's folder)."""
    from onnxtrain.cli.common import CliError

    if os.path.exists(out):
        if not os.path.isdir(out):
            raise CliError(f"{out} is a file; choose another folder with --out")
        if os.listdir(out) and not os.path.isfile(os.path.join(out, MARKER)):
            raise CliError(f"{out} exists and was not made by the demo; choose another folder with --out")
        shutil.rmtree(out)
    os.makedirs(os.path.join(out, "data"))
    with open(os.path.join(out, MARKER), "w") as f:
        f.write("made by onnxtrain demo; a rerun replaces this folder\n")


def run_demo(out: str = "onnxtrain-demo", quick: bool = False, seed: int = 0, progress: str = "auto",
             say=print) -> DemoResult:
    import onnx
    import onnxruntime as ort

    from onnxtrain.api import CheckpointState, Module
    from onnxtrain.artifacts import LossType, OptimType, generate_artifacts
    from onnxtrain.cli.common import Artifacts, human_count, quiet_onnxruntime
    from onnxtrain.cli.progress import Progress
    from onnxtrain.data import data_spec, fit_dataset, save_dataset
    from onnxtrain.demo.digits import load_demo_data
    from onnxtrain.demo.figure import write_predictions_figure
    from onnxtrain.demo.model import OUTPUT, build_cnn
    from onnxtrain.runtime.loop import predict

    start = time.perf_counter()
    quiet_onnxruntime()
    data = load_demo_data(seed)  # first: a missing scikit-learn is reported before anything is written
    _prepare_out(out)
    bar = Progress(progress)
    indent = lambda line: say("    " + line)  # noqa: E731
    pre_epochs, ft_epochs = (QUICK_PRETRAIN_EPOCHS, QUICK_FINETUNE_EPOCHS) if quick else (PRETRAIN_EPOCHS,
                                                                                         FINETUNE_EPOCHS)
    say("onnxtrain demo: on-device personalization of a handwritten-digit classifier" + (" (quick)" if quick else ""))

    say("[1/6] data: scikit-learn's 8x8 digits")
    paths = {}
    for name in ("global_train", "global_val", "user_train", "user_val", "user_test"):
        paths[name] = os.path.join(out, "data", f"{name}.npz")
        save_dataset(getattr(data, name), paths[name])
    indent(f"global population: {len(data.global_train)} training + {len(data.global_val)} validation digits")
    indent(f"one user (slanted, bold, offset handwriting): {len(data.user_train)} labelled digits on the device for "
           f"fine-tuning, {len(data.user_val)} for validation, {len(data.user_test)} held out for the before/after "
           "test")

    say("[2/6] model: a small CNN written with onnx.helper (conv 16, conv 32, fc 64, fc 10)")
    model = build_cnn(seed)
    paths["model"] = os.path.join(out, "model.onnx")
    onnx.save(model, paths["model"])
    total = sum(int(np.prod(i.dims)) for i in model.graph.initializer)
    indent(f"{human_count(total)} parameters -> {paths['model']}")

    say(f"[3/6] server: pre-train every layer on the global digits ({pre_epochs} epochs)")
    server_dir = os.path.join(out, "server")
    generate_artifacts(model, loss=LossType.CrossEntropyLoss, optimizer=OptimType.AdamW,
                       artifact_directory=server_dir, additional_output_names=[OUTPUT])
    server = Artifacts.locate(server_dir)
    spec = data_spec(onnx.load(server.eval))
    fitted = lambda ds: fit_dataset(ds, spec, "demo data")  # noqa: E731
    pre = _train(server_dir, fitted(data.global_train), fitted(data.global_val), epochs=pre_epochs, batch_size=32,
                 lr=3e-3, seed=seed, progress=bar, log=indent)
    global_accuracy = _accuracy(pre.module, data.global_val, fitted)
    paths["pretrained"] = os.path.join(out, "pretrained.onnx")
    pre.module.export_model_for_inferencing(paths["pretrained"], [OUTPUT])
    indent(f"global validation accuracy {100 * global_accuracy:.1f}%; exported {paths['pretrained']}")

    say(f"[4/6] device: personalize the last {TRAINABLE_OPS} ops (the classifier head) on the user's digits")
    device_dir = os.path.join(out, "device")
    generate_artifacts(paths["pretrained"], loss=LossType.CrossEntropyLoss, optimizer=OptimType.AdamW,
                       artifact_directory=device_dir, additional_output_names=[OUTPUT], trainable_ops=TRAINABLE_OPS)
    device = Artifacts.locate(device_dir)
    state = CheckpointState.load_checkpoint(device.checkpoint)
    initial = Module(device.training, state, device.eval)
    trainable = initial.get_parameters_size(trainable_only=True)
    names = [name for name, p in state.parameters.items() if p.requires_grad]
    indent(f"trainable: {', '.join(names)} = {human_count(trainable)} of "
           f"{human_count(initial.get_parameters_size(trainable_only=False))} parameters; the convolutions stay "
           "frozen")
    before = _accuracy(initial, data.user_test, fitted)
    predictions_before = predict(initial, *fitted(data.user_test)).argmax(axis=1)
    clean_before = _accuracy(initial, data.user_clean, fitted)
    indent(f"user's accuracy BEFORE personalization: {100 * before:.1f}%  (their digits without the style: "
           f"{100 * clean_before:.1f}%)")
    personal = _train(device_dir, fitted(data.user_train), fitted(data.user_val), epochs=ft_epochs, batch_size=16,
                      lr=3e-3, seed=seed, progress=bar, log=indent)
    after = _accuracy(personal.module, data.user_test, fitted)
    predictions_after = predict(personal.module, *fitted(data.user_test)).argmax(axis=1)
    clean_after = _accuracy(personal.module, data.user_clean, fitted)
    indent(f"user's accuracy AFTER personalization:  {100 * after:.1f}%  ({100 * (after - before):+.1f} points; "
           f"without the style: {100 * clean_after:.1f}%)")

    say("[5/6] export: the personalized inference model, run by a plain onnxruntime.InferenceSession")
    paths["personalized"] = os.path.join(out, "personalized.onnx")
    personal.module.export_model_for_inferencing(paths["personalized"], [OUTPUT])
    session = ort.InferenceSession(paths["personalized"], providers=["CPUExecutionProvider"])
    logits = session.run([OUTPUT], {session.get_inputs()[0].name: data.user_test.x})[0]
    ort_accuracy = float(np.mean(np.argmax(logits, axis=1) == data.user_test.y))
    indent(f"{paths['personalized']}: input {session.get_inputs()[0].name} {session.get_inputs()[0].shape}, "
           f"output {OUTPUT} {session.get_outputs()[0].shape}; accuracy on the user's test digits "
           f"{100 * ort_accuracy:.1f}%" + (" (same as in training)" if abs(ort_accuracy - after) < 1e-9 else ""))

    figure = os.path.join(out, "personalization.png")
    if write_predictions_figure(data.user_test.x, data.user_test.y, predictions_before, predictions_after, figure):
        paths["figure"] = figure

    seconds = time.perf_counter() - start
    say("[6/6] files")
    indent(f"data:        {os.path.join(out, 'data')}/ (onnxtrain dataset files: x, y, classes)")
    indent(f"models:      {paths['model']} (initial), {paths['pretrained']}, {paths['personalized']}")
    indent(f"artifacts:   {server_dir}/ (pre-training), {device_dir}/ (personalization)")
    if "figure" in paths:
        indent(f"figure:      {figure} (user's digits it fixed, predicted before -> after)")
    for where, run in (("server", pre), ("device", personal)):
        indent(f"{where} checkpoints: {run.last_checkpoint} (last), {run.best_checkpoint} (best); log: {run.log}")
    say("try it by hand:")
    indent(f"onnxtrain info {device_dir}")
    indent(f"onnxtrain eval {device_dir} --data {paths['user_test']} --checkpoint initial")
    indent(f"onnxtrain train {device_dir} --data {paths['user_train']} --val {paths['user_val']} --epochs "
           f"{ft_epochs} --lr 3e-3 --scheduler cosine --batch-size 16 --restart")
    say(f"done in {seconds:.1f} s: the user's accuracy went from {100 * before:.1f}% to {100 * after:.1f}%")
    paths.update(server=server_dir, device=device_dir, server_log=pre.log, device_log=personal.log,
                 device_last=personal.last_checkpoint)
    return DemoResult(global_accuracy, before, after, clean_before, clean_after, ort_accuracy, seconds, paths)


def main_args(args: argparse.Namespace) -> int:
    run_demo(args.out, args.quick, args.seed, args.progress)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m onnxtrain.demo``: the demo, with the command line's one-line errors."""
    from onnxtrain.cli.main import main as cli_main

    return cli_main(["demo", *(argv if argv is not None else sys.argv[1:])])
