"""`onnxtrain ops`: which ONNX ops onnxtrain differentiates, and how (from onnxtrain.autodiff.coverage)."""

from __future__ import annotations

import argparse
import collections
import dataclasses

from onnxtrain.cli.common import CliError

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    p = sub.add_parser("ops", help="print the gradient coverage of the ONNX ops", description=__doc__)
    p.add_argument("ops", nargs="*", metavar="OP", help="only these ops (e.g. Conv Gelu), or MODEL.onnx: the ops "
                   "of that model")
    p.add_argument("--status", help="only ops with this status (e.g. rule, unsupported)")
    p.add_argument("--markdown", action="store_true", help="print the Markdown table of the documentation")
    p.set_defaults(run=run)


def _row(entry) -> dict:
    if dataclasses.is_dataclass(entry):
        return dataclasses.asdict(entry)
    if isinstance(entry, dict):
        return entry
    return dict(enumerate(entry))


def _render(rows: list[dict]) -> str:
    """Aligned columns under a header of the field names."""
    header = list(rows[0])
    table = [header, *[["" if r.get(k) is None else str(r.get(k)) for k in header] for r in rows]]
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in table)


def run(args: argparse.Namespace) -> int:
    try:
        from onnxtrain.autodiff import coverage
    except ImportError:
        raise CliError("the gradient-coverage table is not available in this version of onnxtrain "
                       "(onnxtrain.autodiff.coverage is missing)") from None
    entries = coverage.coverage_table()
    if args.markdown and not args.ops and not args.status and hasattr(coverage, "markdown"):
        print(coverage.markdown(entries))
        return 0
    rows = [_row(e) for e in entries]
    wanted = args.ops
    models = [op for op in wanted if op.endswith(".onnx")]
    if models:   # the model's default-domain op types, in the table's spelling
        from onnxtrain.cli.common import read_model

        found = []
        for path in models:
            model = read_model(path, "model")
            found += [n.op_type for n in model.graph.node if n.domain in ("", "ai.onnx")]
            others = sorted({f"{n.domain}.{n.op_type}" for n in model.graph.node if n.domain not in ("", "ai.onnx")})
            if others:
                print(f"{path}: ops outside the default domain: {', '.join(others)}")
        wanted = [op for op in wanted if not op.endswith(".onnx")] + sorted(set(found))
    if wanted:
        known = {str(r.get("op")).lower(): r for r in rows}
        unknown = [op for op in wanted if op.lower() not in known]
        if unknown:
            raise CliError(f"{', '.join(map(repr, unknown))} {'is not a' if len(unknown) == 1 else 'are not'} "
                           "default-domain ONNX op" + ("" if len(unknown) == 1 else "s") + " (a model's path ends "
                           "in .onnx)")
        rows = [known[op.lower()] for op in wanted]
    if args.status:
        statuses = sorted({str(r.get("status")) for r in rows})
        if args.status not in statuses:
            raise CliError(f"unknown status {args.status!r}; statuses: {', '.join(statuses)}")
        rows = [r for r in rows if r.get("status") == args.status]
    print(_render(rows))
    if not wanted:
        counts = collections.Counter(str(r.get("status")) for r in rows)
        print(f"\n{len(rows)} ops: " + ", ".join(f"{n} {status}" for status, n in counts.most_common()))
    return 0
