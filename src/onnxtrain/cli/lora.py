"""The LoRA options of `onnxtrain generate` and `onnxtrain export`."""

from __future__ import annotations

import argparse
import os

from onnxtrain.cli.common import CliError

__all__ = ["add_lora_options", "lora_config", "export_adapter"]


def add_lora_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("LoRA adapters (the targeted weights stay frozen; --requires-grad adds e.g. a head)")
    g.add_argument("--lora-rank", type=int, metavar="R", help="add rank-R adapters to the --lora-targets")
    g.add_argument("--lora-alpha", type=float, metavar="A", help="scale = A / R (default 2R)")
    g.add_argument("--lora-targets", nargs="+", metavar="NAME",
                   help="MatMul / Gemm / 1x1 Conv weights or torch module paths, by name or glob "
                        "(e.g. query value, or '*query*' '*value*'), or all-linear (every MatMul / Gemm but the "
                        "output layer's)")
    g.add_argument("--lora-dropout", type=float, default=0.0, metavar="P", help="adapter input dropout (default 0)")
    g.add_argument("--lora-from", metavar="DIR", help="start from a Hugging Face PEFT adapter folder "
                   "(its rank, alpha, targets and weights)")


def lora_config(args: argparse.Namespace):
    """The LoRA the options describe, or None."""
    from onnxtrain.lora import LoRA

    if args.lora_from:
        if args.lora_rank is not None or args.lora_targets or args.lora_alpha is not None or args.lora_dropout:
            raise CliError("--lora-from takes rank, alpha, dropout and targets from the adapter; drop --lora-rank, "
                           "--lora-alpha, --lora-dropout and --lora-targets")
        if not os.path.isdir(args.lora_from):
            raise CliError(f"--lora-from {args.lora_from}: not a folder")
        return LoRA.from_peft(args.lora_from)
    if args.lora_rank is None:
        if args.lora_targets or args.lora_alpha is not None or args.lora_dropout:
            raise CliError("--lora-targets, --lora-alpha and --lora-dropout need --lora-rank R")
        return None
    if not args.lora_targets:
        raise CliError("--lora-rank needs --lora-targets NAME... (e.g. '*query*' '*value*')")
    alpha = args.lora_alpha if args.lora_alpha is not None else 2.0 * args.lora_rank
    try:
        return LoRA(rank=args.lora_rank, alpha=alpha, targets=list(args.lora_targets), dropout=args.lora_dropout)
    except (TypeError, ValueError) as exc:
        raise CliError(str(exc)) from None


def export_adapter(training_model: str, checkpoint: str, output_dir: str) -> dict[str, str]:
    """`onnxtrain export DIR --adapter -o OUT_DIR`: the PEFT adapter folder."""
    from onnxtrain.api import CheckpointState
    from onnxtrain.lora import save_peft_adapter

    state = CheckpointState.load_checkpoint(checkpoint)
    try:
        return save_peft_adapter(state, training_model, output_dir)
    except ValueError as exc:
        raise CliError(str(exc)) from None
