"""`onnxtrain generate MODEL.onnx -o DIR`: the training artifacts, with the options of generate_artifacts.

Training options given here (`--epochs`, `--batch-size`, `--lr`, ...) are stored in the training model's
metadata (`onnxtrain.train_config`, JSON), so the artifacts carry their recipe; `onnxtrain train` reads them
and its own command line overrides them.

Generating into a folder that `onnxtrain train` has trained moves that run (`DIR/run/`) into `DIR/run/previous/`:
its checkpoints belong to the artifacts written there before.
"""

from __future__ import annotations

import argparse
import json
import os

from onnxtrain.builtins import LossType, OptimType
from onnxtrain.cli.common import RUN_DIR, TRAIN_CONFIG_KEY, CliError, read_model
from onnxtrain.cli.lora import add_lora_options, lora_config
from onnxtrain.cli.train import add_train_options, given_options, resolve_options

__all__ = ["add_parser", "run", "LOSSES", "OPTIMIZERS", "loss_block", "optimizer_block", "set_aside_run"]

# command-line name -> built-in, from the artifacts' one table of them
LOSSES = {t.cli_name: t for t in LossType}
OPTIMIZERS = {**{t.cli_name: t for t in OptimType}, "none": None}
_LOSS_ALIASES = {"ce": "cross-entropy", "bce": "bce-with-logits"}


def _key(text: str) -> str:
    return text.lower().replace("-", "").replace("_", "").removesuffix("loss")


def _loss_name(text: str) -> str:
    """Accept `cross-entropy`, `CrossEntropyLoss`, `crossentropy`, `ce` ... (LossType names too)."""
    text = _LOSS_ALIASES.get(text.lower(), text)
    for name, loss in LOSSES.items():
        if _key(text) in (_key(name), _key(loss.name)):
            return name
    raise argparse.ArgumentTypeError(f"unknown loss {text!r} (choose from {', '.join(LOSSES)})")


def _optimizer_name(text: str) -> str:
    if text.lower() in OPTIMIZERS:
        return text.lower()
    raise argparse.ArgumentTypeError(f"unknown optimizer {text!r} (choose from {', '.join(OPTIMIZERS)})")


def add_parser(sub) -> None:
    p = sub.add_parser("generate", help="write training artifacts for an ONNX model", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", metavar="MODEL.onnx", help="the forward (inference) model")
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="folder for the artifacts")
    p.add_argument("--prefix", default="", help="prefix of every artifact file name")
    g = p.add_argument_group("loss")
    g.add_argument("--loss", type=_loss_name, required=True, metavar="LOSS",
                   help=f"one of {', '.join(LOSSES)} (or the LossType name, e.g. CrossEntropyLoss)")
    g.add_argument("--reduction", choices=("mean", "sum"), default="mean", help="loss reduction (default mean)")
    g.add_argument("--ignore-index", type=int, help="cross-entropy / nll: label value that adds no loss")
    g.add_argument("--class-axis", type=int, help="cross-entropy / nll: the scores' class axis (default 1; -1 for a "
                   "language model's (batch, sequence, vocabulary) logits)")
    g.add_argument("--huber-delta", type=float, help="huber: the delta (default 1.0)")
    g.add_argument("--loss-inputs", nargs="+", metavar="NAME",
                   help="model values fed to the loss (default: the first model output)")
    g = p.add_argument_group("optimizer")
    g.add_argument("--optimizer", type=_optimizer_name, default="adamw", metavar="OPT",
                   help="adamw (default), adam, sgd, or none (no optimizer model)")
    g.add_argument("--betas", type=float, nargs=2, metavar=("B1", "B2"), help="adam/adamw (default 0.9 0.999)")
    g.add_argument("--eps", type=float, help="adam/adamw epsilon (default 1e-6 for adamw, 1e-8 for adam)")
    g.add_argument("--weight-decay", type=float, help="weight decay (default 0)")
    g.add_argument("--adamw-mode", choices=("hf", "torch"), help="adamw update: hf (as onnxruntime-training, "
                   "default) or torch (torch.optim.AdamW)")
    g.add_argument("--momentum", type=float, help="sgd momentum (default 0)")
    g.add_argument("--dampening", type=float, help="sgd dampening (default 0)")
    g.add_argument("--nesterov", action="store_true", help="sgd: Nesterov momentum")
    g.add_argument("--max-norm", type=float, help="clip the global gradient norm to this value")
    g = p.add_argument_group("parameters")
    g.add_argument("--requires-grad", nargs="+", metavar="NAME",
                   help="parameters to train, by name or glob (default: every float weight)")
    g.add_argument("--frozen", nargs="+", metavar="NAME", help="parameters to keep fixed, by name or glob")
    g.add_argument("--trainable-ops", type=int, default=-1, metavar="N",
                   help="train only the parameters of the last N ops (a node that only prepares a weight, such as "
                        "an exporter's Transpose(W), is part of the op that reads it; default -1: all)")
    add_lora_options(p)
    g = p.add_argument_group("output")
    g.add_argument("--additional-outputs", nargs="*", metavar="NAME",
                   help="model values returned after the loss (default: the loss input, so that train and eval "
                        "can compute accuracy; give the option with no names for none)")
    g.add_argument("--nominal", action="store_true",
                   help="also write nominal_checkpoint (names, dtypes and shapes only)")
    g.add_argument("--ort-format", action="store_true", help="also write .ort files")
    g.add_argument("--train-step-model", action="store_true",
                   help="also write train_step_model.onnx: the training and optimizer graphs fused into one, which "
                        "the JavaScript package (js/) runs as one session per step")
    add_train_options(p)
    p.set_defaults(run=run)


