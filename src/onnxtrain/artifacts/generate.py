"""``generate_artifacts``: the offline phase, with the signature of onnxruntime-training's."""

from __future__ import annotations

import contextlib
import gc
import logging
import os
from collections.abc import Iterator, Sequence

import numpy as np
import onnx

from onnxtrain.artifacts.foreign import check_loss_inputs
from onnxtrain.artifacts.graphs import build_graphs
from onnxtrain.artifacts.hyperparameter_keywords import hyperparameters_where_they_go
from onnxtrain.artifacts.lora import apply_lora, finish_lora
from onnxtrain.artifacts.optimizer import build_optimizer_model
from onnxtrain.artifacts.params import (
    QUANTIZED_ADVICE,
    QUANTIZED_OPS,
    QUANTIZING_OPS,
    WEIGHTS_AS_INPUTS,
    check_state_dtypes,
    expand_names,
    plan_parameters,
    quantized_away,
    quantized_weights,
)
from onnxtrain.artifacts.passes import (
    BackwardOrder,
    GeluBackward,
    RecomputeInBackward,
    ShapesInForward,
    TransposedProducts,
)
from onnxtrain.artifacts.source import (
    KEEP_OPSET_FROM,
    MIN_OPSET,
    OpsetConversionError,
    float_constants,
    load_source_model,
    model_from_bytes,
    promote_constants,
)
from onnxtrain.blocks import ops, optim
from onnxtrain.blocks.base import Block
from onnxtrain.builtins import LossType, OptimType
from onnxtrain.checkpoint import CheckpointData
from onnxtrain.checkpoint.format import checkpoint_pieces
from onnxtrain.conventions import artifact_file
from onnxtrain.errors import InvalidModelError, PassError, UnknownShapeError, UnsupportedOpError, first_line
from onnxtrain.ir.files import PROTO_LIMIT, StagedFiles, directory_for_writing
from onnxtrain.ir.pass_infra import PassManager
from onnxtrain.lora import LoRA
from onnxtrain.tflite.source import RECORD_KEY, SKELETON_KEY, SourceRecord, has_source

__all__ = ["generate_artifacts", "LossType", "OptimType", "convert_to_ort"]

logger = logging.getLogger(__name__)

# A serialized model larger than this is written before the next one is serialized, so that at most one such
# copy is alive; smaller ones are written on the writer's thread while the next is checked.
_WRITE_AHEAD_BYTES = 1 << 26


def _resolve_loss(loss) -> tuple[Block, bool]:
    """(block, whether every model output goes to it): built-ins take the first output, custom blocks all.
    None: the model's first output already is the loss (:func:`_outputs_without_loss` adds the others)."""
    if loss is None:
        return ops.Identity(), False
    if isinstance(loss, LossType):
        return loss.block_class(), False
    if isinstance(loss, Block):
        return loss, not isinstance(loss, tuple(t.block_class for t in LossType))
    raise TypeError(f"loss must be a LossType or an onnxtrain.blocks.Block, got {type(loss).__name__}")


def _names_argument(argument: str, value) -> list[str] | None:
    """``value`` as a list of value names; TypeError for anything else (a str would be read as its characters)."""
    if value is None:
        return None
    if isinstance(value, (str, bytes)):
        raise TypeError(f"{argument} must be a list of value names, not one {type(value).__name__}: pass "
                        f"[{value!r}], not {value!r}")
    if not isinstance(value, Sequence) or not all(isinstance(v, str) for v in value):
        raise TypeError(f"{argument} must be a list of value names (str), got {value!r}")
    return list(value)


def _outputs_without_loss(model_outputs: list[str], loss_input_names: list[str] | None,
                          additional_output_names: list[str] | None) -> tuple[list[str] | None, list[str]]:
    """(loss_input_names, additional_output_names) for ``loss=None``. As the peer's (its loss is a PassThrough of
    the values the loss would read): the first is the loss, the others are returned after it, so that a model
    whose outputs are (loss, logits) trains with ``loss, logits = module(x, y)``. Given additional_output_names
    replace the model's other outputs (the loss_input_names after the first stay, as the peer's)."""
    if loss_input_names:
        return loss_input_names[:1], list(dict.fromkeys([*loss_input_names[1:], *(additional_output_names or [])]))
    if additional_output_names is not None:
        return None, additional_output_names
    return None, model_outputs[1:]


