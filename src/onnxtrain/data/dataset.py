"""The dataset file that ``onnxtrain train`` and ``onnxtrain eval`` read: one NumPy ``.npz`` file.

Format (written by ``np.savez``; read with ``allow_pickle=False``, so a dataset can never run code):

=========  ==============================================================================================
``x``      the inputs, shape ``[N, *sample_shape]``, a numeric dtype (float32 for most models), all finite
``y``      the labels, shape ``[N, *label_shape]``: integer class indices (classification) or float targets
``classes`` optional, a string array ``[K]``: ``classes[i]`` names class ``i`` (written for image folders
           and CSV files with text labels)
=========  ==============================================================================================

``onnxtrain data`` converts .npy, .npz, CSV files and folders of images into this format; any program can
write it with ``np.savez("train.npz", x=x, y=y)``. A file without ``x`` and ``y`` whose arrays are named after
the model's data input and label input (``np.savez("train.npz", input=x, labels=y)``) is read as well, when the
caller gives those names (``onnxtrain train`` and ``eval`` do). A model with several inputs (a transformer's
``input_ids``, ``attention_mask``, ``token_type_ids``) reads one array per input, by its name, and the labels as
``y`` or by the label input's name: ``np.savez("train.npz", input_ids=ids, attention_mask=mask, y=labels)``.
"""

from __future__ import annotations

import io
import os
import zipfile
from dataclasses import dataclass

import numpy as np

from onnxtrain.errors import InputError
from onnxtrain.ir.files import atomic_write_bytes
from onnxtrain.runtime.loop import Inputs

__all__ = ["Dataset", "DatasetError", "load_dataset", "save_dataset"]


class DatasetError(InputError):
    """A dataset file is missing, unreadable or inconsistent, or does not fit the model."""


@dataclass
class Dataset:
    """Inputs ``x``, labels ``y`` (same first dimension) and optional class names."""

    x: np.ndarray | Inputs   # Inputs: a model with several inputs, one array per input name
    y: np.ndarray
    classes: list[str] | None = None

    def __len__(self) -> int:
        return len(self.x)

    def validate(self, where: str = "the dataset") -> Dataset:
        """Raise DatasetError for any inconsistency; return self."""
        x, y = self.x, self.y
        arrays = list(x.arrays.items()) if isinstance(x, Inputs) else [("x", x)]
        for name, a in arrays[1:]:
            if isinstance(a, np.ndarray) and a.ndim and len(a) != len(arrays[0][1]):
                raise DatasetError(f"{where}: {name!r} has {len(a)} examples but {arrays[0][0]!r} has "
                                   f"{len(arrays[0][1])}; they must match")
        for name, a in (*arrays, ("y", y)):
            if not isinstance(a, np.ndarray):
                raise DatasetError(f"{where}: {name} must be a numpy array, got {type(a).__name__}")
            if a.dtype.kind not in "biuf":
                raise DatasetError(f"{where}: {name} has dtype {a.dtype}; expected numbers (float or int)")
            if a.ndim == 0:
                raise DatasetError(f"{where}: {name} is a scalar; expected one row per example")
        if len(x) != len(y):
            raise DatasetError(f"{where}: x has {len(x)} examples but y has {len(y)}; they must match")
        if len(x) == 0:
            raise DatasetError(f"{where} holds no examples")
        for name, a in (*arrays, ("y", y)):
            if a.dtype.kind == "f" and not np.all(np.isfinite(a)):
                bad = int(np.argwhere(~np.isfinite(a.reshape(len(a), -1)))[0][0])
                count = int(np.sum(~np.isfinite(a)))
                raise DatasetError(f"{where}: {name} holds {count} NaN or infinite values (the first in example {bad})")
        if self.classes is not None:
            if y.dtype.kind not in "iu":
                raise DatasetError(f"{where}: class names are given but the labels y are {y.dtype}, not integers")
            low, high = int(y.min()), int(y.max())
            if low < 0 or high >= len(self.classes):
                raise DatasetError(f"{where}: labels range over [{low}, {high}] but there are {len(self.classes)} "
                                   "class names")
        return self

    def describe(self) -> str:
        labels = f"y {self.y.dtype}{list(self.y.shape)}"
        if self.y.dtype.kind in "iu":
            labels += f", {len(np.unique(self.y))} classes"
            if self.classes:
                shown = ", ".join(self.classes[:5]) + (", ..." if len(self.classes) > 5 else "")
                labels += f" ({shown})"
        inputs = (", ".join(f"{n} {a.dtype}{list(a.shape)}" for n, a in self.x.arrays.items())
                  if isinstance(self.x, Inputs) else f"x {self.x.dtype}{list(self.x.shape)}")
        return f"{len(self)} examples: {inputs}, {labels}"


def save_dataset(dataset: Dataset, path: str | os.PathLike) -> None:
    """Validate ``dataset`` and write it atomically to ``path`` (.npz; several inputs by their names)."""
    dataset.validate(f"dataset for {os.fspath(path)}")
    x = dataset.x.arrays if isinstance(dataset.x, Inputs) else {"x": dataset.x}
    arrays = {**x, "y": dataset.y}
    if dataset.classes is not None:
        arrays["classes"] = np.asarray(dataset.classes, dtype=np.str_)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    folder = os.path.dirname(os.path.abspath(os.fspath(path)))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"cannot write {os.fspath(path)}: the folder {folder} does not exist")
    atomic_write_bytes(path, buffer.getvalue())


