"""What the commands share: finding artifacts and checkpoints, the stored training options, number formatting."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import onnx

from onnxtrain import conventions as names
from onnxtrain.errors import OnnxTrainError

__all__ = ["CliError", "Artifacts", "TRAIN_CONFIG_KEY", "stored_loss", "read_model", "quiet_onnxruntime",
           "human_bytes", "human_count", "shape_text"]

TRAIN_CONFIG_KEY = "onnxtrain.train_config"  # training-model metadata_props: JSON of stored train options
RUN_DIR = "run"                               # inside the artifact folder: last.ckpt, best.ckpt, metrics.jsonl, ...


class CliError(OnnxTrainError):
    """A user error found by the command line itself (bad option combination, nothing to do, ...)."""


def read_model(path: str, what: str) -> onnx.ModelProto:
    if not os.path.exists(path):
        raise FileNotFoundError(f"{what} not found: {path}")
    try:
        model = onnx.load(path)
    except Exception as exc:
        raise CliError(f"{path} is not a valid ONNX model ({type(exc).__name__}: {exc})") from None
    if not model.opset_import and not model.graph.node and not model.ir_version:  # protobuf parses b"" too
        raise CliError(f"{path} is not an ONNX model: " + ("the file is empty" if os.path.getsize(path) == 0 else
                                                          "it holds no graph, opset or IR version"))
    return model


def quiet_onnxruntime() -> None:
    """Keep onnxruntime's own warnings (e.g. about unused initializers) off the terminal."""
    import onnxruntime as ort

    ort.set_default_logger_severity(3)


@dataclass
class Artifacts:
    """The files written by `onnxtrain generate` (or generate_artifacts) in one folder."""

    directory: str
    prefix: str
    training: str
    eval: str
    optimizer: str | None
    checkpoint: str

    @classmethod
    def locate(cls, directory: str, prefix: str = "") -> Artifacts:
        if not os.path.exists(directory):
            raise FileNotFoundError(f"artifact folder not found: {directory}")
        if not os.path.isdir(directory):
            raise CliError(f"{directory} is a file; expected the folder written by `onnxtrain generate MODEL -o DIR`")
        path = lambda kind: os.path.join(directory, names.artifact_file(kind, prefix))  # noqa: E731
        parent = os.path.dirname(os.path.abspath(directory))
        if os.path.basename(os.path.abspath(directory)) == RUN_DIR and os.path.isfile(
                os.path.join(parent, names.artifact_file("training", prefix))):
            raise CliError(f"{directory} is the run folder `onnxtrain train` writes inside the artifacts; give the "
                           f"artifact folder itself ({parent}), or a checkpoint in it with --checkpoint")
        for kind in ("training", "eval", "checkpoint"):
            if not os.path.isfile(path(kind)):
                raise CliError(f"{directory} is not an onnxtrain artifact folder: {names.artifact_file(kind, prefix)} "
                               f"is missing (write one with `onnxtrain generate MODEL.onnx -o {directory}`)")
        optimizer = path("optimizer")
        return cls(directory, prefix, path("training"), path("eval"),
                   optimizer if os.path.isfile(optimizer) else None, path("checkpoint"))

    @property
    def run_dir(self) -> str:
        return os.path.join(self.directory, self.prefix + RUN_DIR)

    def resolve_checkpoint(self, choice: str | None) -> str:
        """`initial` (the generated checkpoint), `last` / `best` (of `onnxtrain train`), or a path.
        None means the last training checkpoint if there is one, else the initial one."""
        last = os.path.join(self.run_dir, "last.ckpt")
        if choice is None:
            return last if os.path.isfile(last) else self.checkpoint
        if choice == "initial":
            return self.checkpoint
        if choice in ("last", "best"):
            path = os.path.join(self.run_dir, f"{choice}.ckpt")
            if not os.path.isfile(path):
                raise CliError(f"there is no {choice} checkpoint yet ({path}); run `onnxtrain train "
                               f"{self.directory} --data ...` first, or pass --checkpoint initial")
            return path
        if not os.path.exists(choice):
            raise FileNotFoundError(f"checkpoint not found: {choice}")
        return choice


def stored_train_config(model: onnx.ModelProto) -> dict:
    for prop in model.metadata_props:
        if prop.key == TRAIN_CONFIG_KEY:
            try:
                config = json.loads(prop.value)
            except json.JSONDecodeError as exc:
                raise CliError(f"the stored training options ({TRAIN_CONFIG_KEY}) are not valid JSON: {exc}") from None
            if not isinstance(config, dict):
                raise CliError(f"the stored training options ({TRAIN_CONFIG_KEY}) must be a JSON object")
            return config
    return {}


def stored_loss(model: onnx.ModelProto) -> str | None:
    """The built-in loss the artifacts were generated with (a LossType name such as "BCEWithLogitsLoss"), or None
    (a custom loss block, the model's own loss, artifacts of older versions)."""
    try:
        return names.TrainingMeta.from_model(model).loss_type or None
    except OnnxTrainError:
        return None


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def human_count(n: int) -> str:
    return f"{n:,}"


def shape_text(shape) -> str:
    if shape is None:
        return "[?]"
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"
