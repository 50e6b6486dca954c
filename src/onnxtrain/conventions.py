"""The contract between the artifacts and the runtime: value names, metadata, file names.

Everything that crosses from the offline phase (``generate_artifacts``) to the training phase (the runtime,
the command line, the data checks, the federated client) is spelled here once. The gradient-buffer and
reset-flag names are those of onnxruntime-training, so tools that look for them still find them.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import onnx

from onnxtrain.errors import ArtifactError

__all__ = [
    "LAZY_RESET_GRAD", "grad_buffer_name", "grad_output_name", "buffer_output_name", "TRAINING_META",
    "OPTIMIZER_META", "LORA_META", "LEARNING_RATE", "STEP", "PARAMS", "GRADIENTS", "GRADIENTS_FINITE", "output_name",
    "ARTIFACT_FILES", "OPTIONAL_ARTIFACT_FILES", "artifact_file", "TrainingMeta", "OptimizerMeta",
    "TRAIN_STEP_META", "TrainStepMeta", "CLASS_LOSSES",
]

LAZY_RESET_GRAD = "lazy_reset_grad"
LEARNING_RATE = "learning_rate"
STEP = "step"
PARAMS = "params"
GRADIENTS = "gradients"
GRADIENTS_FINITE = "gradients_finite"  # optimizer output: False when a gradient is NaN or infinite

# The loss ops whose second input holds class labels: the training and eval graphs declare the class count of the
# scores such a loss reads (a value_info), and the runtimes check the labels against it before a run.
CLASS_LOSSES = frozenset({"SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss"})

# metadata_props keys holding a JSON description of each artifact's interface
TRAINING_META = "onnxtrain.training"
OPTIMIZER_META = "onnxtrain.optimizer"
LORA_META = "onnxtrain.lora"  # training and eval models with LoRA adapters (onnxtrain.lora.LoRAMeta)
TRAIN_STEP_META = "onnxtrain.train_step"  # the train-step model (training + optimizer graph, for js/)

# artifact kind -> file name (generate_artifacts prepends its ``prefix``)
ARTIFACT_FILES: dict[str, str] = {
    "training": "training_model.onnx",
    "eval": "eval_model.onnx",
    "optimizer": "optimizer_model.onnx",
    "checkpoint": "checkpoint",
}
# Written only on request: shapes without values (generate_artifacts(nominal_checkpoint=True)); the training
# graph fused with the optimizer graph, one run per step for runtimes that cannot fuse them (js/;
# onnxtrain.artifacts.fused.write_train_step_model).
OPTIONAL_ARTIFACT_FILES: dict[str, str] = {"nominal_checkpoint": "nominal_checkpoint",
                                           "train_step": "train_step_model.onnx"}


def artifact_file(kind: str, prefix: str = "") -> str:
    """The file name of one artifact: ``artifact_file("training", "mnist_")`` -> ``"mnist_training_model.onnx"``."""
    files = {**ARTIFACT_FILES, **OPTIONAL_ARTIFACT_FILES}
    if kind not in files:
        raise KeyError(f"no artifact kind {kind!r}; kinds: {', '.join(files)}")
    return prefix + files[kind]


def grad_buffer_name(param: str) -> str:
    return f"{param}_grad.accumulation.buffer"


def grad_output_name(param: str) -> str:
    return f"{param}_grad.accumulation.out"


def buffer_output_name(buffer: str) -> str:
    """The training graph's output carrying the updated value of a state buffer (BatchNorm running stats)."""
    return f"{buffer}.updated"


def output_name(name: str) -> str:
    """Optimizer graph output for input ``name`` (``params`` -> ``params.out``)."""
    return f"{name}.out"


def _prop(model: onnx.ModelProto, key: str) -> str | None:
    return next((p.value for p in model.metadata_props if p.key == key), None)


def _strings(value: object) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise TypeError("expected a list of strings")
    return list(value)


