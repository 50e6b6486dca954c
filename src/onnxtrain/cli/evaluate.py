"""`onnxtrain eval DIR --data DATA`: the loss and metrics of a checkpoint on a dataset (no parameter changes)."""

from __future__ import annotations

import argparse
import json

from onnxtrain.cli.common import Artifacts, quiet_onnxruntime, read_model, stored_loss
from onnxtrain.cli.progress import PROGRESS_MODES, Progress
from onnxtrain.cli.train import _metrics_list, fitting_metrics, load_for

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    p = sub.add_parser("eval", help="evaluate a checkpoint on a dataset", description=__doc__)
    p.add_argument("dir", metavar="DIR", help="the artifact folder")
    p.add_argument("--data", required=True, metavar="DATA.npz", help="the dataset (see `onnxtrain data`)")
    p.add_argument("--checkpoint", metavar="last|best|initial|PATH",
                   help="which weights (default: the last training checkpoint, else the initial one)")
    p.add_argument("--metrics", type=_metrics_list, help="metrics besides the loss, comma-separated: accuracy, "
                   "top5_accuracy, binary_accuracy, mse, mae (default: accuracy for cross-entropy / nll, "
                   "binary_accuracy for bce-with-logits: logit > 0 against target > 0.5, per label)")
    p.add_argument("--batch-size", type=int, default=256, help="examples per eval step (default 256)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--progress", choices=PROGRESS_MODES, default="auto",
                   help="progress display: a tqdm bar on a terminal, plain lines otherwise (default auto)")
    p.add_argument("--prefix", default="", help="the file-name prefix given to generate")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from onnxtrain.api import CheckpointState, Module
    from onnxtrain.cli.common import CliError
    from onnxtrain.data import data_spec
    from onnxtrain.runtime.loop import batches, check_metrics, evaluate, format_metrics, num_batches

    if args.batch_size < 1:
        raise CliError(f"--batch-size must be a positive integer, got {args.batch_size}")
    artifacts = Artifacts.locate(args.dir, args.prefix)
    checkpoint = artifacts.resolve_checkpoint(args.checkpoint)
    eval_model = read_model(artifacts.eval, "eval model")
    spec = data_spec(eval_model)
    check_metrics(args.metrics or [], spec.predictions)
    training_model = read_model(artifacts.training, "training model")
    loss = stored_loss(training_model)
    x, y = load_for(args.data, spec, loss=loss)
    metrics = fitting_metrics(args.metrics, spec, y, loss)
    quiet_onnxruntime()
    state = CheckpointState.load_checkpoint(checkpoint)
    module = Module(training_model, state, eval_model)
    with Progress(args.progress).epoch("eval", num_batches(len(x), args.batch_size), len(x)) as update:
        result = evaluate(module, batches(x, y, args.batch_size), metrics=metrics, on_step=update)
    if args.json:
        print(json.dumps({"checkpoint": checkpoint, "data": args.data, "examples": result.num_examples,
                          "loss": result.loss, **result.metrics}))
    else:
        print(f"{args.data}: {result.num_examples} examples, {format_metrics(result.loss, result.metrics)} "
              f"(checkpoint {checkpoint})")
    return 0