def loss_block(args: argparse.Namespace):
    name = args.loss
    kwargs: dict = {"reduction": args.reduction}
    if args.ignore_index is not None:
        if name not in ("cross-entropy", "nll"):
            raise CliError(f"--ignore-index applies to the cross-entropy and nll losses, not {name}")
        kwargs["ignore_index"] = args.ignore_index
    if args.class_axis is not None:
        if name not in ("cross-entropy", "nll"):
            raise CliError(f"--class-axis applies to the cross-entropy and nll losses, not {name}")
        kwargs["class_axis"] = args.class_axis
    if args.huber_delta is not None:
        if name != "huber":
            raise CliError(f"--huber-delta applies to the huber loss, not {name}")
        kwargs["delta"] = args.huber_delta
    return LOSSES[name].block_class(**kwargs)


def optimizer_block(args: argparse.Namespace):
    name = args.optimizer
    only = {"betas": ("adam", "adamw"), "eps": ("adam", "adamw"), "adamw_mode": ("adamw",),
            "momentum": ("sgd",), "dampening": ("sgd",), "nesterov": ("sgd",)}
    for option, owners in only.items():
        if getattr(args, option) not in (None, False) and name not in owners:
            raise CliError(f"--{option.replace('_', '-')} applies to --optimizer {' or '.join(owners)}, not {name}")
    if name == "none":
        if args.weight_decay is not None or args.max_norm is not None:
            raise CliError("--weight-decay and --max-norm need an optimizer (--optimizer adamw, adam or sgd)")
        return None
    kwargs = {k: getattr(args, a) for k, a in (("betas", "betas"), ("eps", "eps"), ("weight_decay", "weight_decay"),
                                               ("max_norm", "max_norm"), ("mode", "adamw_mode"),
                                               ("momentum", "momentum"), ("dampening", "dampening"))
              if getattr(args, a) is not None}
    if args.nesterov:
        kwargs["nesterov"] = True
    if "betas" in kwargs:
        kwargs["betas"] = tuple(kwargs["betas"])
    return OPTIMIZERS[name].block_class(**kwargs)


def set_aside_run(directory: str, prefix: str = "") -> str | None:
    """Move the run that `onnxtrain train` left in ``directory`` (checkpoints of the artifacts written there
    before) into its ``previous/`` folder, so that no command mistakes them for the new artifacts' (train --resume,
    eval and export pick run/last.ckpt by default). Returns that folder, or None if there was no run."""
    from onnxtrain.cli.train import _set_aside, run_files

    run_dir = os.path.join(directory, prefix + RUN_DIR)
    return _set_aside(run_dir, run_files(run_dir))


def run(args: argparse.Namespace) -> int:
    from onnxtrain.artifacts import generate_artifacts
    from onnxtrain.artifacts.generate import convert_to_ort
    from onnxtrain.cli.info import artifact_summary
    from onnxtrain.ir.files import atomic_write_bytes

    config = given_options(args)
    resolve_options(config, {})  # reject bad values now rather than at training time
    model = read_model(args.model, "model")
    outputs = [o.name for o in model.graph.output]
    if args.additional_outputs is None:  # default: the predictions, for accuracy
        additional = list(args.loss_inputs or outputs[:1])
    else:
        additional = list(args.additional_outputs)
    paths = generate_artifacts(
        args.model, requires_grad=args.requires_grad, frozen_params=args.frozen, loss=loss_block(args),
        optimizer=optimizer_block(args), artifact_directory=args.output, prefix=args.prefix, ort_format=False,
        additional_output_names=additional or None, nominal_checkpoint=args.nominal,
        loss_input_names=args.loss_inputs, trainable_ops=args.trainable_ops, lora=lora_config(args))
    if config:
        training = read_model(paths["training"], "training model")
        for prop in list(training.metadata_props):
            if prop.key == TRAIN_CONFIG_KEY:
                training.metadata_props.remove(prop)
        training.metadata_props.add(key=TRAIN_CONFIG_KEY, value=json.dumps(config))
        atomic_write_bytes(paths["training"], training.SerializeToString())
    if args.train_step_model:
        from onnxtrain.artifacts.fused import write_train_step_model

        paths["train_step"] = str(write_train_step_model(args.output, args.prefix))
    if args.ort_format:
        convert_to_ort([paths[k] for k in ("training", "eval", "optimizer") if k in paths])
    print(f"wrote {', '.join(os.path.basename(p) for p in paths.values())} to {args.output}")
    kept = set_aside_run(args.output, args.prefix)
    if kept:
        print(f"the folder held a training run of the artifacts it had before; its files are kept in {kept} "
              "(eval and export use the new initial checkpoint)")
    for line in artifact_summary(args.output, args.prefix):
        print(line)
    return 0
