"""Read .npy, .npz, CSV files and folders of images into a :class:`~onnxtrain.data.Dataset`.

Each reader reports a bad file with what is wrong and where (file, line, column, array), as a DatasetError.
"""

from __future__ import annotations

import csv
import os
import warnings
import zipfile
from collections.abc import Sequence

import numpy as np

from onnxtrain.data.dataset import Dataset, DatasetError

__all__ = ["read_any", "read_npz", "read_npy", "read_csv", "read_image_folder", "reshape", "IMAGE_EXTENSIONS"]

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm")


def _load_npy(path: str) -> np.ndarray:
    if not os.path.exists(path):
        raise DatasetError(f"file not found: {path}")
    with open(path, "rb") as f:
        if f.read(6) != b"\x93NUMPY":
            raise DatasetError(f"{path} is not a .npy file (no NumPy header)")
    try:
        return np.load(path, allow_pickle=False)
    except ValueError as exc:
        if "pickle" in str(exc):
            raise DatasetError(f"{path} holds pickled Python objects, which onnxtrain does not load") from None
        raise DatasetError(f"{path} is not a valid .npy file: {exc}") from None
    except (OSError, EOFError) as exc:
        raise DatasetError(f"{path} is not a valid .npy file: {exc}") from None


def read_npz(path: str, x_key: str = "x", y_key: str = "y") -> Dataset:
    """Arrays ``x_key`` and ``y_key`` of an .npz file (and ``classes`` if present)."""
    if not zipfile.is_zipfile(path):
        raise DatasetError(f"{path} is not a .npz file (not a zip archive)")
    try:
        with np.load(path, allow_pickle=False) as npz:
            keys = list(npz.files)
            for key, what in ((x_key, "inputs"), (y_key, "labels")):
                if key not in keys:
                    raise DatasetError(f"{path} has no array {key!r} for the {what} (its arrays: {keys}); name them "
                                       "with --x-key / --y-key")
            classes = [str(c) for c in npz["classes"]] if "classes" in keys else None
            return Dataset(npz[x_key], npz[y_key], classes)
    except DatasetError:
        raise
    except ValueError as exc:
        if "pickle" in str(exc):
            raise DatasetError(f"{path} holds pickled Python objects, which onnxtrain does not load") from None
        raise DatasetError(f"{path} is not a valid .npz file: {exc}") from None
    except Exception as exc:  # zipfile.BadZipFile, OSError, EOFError: a damaged archive
        raise DatasetError(f"{path} is not a valid .npz file: {exc}") from None


def read_npy(path: str, labels: str | None) -> Dataset:
    """Inputs from one .npy file and labels from another."""
    if labels is None:
        raise DatasetError(f"{path} holds the inputs only; give the labels with --labels LABELS.npy")
    x, y = _load_npy(path), _load_npy(labels)
    if x.ndim and y.ndim and len(x) != len(y):
        raise DatasetError(f"{path} holds {len(x)} examples but the labels {labels} hold {len(y)}; they need one "
                           "label (row) per example")
    return Dataset(x, y)


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def read_csv(path: str, label_column: str | int = -1, delimiter: str | None = None,
             header: bool | None = None) -> Dataset:
    """One example per row: numeric feature columns and one label column (a number or a class name).

    Args:
        label_column: the label column's name (from the header) or index (negative counts from the end).
        delimiter: the field separator; None guesses among , ; tab and space.
        header: whether the first row names the columns; None guesses (a first row that is not all numbers).
    """
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            text = f.read()
    except UnicodeDecodeError as exc:
        raise DatasetError(f"{path} is not a UTF-8 text file ({exc.reason} at byte {exc.start})") from None
    lines = text.splitlines()
    if not any(line.strip() for line in lines):
        raise DatasetError(f"{path} is empty")
    if delimiter is None:
        first = next(line for line in lines if line.strip())
        delimiter = next((d for d in (",", ";", "\t") if d in first), " " if " " in first.strip() else ",")
    rows = [(i + 1, r) for i, r in enumerate(csv.reader(lines, delimiter=delimiter, skipinitialspace=True))
            if any(c.strip() for c in r)]
    if header is None:  # a header has a word where the next row has a number (or is all words)
        first = rows[0][1]
        second = rows[1][1] if len(rows) > 1 else first
        header = (all(_number(c) is None for c in first)
                  or any(_number(a) is None and _number(b) is not None for a, b in zip(first, second)))
    names = [c.strip() for c in rows[0][1]] if header else [str(i) for i in range(len(rows[0][1]))]
    body = rows[1:] if header else rows
    if not body:
        raise DatasetError(f"{path} has a header but no data rows")
    width = len(names)
    if width < 2:
        raise DatasetError(f"{path} has a single column; it needs feature columns and a label column")
    if isinstance(label_column, str) and not label_column.lstrip("-").isdigit():
        if label_column not in names:
            raise DatasetError(f"{path} has no column {label_column!r} (columns: {names[:10]}"
                               f"{'...' if len(names) > 10 else ''})")
        label = names.index(label_column)
    else:
        label = int(label_column)
        if not -width <= label < width:
            raise DatasetError(f"{path}: label column {label} is out of range: rows have {width} columns")
        label %= width
    features, labels = [], []
    for line, row in body:
        if len(row) != width:
            raise DatasetError(f"{path}, line {line}: {len(row)} fields, but the {'header' if header else 'first row'}"
                               f" has {width}")
        values = []
        for col, cell in enumerate(row):
            if col == label:
                continue
            v = _number(cell)
            if v is None:
                raise DatasetError(f"{path}, line {line}, column {names[col]!r}: {cell.strip()!r} is not a number")
            values.append(v)
        features.append(values)
        labels.append(row[label].strip())
    x = np.asarray(features, dtype=np.float32)
    numeric = [_number(v) for v in labels]
    classes = None
    if all(v is not None for v in numeric):
        y = np.asarray(numeric, dtype=np.float64)
        # written as integers ("3", not "3.0" or "0.25"): class indices
        y = y.astype(np.int64) if all(v.lstrip("+-").isdigit() for v in labels) else y.astype(np.float32)
    else:  # class names: indices in sorted-name order
        classes = sorted(set(labels))
        index = {c: i for i, c in enumerate(classes)}
        y = np.asarray([index[v] for v in labels], dtype=np.int64)
    return Dataset(x, y, classes)


IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".pgm", ".pbm", ".bmp", ".gif", ".tif", ".tiff", ".webp")


def read_image_folder(path: str, size: tuple[int, int] | None = None, color: str = "auto") -> Dataset:
    """A folder with one sub-folder of images per class; sub-folders in sorted order are classes 0, 1, ...

    Images become float32 ``[N, C, H, W]`` in [0, 1] (C = 1 for grayscale, 3 for RGB).

    Args:
        size: (width, height) to resize every image to; None requires all images to have one size.
        color: "gray", "rgb", or "auto" (gray if every image is grayscale).
    """
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:
        raise DatasetError("reading a folder of images needs Pillow, which is not installed: "
                           "pip install pillow") from None
    if color not in ("auto", "gray", "rgb"):
        raise DatasetError(f"unknown color mode {color!r}; expected auto, gray or rgb")
    classes = sorted(d for d in os.listdir(path) if os.path.isdir(os.path.join(path, d)) and not d.startswith("."))
    if not classes:
        raise DatasetError(f"{path} has no sub-folders; put the images of each class in a sub-folder named after it")
    images, labels, files_read, skipped = [], [], [], []
    for label, name in enumerate(classes):
        folder = os.path.join(path, name)
        files = sorted(f for f in os.listdir(folder) if not f.startswith(".")
                       and os.path.isfile(os.path.join(folder, f)))
        # as torchvision's ImageFolder: files without an image extension (notes.txt, Thumbs.db) are not examples
        skipped += [os.path.join(folder, f) for f in files if not f.lower().endswith(IMAGE_EXTENSIONS)]
        files = [f for f in files if f.lower().endswith(IMAGE_EXTENSIONS)]
        if not files:
            raise DatasetError(f"class folder {folder} holds no images ({', '.join(IMAGE_EXTENSIONS)})")
        for file in files:
            file_path = os.path.join(folder, file)
            try:
                with Image.open(file_path) as im:
                    im.load()
                    images.append(im.copy())
                    files_read.append(file_path)
            except (UnidentifiedImageError, OSError, SyntaxError) as exc:
                raise DatasetError(f"cannot read {file_path} as an image: {exc}") from None
            labels.append(label)
    if skipped:
        warnings.warn(f"{len(skipped)} files without an image extension are not examples and were skipped (e.g. "
                      f"{skipped[0]})", stacklevel=2)
    gray = color == "gray" or (color == "auto" and all(im.mode in ("1", "L", "I", "I;16", "F") for im in images))
    mode = "L" if gray else "RGB"
    arrays = []
    first_size = images[0].size
    for im, file_path in zip(images, files_read):
        if size is not None:
            im = im.resize(size)
        elif im.size != first_size:
            raise DatasetError(f"images differ in size: {files_read[0]} is {first_size[0]}x{first_size[1]} but "
                               f"{file_path} is {im.size[0]}x{im.size[1]}; pass --image-size WxH to resize them all")
        a = np.asarray(im.convert(mode), dtype=np.float32) / 255.0
        arrays.append(a[None] if gray else a.transpose(2, 0, 1))
    return Dataset(np.stack(arrays), np.asarray(labels, dtype=np.int64), classes)


