"""``onnxtrain federated simulate``: also ``python -m onnxtrain.federated simulate ...``.

Importing this module does not import Flower, so the main CLI can register the subcommand with
:func:`add_parser` and call :func:`run` whether or not the ``flower`` extra is installed.
"""

from __future__ import annotations

import argparse
import sys

from onnxtrain.errors import OnnxTrainError

__all__ = ["add_parser", "run", "main"]


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``federated`` (with its ``simulate`` subcommand) to ``subparsers``; sets ``run=run`` as the other
    commands of ``onnxtrain.cli`` do."""
    parser = subparsers.add_parser("federated", help="federated learning on Flower (extra 'flower')",
                                   description="Federated learning with the onnxtrain runtime on Flower.")
    _add_commands(parser)
    return parser


def _add_commands(parser: argparse.ArgumentParser) -> None:
    commands = parser.add_subparsers(dest="federated_command", metavar="COMMAND", required=True)
    sim = commands.add_parser(
        "simulate", help="FedAvg with N simulated clients on a non-IID split of the digits",
        description="Run N clients on a non-IID (Dirichlet) split of scikit-learn's digits with Flower's "
                    "simulation engine; print each round's global accuracy and write the global model.")
    sim.add_argument("--clients", type=int, default=3, metavar="N", help="number of clients (default 3)")
    sim.add_argument("--rounds", type=int, default=3, metavar="R", help="number of FedAvg rounds (default 3)")
    sim.add_argument("--local-epochs", type=int, default=2, metavar="E", help="local epochs per round (default 2)")
    sim.add_argument("--batch-size", type=int, default=32)
    sim.add_argument("--lr", type=float, default=0.1, help="client learning rate (SGD, momentum 0.9; default 0.1)")
    sim.add_argument("--alpha", type=float, default=0.5,
                     help="Dirichlet concentration of the label split; smaller is more skewed (default 0.5)")
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument("--strategy", default="FedAvg",
                     help="Flower strategy derived from FedAvg, e.g. FedMedian, FedTrimmedAvg, Krum, FedAdam "
                          "(default FedAvg)")
    sim.add_argument("--proximal-mu", type=float, default=None, metavar="MU",
                     help="with --strategy FedProx: the weight of the proximal term mu/2 ||w - w_global||^2 that "
                          "keeps each client near the global model (Flower's default 0 trains as FedAvg)")
    sim.add_argument("--hidden", type=int, default=32, help="hidden units of the demo MLP (default 32)")
    sim.add_argument("--freeze-first-layer", action="store_true",
                     help="keep fc1 frozen on the devices: only fc2 travels")
    sim.add_argument("--artifacts-dir", default=None,
                     help="artifacts of a digits model to use instead of the demo MLP")
    sim.add_argument("--output-dir", default="federated-run", help="where artifacts/, global/ and the plot go")
    sim.add_argument("--plot", default=None, help="accuracy plot path (needs matplotlib; default "
                                                  "OUTPUT_DIR/accuracy.png when matplotlib is installed)")
    sim.add_argument("--verbose", action="store_true", help="show Flower's and Ray's logs")
    sim.set_defaults(run=run)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run the parsed ``federated`` command; errors propagate (the main CLI prints them as one line)."""
    try:
        from onnxtrain.federated.simulation import simulate
    except ImportError as exc:
        raise OnnxTrainError(str(exc)) from None
    frozen = ("fc1.weight", "fc1.bias") if args.freeze_first_layer else ()
    strategy_args = None
    if args.proximal_mu is not None:
        from onnxtrain.federated.proximal import check_mu

        if args.strategy != "FedProx":
            raise ValueError(f"--proximal-mu is the weight of FedProx's proximal term; add --strategy FedProx (the "
                             f"strategy is {args.strategy})")
        strategy_args = {"proximal_mu": check_mu(args.proximal_mu, "proximal-mu")}
    simulate(args.clients, args.rounds, output_dir=args.output_dir, artifacts_dir=args.artifacts_dir,
             local_epochs=args.local_epochs, batch_size=args.batch_size, learning_rate=args.lr, alpha=args.alpha,
             seed=args.seed, hidden=args.hidden, frozen=frozen, verbose=args.verbose, plot=args.plot,
             strategy=args.strategy, strategy_args=strategy_args)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m onnxtrain.federated simulate ...``"""
    parser = argparse.ArgumentParser(prog="python -m onnxtrain.federated",
                                     description="Federated learning with the onnxtrain runtime on Flower.")
    _add_commands(parser)
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except KeyboardInterrupt:
        print("onnxtrain federated: interrupted", file=sys.stderr)
        return 130
    except (OnnxTrainError, ValueError, OSError, RuntimeError) as exc:
        print(f"onnxtrain federated: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
