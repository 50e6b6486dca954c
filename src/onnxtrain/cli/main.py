"""The `onnxtrain` command line: one parser per sub-command, and one place that turns errors into one line.

Every error a user can cause ends the command with `onnxtrain: error: <what and how to fix it>` on stderr
and exit status 1 (2 for a bad command line, 130 after Ctrl-C); `--debug` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings

from onnxtrain import __version__

__all__ = ["main", "build_parser"]


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line that points to the help."""

    def error(self, message: str):
        command = self.prog.split()[1:] if self.prog.startswith("onnxtrain") else []
        help_cmd = " ".join(["onnxtrain", *command[:1], "--help"])
        print(f"onnxtrain: error: {message} (see `{help_cmd}`)", file=sys.stderr)
        raise SystemExit(2)


def _add_demo(sub) -> None:
    p = sub.add_parser("demo", help="on-device personalization of a digit classifier, end to end",
                       description="Pre-train a small CNN on scikit-learn's digits, personalize its last layers "
                                   "to one writer's style on the device, export it and run it with onnxruntime.")
    from onnxtrain.demo.run import add_arguments

    add_arguments(p)
    p.set_defaults(run=_run_demo)


def _run_demo(args: argparse.Namespace) -> int:
    from onnxtrain.demo.run import main_args

    return main_args(args)


def build_parser() -> argparse.ArgumentParser:
    from onnxtrain.cli import datafile, evaluate, export, generate, importer, info, ops, train, web_demo
    from onnxtrain.federated import cli as federated  # imports no Flower until the command runs

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show Python tracebacks for errors")
    parser = _Parser(prog="onnxtrain", parents=[common],
                     description="Train ONNX models on the device with the stock onnxruntime.",
                     epilog="Start with `onnxtrain demo`; see `onnxtrain COMMAND --help` for each command.")
    parser.add_argument("--version", action="version", version=f"onnxtrain {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for module in (generate, train, evaluate, export, info, datafile, ops, federated, importer):
        module.add_parser(sub)
    _add_demo(sub)
    web_demo.add_parser(sub)
    for action in sub.choices.values():  # --debug after the command works too
        action.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return parser


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.filename and exc.strerror:
        text = f"{exc.strerror}: {exc.filename}"
    elif isinstance(exc, KeyError) and exc.args:
        text = str(exc.args[0])
    else:
        text = str(exc) or type(exc).__name__
    return " ".join(text.split())


def _is_user_error(exc: BaseException) -> bool:
    from onnxtrain.errors import OnnxTrainError

    module = type(exc).__module__ or ""
    user = (OnnxTrainError, ValueError, TypeError, OSError, KeyError, NotImplementedError,
            ImportError)  # ImportError: an optional dependency is missing (the message says which)
    return (isinstance(exc, user)
            or module.startswith(("onnxruntime", "onnx")))


def _show_warning(message, category, filename, lineno, file=None, line=None):
    print(f"onnxtrain: warning: {' '.join(str(message).split())}", file=file or sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    debug = getattr(args, "debug", False)
    previous_showwarning = warnings.showwarning
    if not debug:
        warnings.showwarning = _show_warning
    try:
        return int(args.run(args) or 0)
    except KeyboardInterrupt:
        if debug:
            raise
        print("onnxtrain: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `onnxtrain info DIR | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as exc:
        if debug:
            raise
        prefix = "" if _is_user_error(exc) else f"internal error ({type(exc).__name__}; rerun with --debug " \
                                                "for the traceback and report it): "
        if type(exc).__module__.startswith("onnxruntime"):
            prefix = "onnxruntime: "
        print(f"onnxtrain: error: {prefix}{_one_line(exc)}", file=sys.stderr)
        return 1
    finally:
        warnings.showwarning = previous_showwarning


if __name__ == "__main__":
    raise SystemExit(main())