RAW_EXTENSIONS = (".bin", ".raw", ".dat")


def _raw_float32(path: str) -> np.ndarray:
    """The little-endian float32 values of a raw file; a DatasetError if its size is not a whole number of them."""
    if not os.path.isfile(path):
        raise DatasetError(f"file not found: {path}")
    size = os.path.getsize(path)
    if size % 4:
        raise DatasetError(f"{path} is {size} bytes, not a whole number of float32 values (4 bytes each); a raw "
                           "data file holds float32 values only")
    return np.fromfile(path, dtype="<f4")


def read_raw(path: str, labels: str | None, shape: Sequence[int] | None, keep_one_hot: bool = False) -> Dataset:
    """ONERT's raw data files (``onert_train --load_input:raw``, as ``generate_datafile`` writes them): the
    examples' float32 values one after the other, ``shape`` per example, and the expected outputs likewise. One-hot
    expected outputs (onert's cross-entropy takes them) become class indices, unless ``keep_one_hot`` (targets of
    a mean squared error, as ONE's MNIST how-to trains)."""
    if labels is None:
        raise DatasetError(f"{path} holds the inputs only; give the expected outputs with --labels EXPECTED.bin")
    if not shape:
        raise DatasetError(f"{path} is a raw file of float32 values with no shape: give each example's with "
                           "--shape (e.g. --shape 1,28,28)")
    per_example = int(np.prod(shape))
    x = _raw_float32(path)
    if x.size == 0 or x.size % per_example:
        raise DatasetError(f"{path} holds {x.size} float32 values, not a whole number of examples of shape "
                           f"{list(shape)} ({per_example} values each)")
    x = x.reshape(-1, *shape)
    y = np.load(labels, allow_pickle=False).ravel() if labels.lower().endswith(".npy") else _raw_float32(labels)
    if y.size == 0 or y.size % len(x):
        raise DatasetError(f"{labels} holds {y.size} float32 values, not the same number for each of the "
                           f"{len(x)} examples of {path}")
    y = y.reshape(len(x), -1)
    if y.shape[1] == 1:
        y = y[:, 0]
    elif not keep_one_hot and np.all((y == 0) | (y == 1)) and np.all(y.sum(axis=1) == 1):
        y = np.argmax(y, axis=1).astype(np.int64)  # one-hot -> class indices
    return Dataset(x, y)


def read_any(path: str, *, labels: str | None = None, x_key: str = "x", y_key: str = "y",
             label_column: str | int = -1, delimiter: str | None = None, header: bool | None = None,
             image_size: tuple[int, int] | None = None, color: str = "auto",
             shape: Sequence[int] | None = None, keep_one_hot: bool = False) -> Dataset:
    """Pick the reader from ``path``: a folder of images, .npz, .npy, CSV (.csv, .tsv, .txt), or ONERT's raw
    float32 files (.bin, .raw, .dat; ``shape`` per example; ``keep_one_hot``: see :func:`read_raw`)."""
    if not os.path.exists(path):
        raise DatasetError(f"file not found: {path}")
    if os.path.isdir(path):
        return read_image_folder(path, image_size, color)
    ext = os.path.splitext(path)[1].lower()
    if ext == ".npz":
        return read_npz(path, x_key, y_key)
    if ext == ".npy":
        return read_npy(path, labels)
    if ext in (".csv", ".tsv", ".txt"):
        return read_csv(path, label_column, "\t" if ext == ".tsv" and delimiter is None else delimiter, header)
    if ext in RAW_EXTENSIONS:
        return read_raw(path, labels, shape, keep_one_hot)
    raise DatasetError(f"{path}: unknown file type {ext or '(no extension)'!r}; onnxtrain data reads .npy "
                       "(with --labels), .npz, .csv/.tsv/.txt, ONERT's raw float32 .bin files (with --labels and "
                       "--shape), or a folder of images with one sub-folder per class")


def reshape(dataset: Dataset, shape: Sequence[int]) -> Dataset:
    """Give every example of ``x`` the shape ``shape`` (e.g. 64 features -> [1, 8, 8])."""
    shape = tuple(int(d) for d in shape)
    per_example = int(np.prod(dataset.x.shape[1:]))
    if int(np.prod(shape)) != per_example:
        raise DatasetError(f"cannot reshape examples of shape {list(dataset.x.shape[1:])} ({per_example} values) "
                           f"to {list(shape)} ({int(np.prod(shape))} values)")
    return Dataset(dataset.x.reshape(len(dataset.x), *shape), dataset.y, dataset.classes)