def _pair(value: object) -> tuple[str, str]:
    fresh, accumulated = _strings(value)
    return fresh, accumulated


def _size_limit(value: object) -> dict[str, str | int]:
    if not isinstance(value, dict):
        raise TypeError("expected an object")
    limit = {"input": value["input"], "axis": value["axis"], "limit": value["limit"], "table": value["table"]}
    if not (isinstance(limit["input"], str) and isinstance(limit["table"], str)
            and all(isinstance(limit[k], int) and not isinstance(limit[k], bool) for k in ("axis", "limit"))):
        raise TypeError("expected input and table names and integer axis and limit")
    return limit


@dataclass(frozen=True)
class TrainingMeta:
    """The interface of the training and eval models: which graph inputs the user feeds, which are
    parameters, what the outputs are. Stored as JSON under ``TRAINING_META`` in both models.

    Attributes:
        user_inputs: the model's data inputs, fed first.
        labels: the loss's label inputs, fed after ``user_inputs``.
        loss: the name of the loss value (the first output).
        additional_outputs: values returned after the loss.
        trainable: trainable parameters, in flat-buffer order.
        frozen: parameters fed to the graphs but never updated.
        buffers: non-parameter state the training graph updates (BatchNorm running statistics).
        model_outputs: the forward model's outputs (what an exported inference model returns by default).
        accumulation: per trainable parameter, the two values its gradient output selects between:
            ``(fresh, accumulated)``, the output being ``lazy_reset_grad ? fresh : accumulated``. The runtime
            specialises the graph for each value of the flag from this (empty in artifacts of older versions).
        loss_reduction: how the loss combines a batch's examples: "mean" or "sum" (a built-in loss's reduction),
            "" when unknown (a custom loss block, the model's own loss, artifacts of older versions).
        loss_type: the built-in loss (its ``LossType`` name, e.g. "BCEWithLogitsLoss"), "" when the loss is a
            custom block or the model's own, or in artifacts of older versions (tools pick default metrics by it).
        size_limits: the user inputs' dimensions that index a table of fixed length (a transformer's sequence
            length and its position table), each ``{"input", "axis", "limit", "table"}``: what a failed run's
            error names when an input was longer (runtime/size_limits.py; the JavaScript runtime reads them from
            here). Empty in artifacts of older versions.
    """

    user_inputs: list[str]
    labels: list[str]
    loss: str
    additional_outputs: list[str]
    trainable: list[str]
    frozen: list[str]
    buffers: list[str]
    model_outputs: list[str]
    accumulation: dict[str, tuple[str, str]] = field(default_factory=dict)
    loss_reduction: str = ""
    loss_type: str = ""
    size_limits: list[dict[str, str | int]] = field(default_factory=list)

    def to_props(self) -> dict[str, str]:
        """The ``metadata_props`` entries that carry this description."""
        return {TRAINING_META: json.dumps(asdict(self))}

    @classmethod
    def from_model(cls, model: onnx.ModelProto, what: str = "training model") -> TrainingMeta:
        """Read the description from a training or eval model; ArtifactError if absent or damaged."""
        text = _prop(model, TRAINING_META)
        if text is None:
            raise ArtifactError(f"the {what} was not generated by onnxtrain.artifacts.generate_artifacts "
                                f"(no {TRAINING_META!r} metadata)")
        try:
            raw = json.loads(text)
            accumulation = {str(p): _pair(v) for p, v in raw.get("accumulation", {}).items()}
            return cls(loss=str(raw.get("loss", "")), accumulation=accumulation,
                       loss_reduction=str(raw.get("loss_reduction", "")), loss_type=str(raw.get("loss_type", "")),
                       size_limits=[_size_limit(v) for v in raw.get("size_limits", [])],
                       **{k: _strings(raw[k]) for k in ("user_inputs", "labels", "additional_outputs", "trainable",
                                                         "frozen", "buffers", "model_outputs")})
        except (ValueError, KeyError, TypeError, AttributeError):
            raise ArtifactError(f"the {what} has damaged {TRAINING_META!r} metadata") from None


