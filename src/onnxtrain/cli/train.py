"""`onnxtrain train DIR --data TRAIN`: epochs with progress, validation, metrics, checkpoints, a log and a plot.

Everything a run writes goes to `DIR/run/`: `last.ckpt` (after every epoch, and on Ctrl-C), `best.ckpt`
(lowest validation loss, or training loss without validation data), `metrics.jsonl` (one JSON record per epoch)
and `training_curve.png` (with matplotlib). With `--save-every-steps N`, also `step-<S>.ckpt` every N optimizer
steps (S: the run's step count; the newest `--keep-last K` are kept, default 3), and `last.ckpt` then holds that
step's state too. Checkpoints are written atomically and record how far the run got (the `onnxtrain.progress`
property), so `--resume` continues exactly where it stopped, mid-epoch included; `--resume CKPT` continues from
an earlier checkpoint of the run (e.g. `--resume DIR/run/step-200.ckpt`), setting the later files aside in
`DIR/run/previous/`.

The data is a .npz file with arrays `x` (inputs) and `y` (labels), as `onnxtrain data` writes it; a model with
several inputs (a transformer's `input_ids`, `attention_mask`...) takes one array per input, named after it, and
the labels as `y`: `np.savez("train.npz", input_ids=ids, attention_mask=mask, y=labels)`.

Options come from, in increasing priority: the defaults, the options stored in the artifacts by
`onnxtrain generate --epochs ...`, with --resume the options the resumed run was trained with, and the command
line.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import sys
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

from onnxtrain.cli.common import Artifacts, CliError, quiet_onnxruntime, read_model, stored_loss, stored_train_config
from onnxtrain.cli.plot import have_matplotlib, write_curve
from onnxtrain.cli.progress import PROGRESS_MODES, Progress
from onnxtrain.errors import NonFiniteError

__all__ = ["TrainOptions", "FitResult", "add_train_options", "resolve_options", "given_options", "fit",
           "add_parser", "metric_misfit", "fitting_metrics", "load_for"]

PROGRESS_KEY = "onnxtrain.progress"
RUN_FILES = ("last.ckpt", "best.ckpt", "training_curve.png", "metrics.jsonl")  # what a run writes in DIR/run/
STEP_CHECKPOINT = re.compile(r"step-(\d+)\.ckpt")  # ... and with --save-every-steps: step-<global step>.ckpt
SCHEDULERS = ("none", "linear", "cosine", "step")


@dataclass
class TrainOptions:
    epochs: int = 5
    batch_size: int = 32
    lr: float = 1e-3
    scheduler: str = "none"
    warmup_steps: int = 0
    min_lr: float = 0.0
    decay_every: int = 1        # epochs between two decays of the step scheduler
    gamma: float = 0.5          # decay factor of the step scheduler
    metrics: list[str] | None = None  # None: accuracy for classification artifacts with predictions
    val_split: float = 0.0
    seed: int = 0
    patience: int = 0           # early stopping: epochs without a better loss before the run stops (0: never)


_OPTION_HELP = {
    "epochs": "number of epochs (default 5)",
    "batch_size": "examples per optimizer step (default 32)",
    "lr": "learning rate (default 1e-3)",
    "scheduler": "learning-rate schedule over all steps: none, linear, cosine or step (default none)",
    "warmup_steps": "linear warm-up steps for the linear and cosine schedules (default 0)",
    "min_lr": "final learning rate of the cosine schedule (default 0)",
    "decay_every": "epochs between learning-rate decays of the step schedule (default 1)",
    "gamma": "decay factor of the step schedule (default 0.5)",
    "metrics": "metrics besides the loss: accuracy, top5_accuracy, binary_accuracy, mse, mae (default: "
               "accuracy for cross-entropy / nll, binary_accuracy for bce-with-logits: logit > 0 against target "
               "> 0.5, per label; none for regression)",
    "val_split": "fraction of the training data held out for validation when --val is not given (default 0)",
    "seed": "seed of the shuffling and of --val-split (default 0)",
    "patience": "stop early after this many epochs without a lower validation loss (training loss without "
                "validation data); best.ckpt holds the best epoch (default 0: never)",
}


def _metrics_list(text: str) -> list[str]:
    return [m.strip() for m in text.replace(" ", ",").split(",") if m.strip()]


def add_train_options(parser: argparse.ArgumentParser) -> None:
    """The options that `generate` can store in the artifacts and `train` reads (all default to None)."""
    group = parser.add_argument_group("training options (stored by generate, read by train)")
    group.add_argument("--epochs", type=int, help=_OPTION_HELP["epochs"])
    group.add_argument("--batch-size", type=int, help=_OPTION_HELP["batch_size"])
    group.add_argument("--lr", "--learning-rate", dest="lr", type=float, help=_OPTION_HELP["lr"])
    group.add_argument("--scheduler", choices=SCHEDULERS, help=_OPTION_HELP["scheduler"])
    group.add_argument("--warmup-steps", type=int, help=_OPTION_HELP["warmup_steps"])
    group.add_argument("--min-lr", type=float, help=_OPTION_HELP["min_lr"])
    group.add_argument("--decay-every", type=int, help=_OPTION_HELP["decay_every"])
    group.add_argument("--gamma", type=float, help=_OPTION_HELP["gamma"])
    group.add_argument("--metrics", type=_metrics_list, help=_OPTION_HELP["metrics"])
    group.add_argument("--val-split", type=float, help=_OPTION_HELP["val_split"])
    group.add_argument("--seed", type=int, help=_OPTION_HELP["seed"])
    group.add_argument("--patience", type=int, help=_OPTION_HELP["patience"])


def given_options(args: argparse.Namespace) -> dict:
    """The training options set on the command line."""
    return {k: getattr(args, k) for k in _OPTION_HELP if getattr(args, k, None) is not None}


def resolve_options(given: dict, stored: dict, where: str = "the stored training options") -> TrainOptions:
    """Defaults, overridden by `stored` (from the artifacts), overridden by `given` (the command line)."""
    from onnxtrain.runtime.loop import METRICS

    unknown = sorted(set(stored) - set(_OPTION_HELP))
    if unknown:
        raise CliError(f"{where} has unknown keys {unknown}; known: {', '.join(_OPTION_HELP)}")
    values = {**asdict(TrainOptions()), **stored, **given}
    checks = [
        ("epochs", lambda v: isinstance(v, int) and v >= 1, "a positive integer"),
        ("batch_size", lambda v: isinstance(v, int) and v >= 1, "a positive integer"),
        ("lr", lambda v: isinstance(v, (int, float)) and v > 0 and np.isfinite(v), "a positive number"),
        ("scheduler", lambda v: v in SCHEDULERS, f"one of {', '.join(SCHEDULERS)}"),
        ("warmup_steps", lambda v: isinstance(v, int) and v >= 0, "a non-negative integer"),
        ("min_lr", lambda v: isinstance(v, (int, float)) and v >= 0, "a non-negative number"),
        ("decay_every", lambda v: isinstance(v, int) and v >= 1, "a positive integer"),
        ("gamma", lambda v: isinstance(v, (int, float)) and 0 < v <= 1, "a number in (0, 1]"),
        ("metrics", lambda v: v is None or (isinstance(v, list) and all(m in METRICS for m in v)),
         f"a list of {', '.join(METRICS)}"),
        ("val_split", lambda v: isinstance(v, (int, float)) and 0 <= v < 1, "a fraction in [0, 1)"),
        ("seed", lambda v: isinstance(v, int) and v >= 0, "a non-negative integer"),
        ("patience", lambda v: isinstance(v, int) and v >= 0, "a non-negative integer"),
    ]
    metrics = values["metrics"]
    unknown_metrics = [m for m in metrics if m not in METRICS] if isinstance(metrics, list) else []
    if unknown_metrics:
        source = "--metrics" if "metrics" in given else f"metrics in {where}"
        raise CliError(f"{source}: unknown metric {unknown_metrics[0]!r}; available metrics: {', '.join(METRICS)}")
    for key, ok, expected in checks:
        if not ok(values[key]):
            source = f"--{key.replace('_', '-')}" if key in given else f"{key} in {where}"
            raise CliError(f"{source} must be {expected}, got {values[key]!r}")
    return TrainOptions(**values)


# -- one run ---------------------------------------------------------------------------------------------------------
@dataclass
class FitResult:
    state: object                 # onnxtrain.api.CheckpointState after the last step
    module: object                # onnxtrain.api.Module (in eval mode when a validation pass ran last)
    history: list[dict] = field(default_factory=list)
    last_checkpoint: str = ""
    best_checkpoint: str = ""
    log: str = ""
    plot: str | None = None
    interrupted: bool = False
    stopped_early: bool = False


class _StopOnSigint:
    """The first Ctrl-C asks the loop to stop after the current step (it then saves); a second one aborts."""

    def __init__(self):
        self.requested, self.previous = False, None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        print("\nonnxtrain: stopping after this step to save a checkpoint (press Ctrl-C again to abort without "
              "saving)", file=sys.stderr, flush=True)

    def __exit__(self, *exc):
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)


def _make_scheduler(optimizer, opts: TrainOptions, steps_per_epoch: int):
    from onnxtrain.api import CosineLRScheduler, LinearLRScheduler, StepLRScheduler

    total = max(1, opts.epochs * steps_per_epoch)
    if opts.scheduler == "none":
        optimizer.set_learning_rate(opts.lr)
        return None
    if opts.warmup_steps > total:
        raise CliError(f"--warmup-steps {opts.warmup_steps} is more than the {total} steps of the run")
    if opts.scheduler == "linear":
        return LinearLRScheduler(optimizer, opts.warmup_steps, total, opts.lr)
    if opts.scheduler == "cosine":
        return CosineLRScheduler(optimizer, total, opts.lr, opts.warmup_steps, opts.min_lr)
    return StepLRScheduler(optimizer, opts.decay_every * steps_per_epoch, opts.lr, opts.gamma)


def _save(state, path: str, progress: dict) -> None:
    from onnxtrain.api import CheckpointState

    state.properties[PROGRESS_KEY] = json.dumps(progress)
    CheckpointState.save_checkpoint(state, path, include_optimizer_state=True)


def step_checkpoints(run_dir: str) -> dict[int, str]:
    """The step checkpoints of the run in ``run_dir``: global step -> path, oldest first."""
    if not os.path.isdir(run_dir):
        return {}
    found = {int(m.group(1)): os.path.join(run_dir, m.group(0))
             for m in map(STEP_CHECKPOINT.fullmatch, os.listdir(run_dir)) if m}
    return dict(sorted(found.items()))


def run_files(run_dir: str) -> list[str]:
    """Every file a run wrote in ``run_dir`` (that a new run sets aside)."""
    return [os.path.join(run_dir, f) for f in RUN_FILES] + list(step_checkpoints(run_dir).values())


def _keep_step_checkpoint(last: str, run_dir: str, step: int, keep_last: int) -> str:
    """Make the state just saved in ``last`` also ``run_dir/step-<step>.ckpt`` (a hard link: no second write; a
    copy where links are not supported), atomically; then delete all but the ``keep_last`` newest (0: keep all)."""
    path = os.path.join(run_dir, f"step-{step}.ckpt")
    staged = path + ".partial"
    if os.path.lexists(staged):
        os.remove(staged)
    try:
        os.link(last, staged)
    except OSError:
        shutil.copyfile(last, staged)
    os.replace(staged, path)
    if keep_last:
        for old in list(step_checkpoints(run_dir).values())[:-keep_last]:
            os.remove(old)
    return path


def check_run_dir(artifacts: Artifacts, resume: bool | str, restart: bool) -> str:
    """The checkpoint a run starts from; an error if it would resume nothing or silently replace a run.
    ``resume``: True or "last" continues DIR/run/last.ckpt, "best" DIR/run/best.ckpt, another string the
    checkpoint at that path."""
    last = os.path.join(artifacts.run_dir, "last.ckpt")
    if resume == "best":
        resume = os.path.join(artifacts.run_dir, "best.ckpt")
        if not os.path.isfile(resume):
            raise CliError(f"--resume best: there is no best checkpoint ({resume}); start a run without --resume")
    if resume and resume is not True and resume != "last":
        if not os.path.exists(resume):
            raise FileNotFoundError(f"--resume: checkpoint not found: {resume}")
        if os.path.isdir(resume):
            raise CliError(f"--resume {resume} is a folder; expected a checkpoint file such as "
                           f"{os.path.join(artifacts.run_dir, 'step-100.ckpt')}, or no value for last.ckpt")
        return resume
    if resume:
        if not os.path.isfile(last):
            raise CliError(f"nothing to resume: {last} does not exist (start a run without --resume)")
        return last
    if os.path.isfile(last) and not restart:
        raise CliError(f"{artifacts.run_dir} already holds a run; pass --resume to continue it or --restart to start "
                       "over")
    return artifacts.checkpoint


def _progress_of(path: str) -> dict | None:
    """The progress record of a checkpoint written by a run (read from its header, not its weights), or None
    (unreadable, or not a run's)."""
    from onnxtrain.checkpoint.format import load_properties

    try:
        return json.loads(load_properties(path)[PROGRESS_KEY])
    except Exception:  # a damaged later file is set aside all the same
        return None


def resumed_options(path: str) -> dict:
    """The training options of the run whose checkpoint ``path`` is, so that `train --resume` goes on with the
    run's epochs, learning rate and schedule rather than the defaults; the command line still overrides them."""
    done = _progress_of(path) or {}
    if isinstance(done.get("options"), dict):
        return {k: v for k, v in done["options"].items() if k in _OPTION_HELP}
    return {k: done[k] for k in ("batch_size", "seed") if k in done}  # a record without the options


def _rewind(run_dir: str, done: dict, files: dict[str, str], log_path: str,
            log: Callable[[str], None]) -> None:
    """Resuming from a checkpoint older than last.ckpt: the files written after it (last.ckpt, later step
    checkpoints, a best.ckpt of a later epoch, the log) move to run/previous/, and the log starts again with its
    records up to the checkpoint, so the resumed run's files are one consistent history."""
    later = [p for s, p in step_checkpoints(run_dir).items() if s > done["global_step"]]
    later.append(files["last"])
    best = _progress_of(files["best"]) if os.path.isfile(files["best"]) else None
    if os.path.isfile(files["best"]) and (best is None or best.get("best_epoch") != done.get("best_epoch")):
        later.append(files["best"])
    keep = []
    if os.path.isfile(log_path):
        with open(log_path) as f:
            for line in filter(str.strip, f):
                entry = json.loads(line)
                if "train_loss" in entry and entry["epoch"] > done["epoch"]:
                    break
                keep.append(line)
        later.append(log_path)
    kept = _set_aside(run_dir, later)
    if keep:
        with open(log_path, "w") as f:
            f.writelines(keep)
    if kept:
        log(f"resuming from step {done['global_step']}: the run's later files are kept in {kept}")


def _set_aside(run_dir: str, files: list[str]) -> str | None:
    """Move the ``files`` that exist into ``run_dir/previous/`` (emptied first); returns that folder, or None if
    there was nothing to move. A restarted run that fails before its first epoch leaves the last good one there."""
    present = [f for f in dict.fromkeys(files) if os.path.isfile(f)]
    if not present:
        return None
    previous = os.path.join(run_dir, "previous")
    if os.path.isdir(previous):
        shutil.rmtree(previous)
    os.makedirs(previous)
    for f in present:
        os.replace(f, os.path.join(previous, os.path.basename(f)))
    return previous


def fit(artifacts: Artifacts, train: tuple[np.ndarray, np.ndarray], val: tuple[np.ndarray, np.ndarray] | None,
        opts: TrainOptions, *, metrics: list[str], resume: bool | str = False, restart: bool = False,
        progress: Progress | None = None, log: Callable[[str], None] = print, title: str = "",
        log_path: str | None = None, header: str | None = None, save_every_steps: int = 0,
        keep_last: int = 3, update_in_backward: bool = False) -> FitResult:
    """Train on (x, y) arrays that already fit the model (see onnxtrain.data.fit_dataset), writing DIR/run/.

    Args:
        resume: True continues from DIR/run/last.ckpt, a path from that checkpoint of the run (an earlier one sets
            the run's later files aside); restart: replace an existing run (else that is an error).
        log: receives one line per epoch; progress: the per-step display; log_path: the JSON-lines log
            (default DIR/run/metrics.jsonl); header: logged once the checkpoint and models are loaded.
        save_every_steps: also write DIR/run/step-<S>.ckpt (and last.ckpt) every that many steps (0: never);
            keep_last: how many of those to keep, the newest (0: all).
        update_in_backward: ``Optimizer(..., update_in_backward=True)``: each training step updates the parameters
            during the backward, holding no gradient vector (one copy of the parameters less; docs/memory.md).
    """
    from onnxtrain.api import CheckpointState, Module, Optimizer
    from onnxtrain.conventions import TrainingMeta
    from onnxtrain.runtime.loop import Totals, batches, evaluate, format_metrics, num_batches, train_epoch

    quiet_onnxruntime()
    progress = progress or Progress("auto")
    run_dir = artifacts.run_dir
    last, best = os.path.join(run_dir, "last.ckpt"), os.path.join(run_dir, "best.ckpt")
    log_path = log_path or os.path.join(run_dir, "metrics.jsonl")
    plot_path = os.path.join(run_dir, "training_curve.png")
    if artifacts.optimizer is None:
        raise CliError(f"{artifacts.directory} has no optimizer model, so it cannot be trained; regenerate it with "
                       "`onnxtrain generate MODEL.onnx -o DIR --optimizer adamw`")
    training_model = read_model(artifacts.training, "training model")
    if not TrainingMeta.from_model(training_model).trainable:
        raise CliError(f"{artifacts.directory} has no trainable parameters (every one is frozen), so training would "
                       "change nothing; regenerate it with the parameters to train (--requires-grad NAME ...)")
    if save_every_steps < 0 or keep_last < 0:
        raise CliError(f"--save-every-steps and --keep-last must be non-negative integers, got {save_every_steps} "
                       f"and {keep_last}")
    start_checkpoint = check_run_dir(artifacts, resume, restart)
    if os.path.abspath(os.path.dirname(start_checkpoint)) == os.path.abspath(os.path.join(run_dir, "previous")):
        raise CliError(f"--resume {start_checkpoint} is in {os.path.dirname(start_checkpoint)}, which resuming "
                       "empties to keep the run's later files; copy it elsewhere first")
    state = CheckpointState.load_checkpoint(start_checkpoint)
    module = Module(training_model, state,
                    read_model(artifacts.eval, "eval model"), on_nonfinite="raise")
    optimizer = Optimizer(artifacts.optimizer, module, update_in_backward=update_in_backward)

    with open(artifacts.training, "rb") as f:  # which artifacts a checkpoint is of (for --resume CKPT)
        artifacts_crc = zlib.crc32(f.read())
    done = {"epoch": 0, "batch": 0, "global_step": 0, "totals": None, "best": None, "best_epoch": None}
    if resume:
        try:
            done.update(json.loads(state.properties[PROGRESS_KEY]))
        except (KeyError, json.JSONDecodeError):
            raise CliError(f"{start_checkpoint} has no training progress record ({PROGRESS_KEY}); it was not written "
                           "by onnxtrain train (the initial checkpoint or an export cannot be resumed: start a run "
                           "without --resume)") from None
        if (os.path.abspath(start_checkpoint) != os.path.abspath(last)
                and done.get("artifacts_crc", artifacts_crc) != artifacts_crc):
            raise CliError(f"--resume {start_checkpoint} is a checkpoint of a run of other artifacts (another training "
                           f"model than {artifacts.training}); resume it with the artifact folder it was trained with")
        if done["epoch"] >= opts.epochs:
            raise CliError(f"the run in {run_dir} has already finished {done['epoch']} epochs; pass --epochs N with "
                           f"N > {done['epoch']} to train further")
    if header:
        log(header)

    x, y = train
    if resume and done["batch"] and (done.get("batch_size", opts.batch_size), done.get("examples", len(x))) != (
            opts.batch_size, len(x)):
        raise CliError(f"the run in {run_dir} stopped in epoch {done['epoch'] + 1} after {done['batch']} batches of "
                       f"{done.get('batch_size')} over {done.get('examples')} examples; resume it with the same "
                       f"--batch-size and data (here {opts.batch_size} and {len(x)}), or start over with --restart")
    labels_crc = zlib.crc32(np.ascontiguousarray(y).tobytes())  # the same examples in the same shuffled order
    if resume and done["batch"] and (done.get("seed", opts.seed), done.get("labels_crc", labels_crc)) != (
            opts.seed, labels_crc):
        changed = (f"--seed {opts.seed} differs from that run's ({done['seed']})" if done.get("seed", opts.seed)
                   != opts.seed else "the labels of the data differ from that run's")
        raise CliError(f"the run in {run_dir} stopped in epoch {done['epoch'] + 1} after {done['batch']} batches; "
                       f"{changed}, so the rest of the epoch would not be the examples it has not seen yet: resume "
                       "it with the same --seed and data, or start over with --restart")
    done.update(batch_size=opts.batch_size, examples=len(x), seed=opts.seed, labels_crc=labels_crc,
                artifacts_crc=artifacts_crc, options=asdict(opts))
    steps_per_epoch = num_batches(len(x), opts.batch_size)
    scheduler = _make_scheduler(optimizer, opts, steps_per_epoch)
    if scheduler is not None and done["global_step"]:
        scheduler.count = done["global_step"]
        optimizer.set_learning_rate(scheduler.lr_at(scheduler.count))

    os.makedirs(run_dir, exist_ok=True)
    if resume and os.path.abspath(start_checkpoint) != os.path.abspath(last):
        ahead = _progress_of(last) if os.path.isfile(last) else None
        if ahead is None or ahead.get("global_step", 0) != done["global_step"]:
            _rewind(run_dir, done, {"last": last, "best": best}, log_path, log)
    history: list[dict] = []
    if resume and os.path.isfile(log_path):
        with open(log_path) as f:
            history = [r for r in map(json.loads, filter(str.strip, f)) if "train_loss" in r]
    if not resume:  # a new run: nothing of the previous one may be mistaken for this one's, nor lost with it
        kept = _set_aside(run_dir, [*run_files(run_dir), plot_path, log_path])
        if kept:
            log(f"the previous run's files are kept in {kept} until the next --restart")
    log_file = open(log_path, "a" if resume else "w")
    record = lambda r: (log_file.write(json.dumps(r) + "\n"), log_file.flush())  # noqa: E731

    result = FitResult(state, module, history, last, best, log_path)
    try:
        record({"event": "resume" if resume else "start", "time": time.time(), "options": asdict(opts),
                "metrics": metrics, "train_examples": len(x), "val_examples": len(val[0]) if val else 0,
                "from_checkpoint": start_checkpoint})
        def on_step(update: Callable[[int, float], None], epoch: int, totals: Totals, steps_before: int,
                    lr_start: float) -> Callable[[int, float], None]:
            """The progress display's step callback, saving a step checkpoint every ``save_every_steps``."""
            def step_done(n: int, loss: float) -> None:
                if metrics:
                    update(n, loss, metrics=totals.metrics())
                else:
                    update(n, loss)
                step = done["global_step"] + totals.steps - steps_before
                # the epoch's last step is saved after the epoch's bookkeeping, as an epoch checkpoint
                if save_every_steps and step % save_every_steps == 0 and totals.steps < steps_per_epoch:
                    _save(state, last, {**done, "epoch": epoch, "batch": totals.steps, "global_step": step,
                                        "totals": asdict(totals), "lr_start": lr_start})
                    _keep_step_checkpoint(last, run_dir, step, keep_last)
                    record({"event": "checkpoint", "epoch": epoch + 1, "batch": totals.steps, "step": step,
                            "time": time.time()})
            return step_done

        with _StopOnSigint() as stop:
            for epoch in range(done["epoch"], opts.epochs):
                skip = done["batch"] if epoch == done["epoch"] else 0
                totals = Totals(**done["totals"]) if skip and done["totals"] else Totals()
                steps_before, examples_before = totals.steps, totals.num_examples
                desc = f"epoch {epoch + 1}/{opts.epochs}"
                lr_start = optimizer.get_learning_rate()
                if skip and "lr_start" in done:  # the epoch's first rate, not that of the step it resumes at
                    lr_start = done["lr_start"]
                data = batches(x, y, opts.batch_size, shuffle=True, seed=opts.seed, epoch=epoch, skip=skip)

                try:
                    with progress.epoch(desc, steps_per_epoch - skip, len(x) - skip * opts.batch_size) as update:
                        res = train_epoch(module, optimizer, data, scheduler=scheduler, metrics=metrics,
                                          on_step=on_step(update, epoch, totals, steps_before, lr_start),
                                          should_stop=lambda: stop.requested, totals=totals)
                except NonFiniteError as exc:  # the parameters are still those before the bad batch
                    record({"event": "nonfinite", "epoch": epoch + 1, "batch": totals.steps + 1, "time": time.time()})
                    kept = f"{last} holds epoch {epoch}" if epoch else "no epoch was completed"
                    raise NonFiniteError(f"training stopped in epoch {epoch + 1} at batch {totals.steps + 1}: the loss "
                                         f"is not finite (NaN or infinite); {kept}; lower the learning rate (--lr) "
                                         "or check the data") from exc
                global_step = done["global_step"] + res.steps - steps_before
                done["global_step"] = global_step
                if res.stopped:
                    if res.steps >= steps_per_epoch:  # stopped on the epoch's last step: finish the epoch normally
                        stop.requested, res.stopped = True, False
                    else:
                        _save(state, last, {**done, "epoch": epoch, "batch": res.steps, "totals": asdict(res.totals),
                                            "lr_start": lr_start})
                        record({"event": "interrupted", "epoch": epoch + 1, "batch": res.steps, "time": time.time()})
                        log(f"interrupted in epoch {epoch + 1} after {res.steps}/{steps_per_epoch} batches; "
                            f"saved {last} (continue with --resume)")
                        result.interrupted = True
                        break
                entry = {"epoch": epoch + 1, "step": global_step, "lr": float(f"{lr_start:.6g}"),
                         "train_loss": res.loss,
                         **{f"train_{k}": v for k, v in res.metrics.items()}, "seconds": round(res.seconds, 4)}
                line = f"{desc}  train {format_metrics(res.loss, res.metrics)}"
                score = res.loss
                if val is not None:
                    v = evaluate(module, batches(val[0], val[1], max(opts.batch_size, 256)), metrics=metrics)
                    entry.update({"val_loss": v.loss, **{f"val_{k}": m for k, m in v.metrics.items()}})
                    line += f" | val {format_metrics(v.loss, v.metrics)}"
                    score = v.loss
                rate = (res.num_examples - examples_before) / max(res.seconds, 1e-9)  # this session's share only
                entry["examples_per_second"] = round(rate, 1)
                line += f" | {res.seconds:.1f}s {rate:,.0f} ex/s"
                entry["time"] = time.time()
                improved = done["best"] is None or score < done["best"]
                if improved:
                    done["best"], done["best_epoch"] = score, epoch + 1
                done.update(epoch=epoch + 1, batch=0, totals=None)
                done.pop("lr_start", None)
                _save(state, last, done)
                if improved:
                    _save(state, best, done)
                if save_every_steps and global_step % save_every_steps == 0:
                    _keep_step_checkpoint(last, run_dir, global_step, keep_last)
                history.append(entry)
                record(entry)
                log(line)
                stale = epoch + 1 - done["best_epoch"]
                if opts.patience and stale >= opts.patience and epoch + 1 < opts.epochs:
                    record({"event": "early_stop", "epoch": epoch + 1, "best_epoch": done["best_epoch"],
                            "time": time.time()})
                    log(f"stopped early: no lower {'validation' if val is not None else 'training'} loss for {stale} "
                        f"epochs (--patience {opts.patience}); {best} holds epoch {done['best_epoch']}")
                    result.stopped_early = True
                    break
                if stop.requested:
                    if epoch + 1 < opts.epochs:
                        record({"event": "interrupted", "epoch": epoch + 1, "batch": 0, "time": time.time()})
                        log(f"interrupted after epoch {epoch + 1}; saved {last} (continue with --resume)")
                        result.interrupted = True
                    break
    finally:
        log_file.close()
        if history and write_curve(history, plot_path, title):
            result.plot = plot_path
    return result


def describe_files(result: FitResult) -> list[str]:
    saved = [f"{path} ({which})" for path, which in ((result.last_checkpoint, "last"), (result.best_checkpoint, "best"))
             if os.path.isfile(path)]
    steps = step_checkpoints(os.path.dirname(result.last_checkpoint)) if result.last_checkpoint else {}
    if steps:
        saved.append(f"{len(steps)} step checkpoints up to {os.path.basename(list(steps.values())[-1])}")
    lines = [f"checkpoints: {', '.join(saved) or 'none'}", f"log:         {result.log}"]
    if result.plot:
        lines.append(f"plot:        {result.plot}")
    elif not have_matplotlib():
        lines.append("plot:        not written: matplotlib is not installed (pip install 'onnxtrain[plot]')")
    return lines


# -- the command ----------------------------------------------------------------------------------------------------
def add_parser(sub) -> None:
    p = sub.add_parser("train", help="train the artifacts on a dataset", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    # optional for argparse only: `train --resume DIR` (no CKPT) gives the folder to --resume (see _artifact_dir)
    p.add_argument("dir", metavar="DIR", nargs="?", help="the artifact folder written by `onnxtrain generate`")
    p.add_argument("--data", required=True, metavar="TRAIN.npz",
                   help="training data: arrays x and y (see `onnxtrain data`), or one array per model input by name")
    p.add_argument("--val", metavar="VAL.npz", help="validation data, evaluated after every epoch")
    add_train_options(p)
    p.add_argument("--resume", nargs="?", const="last", metavar="CKPT",
                   help="continue the run saved in DIR/run/last.ckpt, or from CKPT: `best` or the path of an earlier "
                        "checkpoint of it (e.g. DIR/run/step-200.ckpt; the run's later files move to "
                        "DIR/run/previous/); `train --resume DIR` continues DIR's last run")
    p.add_argument("--save-every-steps", type=int, default=0, metavar="N",
                   help="also save the run every N optimizer steps, as DIR/run/step-<S>.ckpt and last.ckpt, to "
                        "resume mid-epoch after a crash (default 0: only after every epoch)")
    p.add_argument("--keep-last", type=int, default=3, metavar="K",
                   help="keep the K newest step checkpoints of --save-every-steps, deleting older ones "
                        "(default 3; 0 keeps all)")
    p.add_argument("--restart", action="store_true",
                   help="start over; the previous run's checkpoints, log and plot move to DIR/run/previous/")
    p.add_argument("--update-in-backward", action="store_true",
                   help="update each parameter during the backward, as soon as its gradient exists: no gradient "
                        "vector is held (one copy of the parameters less, for models that do not fit otherwise; "
                        "same results, a little slower; not with global-norm clipping)")
    p.add_argument("--log", metavar="PATH", help="where to write the per-epoch records as JSON lines "
                   "(default DIR/run/metrics.jsonl)")
    p.add_argument("--progress", choices=PROGRESS_MODES, default="auto",
                   help="progress display: a tqdm bar on a terminal, plain lines otherwise (default auto)")
    p.add_argument("--prefix", default="", help="the file-name prefix given to generate")
    p.set_defaults(run=run)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}es" if word == "batch" else f"{n} {word}s"


def default_metrics(spec, loss: str | None = None) -> list[str]:
    """accuracy for class scores, binary_accuracy (logit > 0 against target > 0.5, per label) for a
    BCE-with-logits loss (``loss``: the LossType name the artifacts record), else none."""
    if spec.predictions is None:
        return []
    if loss == "BCEWithLogitsLoss":
        return ["binary_accuracy"]
    return ["accuracy"] if spec.num_classes is not None else []


def _dims(shape) -> str:
    return "[" + ", ".join(["N", *(str(d) if isinstance(d, int) else "?" for d in shape)]) + "]"


def _class_axis(scores: list, labels: list) -> int | None:
    """Where the class scores are in predictions shaped [N, *scores] for labels shaped [N, *labels], as
    onnxtrain.runtime.loop reads them: 0 ([N, classes, ...], torch's layout, preferred), -1 ([N, ..., classes], a
    tagger's or language model's), None when neither fits (run-time sizes fit any size)."""
    def fits(rest: list) -> bool:
        return all(not isinstance(s, int) or s == n for s, n in zip(rest, labels))

    if len(scores) != len(labels) + 1:
        return None
    return 0 if fits(scores[1:]) else -1 if fits(scores[:-1]) else None


def metric_misfit(name: str, prediction_shape: tuple | None, y: np.ndarray) -> str | None:
    """Why the metric ``name`` cannot compare predictions of ``prediction_shape`` (the model output's static
    shape) with the labels ``y`` as onnxtrain.runtime.loop computes it, or None when it fits (or is unknown)."""
    if prediction_shape is None or len(prediction_shape) == 0:
        return None
    scores, labels = list(prediction_shape[1:]), list(y.shape[1:])
    if name in ("accuracy", "top5_accuracy"):
        if y.dtype.kind not in "iu":
            return f"it compares class scores with integer class indices, but the labels are {y.dtype} targets"
        axis = _class_axis(scores, labels)
        if axis is None:
            return (f"it reads class scores (one more axis than the labels), but the predictions have shape "
                    f"{_dims(scores)} and the labels {_dims(labels)}" if len(scores) != len(labels) + 1 else
                    f"it reads the class scores on axis 1 or the last axis, but the predictions have shape "
                    f"{_dims(scores)} for labels of shape {_dims(labels)}")
        if name == "top5_accuracy" and isinstance(scores[axis], int) and scores[axis] <= 5:
            return f"with {scores[axis]} classes every label is among the top 5"
        return None
    if all(isinstance(d, int) for d in scores) and int(np.prod(scores)) != int(np.prod(labels)):
        return (f"it compares each prediction with one label, but the predictions have shape {_dims(scores)} and "
                f"the labels {_dims(labels)}")
    return None


def fitting_metrics(requested: list[str] | None, spec, y: np.ndarray, loss: str | None = None) -> list[str]:
    """The metrics to compute: ``requested`` (an error names one that does not fit the predictions and labels),
    or by default those of default_metrics(spec, loss) that fit."""
    if requested is None:
        return [m for m in default_metrics(spec, loss) if metric_misfit(m, spec.prediction_shape, y) is None]
    for name in requested:
        why = metric_misfit(name, spec.prediction_shape, y)
        if why is not None:
            raise CliError(f"--metrics {name} does not fit these artifacts: {why}; accuracy and top5_accuracy fit "
                           "class scores, binary_accuracy one logit per label, mse and mae regression outputs")
    return list(requested)


def check_targets(y: np.ndarray, loss: str | None, path: str, what: str = "--data") -> None:
    """A BCE-with-logits loss reads its targets as probabilities: values outside [0, 1] (regression targets,
    class indices of more than two classes) would train on without a word, towards nothing meaningful."""
    if loss != "BCEWithLogitsLoss" or y.size == 0 or y.dtype.kind not in "iuf":
        return
    low, high = y.min(), y.max()
    if low < 0 or high > 1:
        example = int(np.flatnonzero(((y < 0) | (y > 1)).reshape(len(y), -1).any(axis=1))[0])
        raise CliError(f"{what} {path}: the targets of a bce-with-logits loss are probabilities in [0, 1] (1: the "
                       f"positive class), but they range from {low:g} to {high:g} (example {example}); regenerate "
                       "the artifacts with --loss cross-entropy for class indices, or --loss mse for regression")


def load_for(path: str, spec, what: str = "--data", loss: str | None = None):
    """The dataset file ``path`` fitted to ``spec``, without the examples whose every label is ignored (a warning
    says how many; none left is an error); ``loss`` (the stored LossType name) checks the targets' range."""
    import warnings

    from onnxtrain.data import fit_dataset, load_dataset
    from onnxtrain.data.match import drop_fully_ignored

    x, y, dropped = drop_fully_ignored(*fit_dataset(load_dataset(path, spec.names), spec, path), spec)
    check_targets(y, loss, path, what)
    if dropped and len(y) == 0:
        raise CliError(f"{what} {path}: every label is the loss's ignore_index {spec.ignore_index}, so there is "
                       "nothing to learn or measure")
    if dropped:
        warnings.warn(f"{path}: {dropped} examples whose every label is the ignore_index {spec.ignore_index} add "
                      "nothing to the loss and are left out", stacklevel=2)
    return x, y


def _check_log_path(path: str) -> None:
    """--log must name a file in an existing folder (checked before a run sets the previous one aside)."""
    if os.path.isdir(path):
        raise CliError(f"--log {path} is a folder; expected the path of the JSON-lines file to write")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise CliError(f"--log {path}: the folder {folder} does not exist")


def _artifact_dir(args: argparse.Namespace) -> None:
    """DIR is required; written as `train --resume DIR ...`, argparse hands the folder to the optional --resume
    value and leaves DIR empty: that is `train DIR --resume` (continue DIR's last run)."""
    if args.dir is not None:
        return
    if isinstance(args.resume, str) and args.resume not in ("last", "best") and os.path.isdir(args.resume):
        args.dir, args.resume = args.resume, "last"
        return
    raise CliError("the following arguments are required: DIR (the artifact folder written by `onnxtrain generate`)")


def run(args: argparse.Namespace) -> int:
    from onnxtrain.data import data_spec
    from onnxtrain.runtime.loop import check_metrics

    _artifact_dir(args)
    if args.resume and args.restart:
        raise CliError("--resume and --restart exclude each other")
    if args.save_every_steps < 0:
        raise CliError(f"--save-every-steps must be a non-negative integer, got {args.save_every_steps}")
    if args.keep_last < 0:
        raise CliError(f"--keep-last must be a non-negative integer (0 keeps every step checkpoint), got "
                       f"{args.keep_last}")
    if args.keep_last != 3 and not args.save_every_steps:
        raise CliError("--keep-last applies to the step checkpoints of --save-every-steps N; give that too")
    artifacts = Artifacts.locate(args.dir, args.prefix)
    start = check_run_dir(artifacts, args.resume, args.restart)
    if args.log is not None:
        _check_log_path(args.log)
    training_model = read_model(artifacts.training, "training model")
    recorded = resumed_options(start) if args.resume else {}
    opts = resolve_options(given_options(args), {**stored_train_config(training_model), **recorded})
    if args.val and opts.val_split:
        raise CliError("give either --val or --val-split, not both")
    spec = data_spec(training_model)
    check_metrics(opts.metrics or [], spec.predictions)
    loss = stored_loss(training_model)
    x, y = load_for(args.data, spec, loss=loss)
    metrics = fitting_metrics(opts.metrics, spec, y, loss)
    val = load_for(args.val, spec, "--val", loss) if args.val else None
    if opts.val_split:
        n_val = int(round(len(x) * opts.val_split))
        if n_val < 1 or n_val >= len(x):
            raise CliError(f"--val-split {opts.val_split} of {len(x)} examples leaves {n_val} for validation and "
                           f"{len(x) - n_val} for training; both need at least one")
        order = np.random.default_rng(opts.seed).permutation(len(x))
        val = (x[order[:n_val]], y[order[:n_val]])
        x, y = x[order[n_val:]], y[order[n_val:]]
    header = (f"training {artifacts.directory}: {len(x)} examples" + (f", {len(val[0])} for validation" if val else "")
          + f"; {_plural(opts.epochs, 'epoch')} of {_plural(-(-len(x) // opts.batch_size), 'batch')} of "
          f"{opts.batch_size}; lr {opts.lr:g}"
          + (f" ({opts.scheduler})" if opts.scheduler != "none" else "")
          + (f"; metrics: {', '.join(metrics)}" if metrics else ""))
    result = fit(artifacts, (x, y), val, opts, metrics=metrics, resume=args.resume, restart=args.restart,
                 progress=Progress(args.progress), log=lambda s: print(s, flush=True),
                 title=os.path.basename(os.path.abspath(artifacts.directory)), log_path=args.log, header=header,
                 save_every_steps=args.save_every_steps, keep_last=args.keep_last,
                 update_in_backward=args.update_in_backward)
    for line in describe_files(result):
        print(line)
    return 130 if result.interrupted else 0
