"""`onnxtrain data INPUT -o OUT.npz`: convert data into the dataset file that train and eval read.

INPUT is a .npz file (arrays x and y), a .npy file of inputs with --labels LABELS.npy, a CSV file (one example
per row; the label column is the last one unless --label-column says otherwise; text labels become class
indices), or a folder with one sub-folder of images per class (needs Pillow).

The output is an .npz file with arrays x (inputs), y (labels) and, for named classes, classes; see
onnxtrain.data.dataset for the format.
"""

from __future__ import annotations

import argparse

import numpy as np

from onnxtrain.cli.common import CliError

__all__ = ["add_parser", "run", "check_options_fit_input"]


def _shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(d) for d in text.replace("x", ",").split(","))  # int() refuses "" (as in "3,x" -> 3,,)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 1,8,8, got {text!r}") from None
    if not shape or any(d <= 0 for d in shape):
        raise argparse.ArgumentTypeError(f"expected positive dimensions such as 1,8,8, got {text!r}")
    return shape


def _size(text: str) -> tuple[int, int]:
    shape = _shape(text)
    if len(shape) != 2:
        raise argparse.ArgumentTypeError(f"expected WIDTHxHEIGHT such as 28x28, got {text!r}")
    return shape[0], shape[1]


def add_parser(sub) -> None:
    p = sub.add_parser("data", help="convert .npy/.npz/CSV/image folders into a dataset file", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("input", metavar="INPUT", help=".npz, .npy, .csv/.tsv/.txt, ONERT's raw float32 .bin (with "
                   "--labels and --shape), or a folder of class sub-folders")
    p.add_argument("-o", "--output", required=True, metavar="OUT.npz", help="the dataset file to write")
    p.add_argument("--labels", metavar="LABELS.npy", help="the labels, for an .npy INPUT (a raw .bin for a .bin "
                   "INPUT: onert's expected outputs; one-hot rows become class indices, or stay one-hot float32 "
                   "targets with --label-dtype float32, for an MSE loss)")
    p.add_argument("--x-key", default="x", help="array name of the inputs in an .npz INPUT (default x)")
    p.add_argument("--y-key", default="y", help="array name of the labels in an .npz INPUT (default y)")
    p.add_argument("--label-column", default="-1", help="CSV label column: a header name or an index (default -1, "
                   "the last)")
    p.add_argument("--delimiter", help="CSV field separator (default: guessed)")
    p.add_argument("--header", choices=("auto", "yes", "no"), default="auto", help="whether the CSV has a header row")
    p.add_argument("--image-size", type=_size, metavar="WxH", help="resize every image to WxH")
    p.add_argument("--color", choices=("auto", "gray", "rgb"), default="auto", help="image channels (default auto)")
    p.add_argument("--shape", type=_shape, metavar="D1,D2,...", help="reshape each example (e.g. 64 -> 1,8,8)")
    p.add_argument("--dtype", default="float32", help="dtype of x (default float32)")
    p.add_argument("--scale", type=float, help="divide x by this (e.g. 255 for 8-bit images)")
    p.add_argument("--label-dtype", choices=("auto", "int64", "float32"), default="auto",
                   help="dtype of y: int64 for class indices, float32 for targets (default: int64 for integer labels)")
    p.add_argument("--num-classes", type=int, help="check that class labels lie in [0, N)")
    p.set_defaults(run=run)


# option -> (its default, the kinds of INPUT it applies to)
_INPUT_OPTIONS = {
    "labels": (None, ("npy", "raw")), "x_key": ("x", ("npz",)), "y_key": ("y", ("npz",)),
    "label_column": ("-1", ("csv",)), "delimiter": (None, ("csv",)), "header": ("auto", ("csv",)),
    "image_size": (None, ("folder",)), "color": ("auto", ("folder",)),
}
_KIND_NAMES = {"npy": "an .npy file", "raw": "a raw .bin file", "npz": "an .npz file", "csv": "a CSV file",
               "folder": "a folder of images"}


def _input_kind(path: str) -> str | None:
    import os

    from onnxtrain.data.convert import RAW_EXTENSIONS

    if os.path.isdir(path):
        return "folder"
    ext = os.path.splitext(path)[1].lower()
    return {".npz": "npz", ".npy": "npy", ".csv": "csv", ".tsv": "csv", ".txt": "csv",
            **dict.fromkeys(RAW_EXTENSIONS, "raw")}.get(ext)


def check_options_fit_input(args: argparse.Namespace) -> None:
    """An option for another kind of INPUT (--labels with a CSV file, --image-size with an .npz...) would be
    ignored without a word; it is an error instead."""
    kind = _input_kind(args.input)
    if kind is None:
        return  # read_any names the unknown file type
    for option, (default, kinds) in _INPUT_OPTIONS.items():
        if getattr(args, option) != default and kind not in kinds:
            flag = "--" + option.replace("_", "-")
            hint = " (its labels are one of its columns: --label-column)" if (kind, option) == ("csv", "labels") else ""
            raise CliError(f"{flag} applies to {' or '.join(_KIND_NAMES[k] for k in kinds)}, but INPUT "
                           f"{args.input} is {_KIND_NAMES[kind]}{hint}")


def run(args: argparse.Namespace) -> int:
    from onnxtrain.data import Dataset, DatasetError, read_any, reshape, save_dataset

    check_options_fit_input(args)
    header = {"auto": None, "yes": True, "no": False}[args.header]
    ds = read_any(args.input, labels=args.labels, x_key=args.x_key, y_key=args.y_key,
                  label_column=args.label_column, delimiter=args.delimiter, header=header,
                  image_size=args.image_size, color=args.color, shape=args.shape,
                  keep_one_hot=args.label_dtype == "float32")
    ds.validate(args.input)
    try:
        dtype = np.dtype(args.dtype)
    except TypeError:
        raise CliError(f"--dtype: unknown dtype {args.dtype!r} (e.g. float32, float16, int64)") from None
    if dtype.kind not in "iuf":
        raise CliError(f"--dtype must be a numeric dtype, got {dtype}")
    if args.scale is not None and args.scale <= 0:
        raise CliError(f"--scale must be positive, got {args.scale}")
    x = ds.x.astype(np.float64) / args.scale if args.scale else ds.x
    if dtype.kind in "iu" and x.dtype.kind == "f" and not np.all(x == np.round(x)):
        raise CliError(f"--dtype {dtype}: the inputs have fractional values")
    y = ds.y
    if args.label_dtype == "int64" or (args.label_dtype == "auto" and y.dtype.kind in "iub"):
        if y.dtype.kind == "f" and not np.all(y == np.round(y)):
            raise DatasetError(f"{args.input}: the labels have fractional values, so they cannot be class indices; "
                               "pass --label-dtype float32 for regression targets")
        y = y.astype(np.int64)
    elif args.label_dtype == "float32" or y.dtype.kind == "f":
        y = y.astype(np.float32)
    ds = Dataset(x.astype(dtype), y, ds.classes)
    if args.shape:
        ds = reshape(ds, args.shape)
    if args.num_classes is not None:
        if y.dtype.kind != "i":
            raise CliError("--num-classes needs class-index labels (integers)")
        bad = np.flatnonzero((y < 0) | (y >= args.num_classes)) if y.ndim == 1 else np.array([])
        if bad.size or (y.ndim > 1 and (y.min() < 0 or y.max() >= args.num_classes)):
            example = int(bad[0]) if bad.size else None
            raise DatasetError(f"{args.input}: label {int(y[example]) if example is not None else int(y.max())}"
                               + (f" (example {example})" if example is not None else "")
                               + f" is out of range for --num-classes {args.num_classes}")
    save_dataset(ds, args.output)
    print(f"wrote {args.output}: {ds.describe()}")
    return 0