def _resolve_optimizer(optimizer) -> optim.Optimizer | None:
    if optimizer is None:
        return None
    if isinstance(optimizer, OptimType):
        return optimizer.block_class()
    if isinstance(optimizer, optim.Optimizer):
        return optimizer
    if isinstance(getattr(optimizer, "flat_rule", None), optim.Optimizer):  # onnxblock.optim.AdamW(...), as the peer
        return optimizer.flat_rule
    raise TypeError(f"optimizer must be an OptimType or an onnxtrain.blocks.Optimizer, got "
                    f"{type(optimizer).__name__}")


@contextlib.contextmanager
def _without_cyclic_gc() -> Iterator[None]:
    """Python's cyclic garbage collector paused: building the graphs allocates hundreds of thousands of short-lived
    objects without cycles, and the collections they trigger scan every object of the process (on MobileNetV2,
    10-15 ms of a generation in a fresh process)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@hyperparameters_where_they_go
@_without_cyclic_gc()
def generate_artifacts(
    model: onnx.ModelProto | str | os.PathLike | bytes,
    requires_grad: Sequence[str] | None = None,
    frozen_params: Sequence[str] | None = None,
    loss: LossType | Block | None = None,
    optimizer: OptimType | optim.Optimizer | None = None,
    artifact_directory: str | os.PathLike | None = None,
    prefix: str = "",
    ort_format: bool = False,
    custom_op_library: str | os.PathLike | None = None,
    additional_output_names: Sequence[str] | None = None,
    nominal_checkpoint: bool = False,
    loss_input_names: Sequence[str] | None = None,
    trainable_ops: int = -1,
    lora: LoRA | None = None,
) -> dict[str, str]:
    """Write ``{prefix}training_model.onnx``, ``eval_model.onnx``, ``optimizer_model.onnx`` and ``checkpoint``.

    Args:
        model: the forward model (ModelProto, or a path; models over 2 GB must be given as a path; bytes are a
            path or a serialized model).
        requires_grad: names (or globs) of the parameters to train; None trains every float initializer
            except frozen ones and BatchNorm running statistics.
        frozen_params: parameters kept in the checkpoint but never updated.
        loss: a :class:`LossType` or a :class:`~onnxtrain.blocks.Block` (custom loss); None when the model's
            first output (or ``loss_input_names[0]``) already is the loss.
        optimizer: an :class:`OptimType` or an optimizer block (``onnxtrain.blocks.AdamW(weight_decay=0.01)``);
            None writes no optimizer model.
        artifact_directory: where to write (default: the current directory).
        prefix: prepended to every file name.
        ort_format: also write ``.ort`` files (needs onnxruntime's converter, shipped with onnxruntime).
        custom_op_library: not supported: artifacts are plain ONNX and must not need custom ops.
        additional_output_names: model values returned after the loss by the training and eval steps.
        nominal_checkpoint: also write ``nominal_checkpoint``: names, dtypes and shapes only (the weights ship
            separately).
        loss_input_names: model values passed to the loss (default: the first model output for built-in
            losses, every model output for custom blocks).
        trainable_ops: train only the parameters of the last N ops (-1: all, 0: none); nodes that only prepare a
            weight (an exporter's Transpose(W)) belong to the op that reads it and are not counted.
        lora: low-rank adapters (:class:`~onnxtrain.lora.LoRA`) on the targeted weights, which stay frozen; then
            ``requires_grad`` names what trains beside the adapters (None: the adapters only).

    Returns:
        A mapping from artifact kind ("training", "eval", "optimizer", "checkpoint", "nominal_checkpoint") to
        the file path.
    """
    if custom_op_library is not None:
        raise ValueError("custom_op_library is not supported: onnxtrain artifacts use the default ONNX domain "
                         "only, so that they run on any stock onnxruntime")
    if isinstance(model, (bytes, bytearray)):
        model = model_from_bytes(bytes(model))
    if isinstance(trainable_ops, bool) or not isinstance(trainable_ops, (int, np.integer)):
        raise TypeError(f"trainable_ops must be an int (-1: every parameter, 0: none, N: the parameters of the last N "
                        f"ops), got {type(trainable_ops).__name__} {trainable_ops!r}")
    trainable_ops = int(trainable_ops)
    additional_output_names = _names_argument("additional_output_names", additional_output_names)
    loss_input_names = _names_argument("loss_input_names", loss_input_names)
    loss_block, all_outputs = _resolve_loss(loss)
    opt_block = _resolve_optimizer(optimizer)
    out_dir = os.fspath(artifact_directory or os.getcwd())
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise NotADirectoryError(f"artifact_directory {out_dir!r} is a file, not a folder: the artifacts are "
                                 "written into a folder (created if missing)")
    paths = {kind: os.path.join(out_dir, artifact_file(kind, prefix)) for kind in ("training", "eval")}
    if opt_block is not None:
        paths["optimizer"] = os.path.join(out_dir, artifact_file("optimizer", prefix))
    paths["checkpoint"] = os.path.join(out_dir, artifact_file("checkpoint", prefix))
    if nominal_checkpoint:
        paths["nominal_checkpoint"] = os.path.join(out_dir, artifact_file("nominal_checkpoint", prefix))

    def write(files: StagedFiles, kind: str, proto: onnx.ModelProto, checked: bool, changed: bool = False) -> None:
        serialized = proto.SerializeToString()
        # Every artifact passes the full check once: here, or in its passes (``checked``); one whose metadata
        # changed since (``changed``) gets the structural check, which covers the metadata.
        if not checked or changed:
            onnx.checker.check_model(serialized, full_check=not checked)
        files.stage(paths[kind], serialized, wait=len(serialized) > _WRITE_AHEAD_BYTES)

    def build(source, files: StagedFiles) -> None:
        train, frozen, lora_meta = (apply_lora(source, lora, requires_grad, frozen_params) if lora is not None
                                    else (requires_grad, frozen_params, None))
        plan = plan_parameters(source.model.graph, source.weights, train, frozen, trainable_ops)
        check_state_dtypes(source.weights, plan, opt_block is not None)
        quantized = sorted({n.op_type for n in source.model.graph.node if n.op_type in QUANTIZED_OPS})
        if not plan.trainable and opt_block is not None and lora is None:
            chosen = f"trainable_ops={trainable_ops}" if trainable_ops >= 0 else f"requires_grad={train!r}"
            cause = (f"; the model has no initializers but {len(source.model.graph.input)} inputs: "
                     f"{WEIGHTS_AS_INPUTS}" if not source.weights and len(source.model.graph.input) > 1 else
                     _weights_as_constants(source.model.graph) if not source.weights else
                     f"; the model is quantized ({', '.join(quantized)}): {QUANTIZED_ADVICE}" if quantized else "")
            logger.warning("no parameter trains (%s selects none): the optimizer model will update nothing; "
                           "name the parameters to train in requires_grad, or raise trainable_ops%s", chosen, cause)
        stored_quantized = quantized_weights(source.model.graph, source.weights) if train is None else []
        if stored_quantized and plan.trainable:
            logger.warning("%d weights are stored quantized (integers read by DequantizeLinear, e.g. %r): they "
                           "cannot train, so requires_grad=None trains only the float ones left; %s",
                           len(stored_quantized), stored_quantized[0], QUANTIZED_ADVICE)
        away = quantized_away(source.model.graph, plan.trainable)
        if away:
            logger.warning("%d trainable parameters (e.g. %r) are read by a quantizing op (%s): no gradient flows "
                           "through its integer output, so they learn only from paths around it; %s", len(away),
                           away[0], ", ".join(sorted(QUANTIZING_OPS.intersection(quantized))), QUANTIZED_ADVICE)
        # Each file is written on the writer's threads as soon as it is final: the checkpoint while the graphs
        # are built, the eval and optimizer models while the training graph goes through its passes.
        data = _checkpoint_data(source.weights, plan)
        files.stage(paths["checkpoint"], lambda: checkpoint_pieces(data))
        if nominal_checkpoint:
            files.stage(paths["nominal_checkpoint"], lambda: checkpoint_pieces(data.nominal_copy()))
        graphs = build_graphs(source.model, source.weights, plan, loss_block, loss_input_names,
                              additional_output_names, all_outputs)
        if lora_meta is not None:
            finish_lora(graphs, lora_meta)
        write(files, "eval", graphs.eval, checked=graphs.eval_checked, changed=lora_meta is not None)
        if opt_block is not None:
            write(files, "optimizer", build_optimizer_model(
                opt_block, {p: source.weights[p] for p in plan.trainable}, source.opset),
                  checked=False)
        # A weight's gradient through the exporters' MatMul(x, Transpose(W)) is one Gemm, not a Gemm and a copy
        # (TransposedProducts).
        # The backward keeps fewer forward values: the erf GELU's backward multiplies by its derivative, computed
        # from its input (GeluBackward); with a dynamic axis it reads the shapes of values it only needs the
        # shapes of (ShapesInForward), then it recomputes cheap ones (attention probabilities) from values it
        # keeps anyway; in this order, so that a value read only for its shape does not count as kept
        # (docs/memory.md, docs/lora.md).
        # onnxruntime orders the nodes itself: gradient nodes wait for the backward, weight gradients are
        # computed layer by layer (BackwardOrder, last; docs/memory.md).
        memory = PassManager([TransposedProducts(), GeluBackward(), ShapesInForward(),
                              RecomputeInBackward(infos=graphs.infos), BackwardOrder(infos=graphs.infos)])(
            graphs.training)
        training = memory.model
        # A model imported from .tflite/.circle carries its source file: the training model keeps it, so that the
        # trained weights can be written back from the artifacts alone (`onnxtrain export --format tflite`).
        flatbuffer = [p for p in source.model.metadata_props if p.key in (RECORD_KEY, SKELETON_KEY)]
        training.metadata_props.extend(flatbuffer)
        write(files, "training", training, checked=memory.modified, changed=bool(flatbuffer))

    def load(min_opset: int = KEEP_OPSET_FROM):
        loaded = load_source_model(model, min_opset=min_opset)
        promote_constants(loaded, [*(requires_grad or []), *(frozen_params or [])])
        return loaded

    with _blaming_an_invalid_source(model):
        source = load()
    if loss is None:
        loss_input_names, additional_output_names = _outputs_without_loss(
            [o.name for o in source.model.graph.output], loss_input_names, additional_output_names)
    check_loss_inputs(source.model.graph, source.detached, loss_input_names, additional_output_names or [],
                      source.first_output, type(loss_block).__name__ if loss is not None else "", all_outputs)
    requires_grad, trainable_ops = _flatbuffer_operators(source.model, source.weights, requires_grad, trainable_ops)
    # Nothing replaces an existing artifact unless every one was built; the folder is created only now, and
    # removed again if this call created it and could not write the artifacts.
    with directory_for_writing(out_dir), StagedFiles() as files:
        with _blaming_an_invalid_source(model):
            try:  # at the model's own opset, as the peer; some gradients need ops of newer opsets
                build(source, files)
            except UnsupportedOpError as exc:
                if source.opset >= MIN_OPSET:
                    raise
                # the error without its advice to convert the model, which is what happens here
                logger.warning("converting the model to opset %d: its gradient needs it (%s)", MIN_OPSET,
                               str(exc).split(" - help:")[0].splitlines()[0])
                files.discard()
                build(load(MIN_OPSET), files)
        files.commit()
    if ort_format:
        convert_to_ort([paths[k] for k in ("training", "eval", "optimizer") if k in paths])
    return paths


@contextlib.contextmanager
def _blaming_an_invalid_source(model: onnx.ModelProto | str | os.PathLike) -> Iterator[None]:
    """An artifact that fails the ONNX check because the caller's model already fails it (an exporter wrote a
    type ONNX does not have, for example) is reported as the model's problem, not as a pass's. The source is
    checked only then: a full check of it would cost every generation its time."""
    try:
        yield
    # (an UnknownShapeError too: a value ONNX inference could not type may be one the model itself gets wrong, as
    # an Add of sizes no broadcast reconciles)
    except (PassError, OpsetConversionError, onnx.checker.ValidationError,
            onnx.shape_inference.InferenceError, UnknownShapeError) as exc:
        if isinstance(exc, UnknownShapeError) and _has_shapeless_input(model):
            raise  # it names the input and how to give it a shape, where the checker only says a shape is missing
        problem = _checker_problem(model)
        if problem is None:
            raise
        raise InvalidModelError(f"the model is not valid ONNX, so no artifact built from it can be: the ONNX "
                                f"checker (full_check=True) rejects it as given: {problem}. Export it again (a newer "
                                f"exporter or opset, or without the op named) and check it with "
                                f"onnx.checker.check_model(path, full_check=True)") from exc


def _has_shapeless_input(model: onnx.ModelProto | str | os.PathLike) -> bool:
    """Whether one of the graph's inputs declares no shape at all (not even a rank)."""
    if not isinstance(model, onnx.ModelProto):
        try:
            model = (onnx.load_model_from_string(model) if isinstance(model, bytes) and not os.path.exists(model)
                     else onnx.load(os.fspath(model), load_external_data=False))
        except Exception:  # unreadable: the error being handled stands
            return False
    return any(i.type.HasField("tensor_type") and not i.type.tensor_type.HasField("shape") for i in model.graph.input)


def _checker_problem(model: onnx.ModelProto | str | os.PathLike) -> str | None:
    """The first line of the full ONNX check's complaint about ``model``, or None when it passes."""
    if isinstance(model, onnx.ModelProto) and model.ByteSize() >= PROTO_LIMIT:
        return None  # the checker takes a path for models over 2 GB; the pass's own error stands
    try:
        onnx.checker.check_model(model if isinstance(model, onnx.ModelProto) else os.fspath(model), full_check=True)
    except Exception as exc:  # ValidationError, InferenceError
        return first_line(exc).rstrip(".")
    return None


def _weights_as_constants(graph: onnx.GraphProto) -> str:
    """Why a model without initializers trains nothing: its weights are Constant nodes (onnxscript), or ''."""
    tensors = [c for c, v in float_constants(graph).items() if v.size > 1]
    if not tensors:
        return ""
    return (f"; the model has no initializers, and {len(tensors)} Constant nodes hold float tensors (e.g. "
            f"{tensors[0]!r}): name them in requires_grad (names or globs) to train them")


def _checkpoint_data(weights: dict, plan) -> CheckpointData:
    """The checkpoint: the weights only (the runtime creates the optimizer state, at zero)."""
    return CheckpointData(trainable={p: weights[p] for p in plan.trainable},
                          frozen={p: weights[p] for p in plan.frozen},
                          buffers={p: weights[p] for p in plan.buffers})


def _flatbuffer_operators(model: onnx.ModelProto, weights: dict, requires_grad, trainable_ops: int):
    """(requires_grad, trainable_ops) for ``model``: one imported from .tflite/.circle counts ``trainable_ops``
    in TFLite operators, as onert_train's --num_of_trainable_ops does, not in ONNX nodes; with ``requires_grad``
    too, the parameters both select train (the named ones the last N operators read), as for an ONNX model."""
    if trainable_ops < 0 or not has_source(model):
        return requires_grad, trainable_ops
    selected = SourceRecord.from_model(model).trainable_weights(trainable_ops)
    if requires_grad is not None:
        named = set(expand_names(requires_grad, list(weights), "requires_grad", graph=model.graph))
        selected = [w for w in selected if w in named]
    return selected, -1


def convert_to_ort(model_paths: list[str]) -> None:
    """Write ``.ort`` next to each model with onnxruntime's own converter."""
    import onnxruntime as ort

    for path in model_paths:
        so = ort.SessionOptions()
        # Extended, not all: level-3 rewrites are specific to this machine's CPU (NCHWc blocking, AVX kernels)
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        so.optimized_model_filepath = os.path.splitext(path)[0] + ".ort"
        so.add_session_config_entry("session.save_model_format", "ORT")
        ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