@dataclass(frozen=True)
class OptimizerMeta:
    """The interface of the optimizer model: the optimizer and its configuration, the names of its state
    vectors, and the layout of the flat parameter vector it updates. Stored as JSON under ``OPTIMIZER_META``.

    Attributes:
        type: the optimizer block's class name (``"AdamW"``).
        config: its hyper-parameters.
        states: one flat vector per name (``"exp_avg"``), each laid out like the parameters.
        layout: (name, shape) of each trainable parameter, in flat-buffer order.
        dtype: the element type of the flat vectors.
    """

    type: str
    config: dict = field(default_factory=dict)
    states: list[str] = field(default_factory=list)
    layout: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)
    dtype: str = "float32"

    def to_props(self) -> dict[str, str]:
        """The ``metadata_props`` entries that carry this description."""
        params = [{"name": n, "shape": list(s)} for n, s in self.layout]
        body = {"type": self.type, "config": self.config, "states": self.states, "params": params,
                "dtype": self.dtype}
        return {OPTIMIZER_META: json.dumps(body, default=str)}

    @classmethod
    def from_model(cls, model: onnx.ModelProto, what: str = "optimizer model") -> OptimizerMeta:
        """Read the description from an optimizer model; ArtifactError if absent or damaged."""
        text = _prop(model, OPTIMIZER_META)
        if text is None:
            raise ArtifactError(f"the {what} was not generated by onnxtrain (no optimizer metadata)")
        try:
            raw = json.loads(text)
            layout = [(str(p["name"]), tuple(int(d) for d in p["shape"])) for p in raw["params"]]
            config = raw.get("config", {})
            if not isinstance(config, dict):
                raise TypeError("config must be an object")
            return cls(str(raw.get("type", "")), config, [str(s) for s in raw["states"]], layout,
                       str(raw.get("dtype", "float32")))
        except (ValueError, KeyError, TypeError, AttributeError):
            raise ArtifactError(f"the {what} has damaged {OPTIMIZER_META!r} metadata") from None


@dataclass(frozen=True)
class TrainStepMeta:
    """The interface of the train-step model (the training graph fused with the optimizer graph), stored as
    JSON under ``TRAIN_STEP_META``; the model also keeps its sources' ``TRAINING_META`` and ``OPTIMIZER_META``,
    so a runtime checks it was built from the training and optimizer models it is given.

    Attributes:
        prefix: the optimizer graph's inputs and outputs are named ``prefix + name`` (``optimizer/params``,
            ``optimizer/params.out``, ``optimizer/gradients`` for the flat gradient).
        reset: the ``lazy_reset_grad`` value the graph assumes (it then has no such input), or None if the
            flag is an input.
    """

    prefix: str
    reset: bool | None = True

    def to_props(self) -> dict[str, str]:
        """The ``metadata_props`` entries that carry this description."""
        return {TRAIN_STEP_META: json.dumps(asdict(self))}

    @classmethod
    def from_model(cls, model: onnx.ModelProto, what: str = "train-step model") -> TrainStepMeta:
        """Read the description from a train-step model; ArtifactError if absent or damaged."""
        text = _prop(model, TRAIN_STEP_META)
        if text is None:
            raise ArtifactError(f"the {what} was not written by onnxtrain.artifacts.fused (no {TRAIN_STEP_META!r} "
                                "metadata)")
        try:
            raw = json.loads(text)
            reset = raw.get("reset")
            if not isinstance(raw["prefix"], str) or reset not in (True, False, None):
                raise TypeError("prefix must be a string, reset a boolean or null")
            return cls(raw["prefix"], reset)
        except (ValueError, KeyError, TypeError, AttributeError):
            raise ArtifactError(f"the {what} has damaged {TRAIN_STEP_META!r} metadata") from None