def load_dataset(path: str | os.PathLike, input_names: tuple[str | tuple[str, ...], str] | None = None) -> Dataset:
    """Read and validate a dataset file (see the module docstring); every defect is a DatasetError.
    ``input_names``: the model's (data input, label input) names, read in place of ``x`` and ``y`` when the file
    has those arrays and not ``x`` and ``y``; with several data inputs (a tuple), the file has one array per
    input, by its name, and the labels as ``y`` or by the label input's name."""
    path = os.fspath(path)
    if input_names is not None and not isinstance(input_names[0], str):
        inputs, label = input_names
        if len(inputs) > 1:
            return _read(path, lambda npz, keys: _named_arrays(path, npz, keys, tuple(inputs), label))
        input_names = (inputs[0], label)
    return _read(path, lambda npz, keys: _xy_arrays(path, npz, keys, input_names))


def _read(path: str, arrays) -> Dataset:
    """The dataset in the .npz file ``path``, its inputs and labels picked by ``arrays(npz, keys)``; every defect
    of the file is a DatasetError."""
    if not os.path.exists(path):
        raise DatasetError(f"data file not found: {path}")
    if os.path.isdir(path):
        raise DatasetError(f"{path} is a folder; expected a .npz dataset file (convert the folder with "
                           f"`onnxtrain data {path} -o data.npz`)")
    if not zipfile.is_zipfile(path):
        hint = "" if path.endswith(".npz") else f" (convert it with `onnxtrain data {path} -o data.npz`)"
        raise DatasetError(f"{path} is not a .npz dataset file{hint}")
    try:
        with np.load(path, allow_pickle=False) as npz:
            keys = list(npz.files)
            x, y = arrays(npz, keys)
            classes = [str(c) for c in npz["classes"]] if "classes" in keys else None
    except DatasetError:
        raise
    except ValueError as exc:
        if "pickle" in str(exc):
            raise DatasetError(f"{path} holds pickled Python objects, which onnxtrain does not load; store "
                               "numeric arrays only") from None
        raise DatasetError(f"{path} is not a readable .npz file: {exc}") from None
    except (OSError, zipfile.BadZipFile, EOFError) as exc:
        raise DatasetError(f"{path} is corrupt or truncated: {exc}") from None
    return Dataset(x, y, classes).validate(path)


def _xy_arrays(path: str, npz, keys: list[str], input_names: tuple[str, str] | None):
    """``x`` and ``y``, or the arrays named after the model's data and label inputs."""
    x_name, y_name = "x", "y"
    if input_names and "x" not in keys and input_names[0] in keys:
        # the input by its name, the labels as 'y' or by theirs (as for a model with several inputs)
        x_name, y_name = input_names[0], "y" if "y" in keys else input_names[1]
    missing = [k for k in (x_name, y_name) if k not in keys]
    if missing:
        x_key, y_key = _guess_keys(keys)
        named = (f", or the input named after the model's ({input_names[0]!r}) and the labels as 'y' or "
                 f"{input_names[1]!r}" if input_names else "")
        raise DatasetError(f"{path} has no array {missing[0]!r} (its arrays: {keys}); an onnxtrain dataset "
                           f"holds arrays 'x' (inputs) and 'y' (labels){named}: convert it with "
                           f"`onnxtrain data {path} -o {_converted_name(path)} --x-key {x_key} "
                           f"--y-key {y_key}`")
    return npz[x_name], npz[y_name]


def _named_arrays(path: str, npz, keys: list[str], inputs: tuple[str, ...], label: str):
    """A model with several inputs: one array per input name, the labels as ``y`` or ``label``."""
    y_name = "y" if "y" in keys else label
    missing = [k for k in (*inputs, y_name) if k not in keys]
    if missing:
        example = ", ".join(f"{n}=..." for n in (*inputs, label))
        raise DatasetError(f"{path} has no array {missing[0]!r} (its arrays: {keys}); the model takes the "
                           f"inputs {list(inputs)} and the labels {label!r}, so its dataset holds one array "
                           f"per input, named after it, and the labels as 'y' or {label!r}: "
                           f"np.savez({os.path.basename(path)!r}, {example})")
    return Inputs({n: npz[n] for n in inputs}), npz[y_name]


_LABEL_NAMES = ("y", "label", "labels", "target", "targets", "class_ids", "classes_ids")


def _guess_keys(keys: list[str]) -> tuple[str, str]:
    """The arrays of an .npz file that most likely hold the inputs and the labels (for an error message)."""
    labels = [k for k in keys if k.lower() in _LABEL_NAMES]
    y_key = labels[0] if labels else "LABELS"
    inputs = [k for k in keys if k != y_key and k != "classes"]
    x_key = inputs[0] if len(inputs) == 1 else ("x" if "x" in keys else "INPUTS")
    return x_key, y_key


def _converted_name(path: str) -> str:
    stem, _ = os.path.splitext(path)
    return f"{stem}_xy.npz"
