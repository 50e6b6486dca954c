"""Load the forward model and separate its graph from its weights."""

from __future__ import annotations

import dataclasses
import fnmatch
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from onnxtrain.artifacts.foreign import Detached, annotate_reshape_ranks, detach_foreign_ops, warn_lost_torch_records
from onnxtrain.artifacts.passes.cast_like_to_cast import CastLikeToCast
from onnxtrain.artifacts.passes.fold_index_constants import FoldIndexConstants
from onnxtrain.artifacts.passes.inline_decided_ifs import InlineDecidedIfs
from onnxtrain.artifacts.passes.inline_functions import InlineLocalFunctions
from onnxtrain.artifacts.passes.restore_detach import RestoreDetach
from onnxtrain.artifacts.passes.sequences_to_split import SequencesToSplit
from onnxtrain.artifacts.torch_names import recorded_kinds, restore_torch_parameters, retie_folded_transposes
from onnxtrain.conventions import TRAINING_META
from onnxtrain.ir.passes import clone, clone_without, declare_as_inputs, default_opset, node_inputs
from onnxtrain.ir.symbolic import canonical_name, input_symbols
from onnxtrain.ir.types import FLOAT_TYPES, onnx_dtype

__all__ = ["SourceModel", "OpsetConversionError", "load_source_model", "MIN_OPSET", "KEEP_OPSET_FROM",
           "promote_constants", "float_constants", "model_from_bytes"]

logger = logging.getLogger(__name__)

MIN_OPSET = 17        # the opset older models are converted to when onnxtrain cannot train them at theirs
KEEP_OPSET_FROM = 13  # models from this opset on keep it (as the peer does); axes became inputs at 13


class OpsetConversionError(ValueError):
    """ONNX's version converter could not bring the model to :data:`MIN_OPSET`."""


@dataclass
class SourceModel:
    """The forward graph without initializer data, and the initializer values by name."""

    model: onnx.ModelProto           # initializers removed (their names are in ``weights``)
    weights: dict[str, np.ndarray]
    opset: int
    first_output: str = ""           # the source's first output, which built-in losses read by default
    detached: Detached = dataclasses.field(default_factory=Detached)  # outputs of ai.onnx.ml ops (foreign.py)


def _read(model: onnx.ModelProto | str | os.PathLike) -> tuple[onnx.ModelProto, str | None]:
    if isinstance(model, onnx.ModelProto):
        return model, None
    if isinstance(model, (bytes, bytearray)):
        model = model_from_bytes(bytes(model))
        if isinstance(model, onnx.ModelProto):
            return model, None
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if not os.path.exists(path):
            raise FileNotFoundError(f"model file not found: {path}")
        try:
            proto = onnx.load(path, load_external_data=False)
        except Exception as exc:
            raise ValueError(f"{path} is not a valid ONNX model: {exc}") from None
        if not proto.graph.node:
            raise ValueError(f"{path} is not an ONNX model with a graph (no nodes found)")
        return proto, os.path.dirname(os.path.abspath(path))
    raise TypeError(f"model must be an onnx.ModelProto or a path to an .onnx file, got {type(model).__name__}")


def model_from_bytes(data: bytes) -> onnx.ModelProto | str:
    """The ``model`` argument given as bytes: a path (bytes naming an existing file, as os.fspath takes them) or
    a serialized model."""
    path = os.fsdecode(data)
    if len(data) < 4096 and os.path.isfile(path):
        return path
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception:
        model = None
    if model is None or not model.graph.node:
        raise TypeError(f"model is {len(data)} bytes that neither name an existing file nor parse as a serialized "
                        f"ONNX model with a graph: pass a path (str or pathlib.Path) or an onnx.ModelProto")
    return model


def load_source_model(model: onnx.ModelProto | str | os.PathLike, min_opset: int = KEEP_OPSET_FROM) -> SourceModel:
    """Read ``model`` (a ModelProto or a path; external data is read from the model's folder); a model below
    ``min_opset`` is converted to :data:`MIN_OPSET`."""
    original, base_dir = _read(model)
    # The caller's model stays untouched; the graph is copied without its initializers (CopyFrom: 25x faster
    # than a serialization), whose values are read once into ``weights``. A model read from a file is then
    # dropped, so one copy of the weights is alive during generation, not two (docs/memory.md).
    if any(p.key == TRAINING_META for p in original.metadata_props):
        raise ValueError("the model is an artifact generate_artifacts wrote (a training or eval model), not a "
                         "forward model: generate from the model the artifacts were made from, or train these "
                         "artifacts as they are")
    proto = clone_without(original, "initializer")
    # calls of the model's own functions (export_modules_as_functions) become their bodies: default-domain ops
    proto = InlineLocalFunctions().run(proto).model
    _check_input_types(proto.graph)
    opset = default_opset(proto)
    if opset is None:
        raise ValueError("the model imports no default-domain (ai.onnx) opset")
    weights: dict[str, np.ndarray] = {}
    for init in original.graph.initializer:
        try:
            weights[init.name] = numpy_helper.to_array(init, base_dir=base_dir or "")
        except Exception as exc:
            if init.external_data and base_dir is None:
                where = next((e.value for e in init.external_data if e.key == "location"), "?")
                raise ValueError(f"cannot read initializer {init.name!r}: the model was given as a ModelProto whose "
                                 f"weights are in an external file ({where!r}), which is read relative to the "
                                 f"current directory and was not found there ({exc}); pass the model's path "
                                 f"instead, or onnx.load it with its external data") from None
            raise ValueError(f"cannot read initializer {init.name!r}: {exc}") from None
    del original
    warn_lost_torch_records(proto)  # a tool dropped what restore_torch_parameters reads
    restored = restore_torch_parameters(proto.graph, weights)  # dynamo's optimizer renamed or merged them
    proto = RestoreDetach().run(proto).model                    # and removed detach()es: stop-gradients
    retie_folded_transposes(proto.graph, weights)              # TorchScript's folding untied a tied head
    if restored:
        logger.info("torch parameters restored from the exporter's records: %d (e.g. %s)", len(restored), restored[0])
    proto = _split_sequences(proto, weights)
    _densify_sparse_initializers(proto.graph, weights)
    first_output = proto.graph.output[0].name if proto.graph.output else ""
    detached = detach_foreign_ops(proto, weights)  # skl2onnx's ai.onnx.ml label and ZipMap (foreign.py)
    if opset < min_opset or (opset < 14 and _training_batchnorm(proto.graph)):
        proto = _upgrade(proto, weights)
        opset = MIN_OPSET
    elif opset < 14:
        annotate_reshape_ranks(proto, weights)
    _unalias_initializers(proto.graph, weights)
    _spell_declared_sizes(proto.graph)
    # a Slice's bounds written as Unsqueeze(Constant): shape inference reads only constants (FoldIndexConstants)
    proto = FoldIndexConstants().run(proto).model
    # an If on a rank or a static size (TorchScript's tile and squeeze): shape inference cannot see through it
    proto = InlineDecidedIfs(weights).run(proto).model
    # onnxruntime folds a Cast of a constant, not a CastLike to a graph input's type (dynamo's zero conv biases)
    likes = {n.input[1] for n in proto.graph.node if n.op_type == "CastLike" and len(n.input) == 2}
    if likes:
        types = {x: onnx_dtype(weights[x].dtype) for x in likes if x in weights}
        proto = CastLikeToCast(types).run(proto).model
    return SourceModel(proto, weights, opset, first_output, detached)


def float_constants(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    """The values of the graph's Constant nodes that hold a floating-point tensor, by output name (models written
    by onnxscript, or by exporters that store weights as Constant nodes, have no initializers)."""
    found = {}
    for node in graph.node:
        if node.op_type != "Constant" or len(node.attribute) != 1:
            continue
        attr = node.attribute[0]
        if attr.name == "value" and attr.t.data_type in FLOAT_TYPES and not attr.t.external_data:
            found[node.output[0]] = numpy_helper.to_array(attr.t)
        elif attr.name in ("value_float", "value_floats"):
            found[node.output[0]] = np.asarray(onnx.helper.get_attribute_value(attr), dtype=np.float32)
    return found


def promote_constants(source: SourceModel, names: Sequence[str] | None) -> list[str]:
    """Make the floating-point Constant nodes that ``names`` name initializers of ``source``, in place, so that
    requires_grad and frozen_params can select them as they select initializers; returns the promoted names.
    A glob selects Constant nodes of more than one value only in a model without initializers (onnxscript's form):
    elsewhere the Constant nodes are the exporter's constants (a mask, a table), which ``["*"]`` must not train."""
    if not names:
        return []
    found = float_constants(source.model.graph)
    globs = not source.weights
    picked = [c for c, v in found.items() if c not in source.weights and any(
        c == n or (globs and v.size > 1 and any(ch in n for ch in "*?[") and fnmatch.fnmatchcase(c, n))
        for n in names)]
    if not picked:
        return picked
    for name in picked:
        source.weights[name] = found[name]
    keep = [n for n in source.model.graph.node if not (n.op_type == "Constant" and n.output[0] in picked)]
    del source.model.graph.node[:]
    source.model.graph.node.extend(keep)
    logger.info("Constant nodes made parameters: %d (e.g. %s)", len(picked), picked[0])
    return picked


def _densify_sparse_initializers(graph: onnx.GraphProto, weights: dict[str, np.ndarray]) -> None:
    """Move the graph's sparse initializers into ``weights`` as dense arrays (the gradients and the optimizer work
    on dense tensors; the trained values are dense too), in place."""
    for sparse in graph.sparse_initializer:
        name = sparse.values.name
        try:
            values = numpy_helper.to_array(sparse.values)
            indices = numpy_helper.to_array(sparse.indices).astype(np.int64)
            dense = np.zeros(tuple(sparse.dims), dtype=values.dtype)
            if indices.ndim == 2:  # COO: one row of coordinates per value
                dense[tuple(indices.T)] = values
            else:                  # linearized indices into the flattened tensor
                dense.reshape(-1)[indices] = values
        except Exception as exc:
            raise ValueError(f"cannot read sparse initializer {name!r} (dims {list(sparse.dims)}): {exc}") from None
        weights[name] = dense
    del graph.sparse_initializer[:]


def _check_input_types(graph: onnx.GraphProto) -> None:
    """Refuse an input that is not a tensor (a sequence, an optional, a map): the runtime feeds tensors only."""
    kinds = {"sequence_type": "a sequence", "optional_type": "an optional", "map_type": "a map",
             "sparse_tensor_type": "a sparse tensor", None: "of no type"}
    for vi in graph.input:
        kind = vi.type.WhichOneof("value")
        if kind == "tensor_type":
            continue
        spelled = kinds.get(kind, kind)
        raise ValueError(f"the model's input {vi.name!r} is {spelled}, not a tensor: the training and eval steps "
                         f"feed tensors only; give the model tensor inputs (a sequence stacked into one tensor, an "
                         f"optional input as a plain tensor)")


def _spell_declared_sizes(graph: onnx.GraphProto) -> None:
    """The sizes the exporter declares (value infos, outputs) as expressions of the inputs' symbols, spelled as
    ONNX inference's solvers name them (``ir.symbolic.canonical_name``), in place: torch's dynamo exporter declares
    ``((s27//10)) - 1`` where a convolution's output is ``floor((s27-10)/10)``, and two names for one size make
    the gradients of the ops joining them reduce at run time."""
    given = input_symbols(graph)
    for vi in [*graph.value_info, *graph.output]:
        if vi.type.HasField("tensor_type"):
            for dim in vi.type.tensor_type.shape.dim:
                if dim.dim_param:
                    dim.dim_param = canonical_name(dim.dim_param, given)


def _split_sequences(proto: onnx.ModelProto, weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    """Run :class:`SequencesToSplit` (torch.split written as tensor sequences by the dynamo exporter) on the
    graph without initializers: the weights are declared as graph inputs for the pass (the small ones also as
    initializers, so that split sizes and positions are known), then taken out again."""
    if not any(n.op_type == "SplitToSequence" for n in proto.graph.node):
        return proto
    view = clone(proto)
    added = declare_as_inputs(view, weights)
    view.graph.initializer.extend(numpy_helper.from_array(weights[n], n) for n in added if weights[n].size <= 4096)
    result = SequencesToSplit()(view)
    if not result.modified:
        return proto
    out = result.model
    kept = [i for i in out.graph.input if i.name not in added]
    del out.graph.input[:]
    out.graph.input.extend(kept)
    del out.graph.initializer[:]
    return out


def _unalias_initializers(graph: onnx.GraphProto, weights: dict[str, np.ndarray]) -> None:
    """Turn ``Identity(initializer) -> name`` into an initializer of its own called ``name``.

    torch.onnx.export (TorchScript) stores equal-valued parameters once and aliases the others with Identity nodes;
    they are separate parameters in the source model and must stay separately trainable here. The dynamo exporter
    aliases none: an Identity on a tensor it records as the module's (``InputSpec.kind``) is that tensor's
    ``clone()``, which stays an Identity, so that every read trains the one parameter.
    """
    keep = []
    graph_outputs = {o.name for o in graph.output}
    recorded = recorded_kinds(graph)
    for node in graph.node:
        if (node.op_type == "Identity" and node.input[0] in weights and node.output[0] not in weights
                and node.output[0] not in graph_outputs and node.input[0] not in recorded):
            weights[node.output[0]] = weights[node.input[0]].copy()
        else:
            keep.append(node)
    if len(keep) != len(graph.node):
        del graph.node[:]
        graph.node.extend(keep)
        used = {x for n in graph.node for x in node_inputs(n)} | graph_outputs
        for name in [w for w in weights if w not in used]:
            del weights[name]


def _training_batchnorm(graph: onnx.GraphProto) -> bool:
    """Whether a BatchNormalization before opset 14 is in training mode, which it says by its output count (the
    running statistics as outputs; opset 14 made it the ``training_mode`` attribute, which the gradient rule and the
    parameter roles read): the TorchScript exporter writes it so at opset 13 with ``training=TRAINING``. Such a model
    is converted to opset 17, whose node says it."""
    return any(n.op_type == "BatchNormalization" and len([o for o in n.output if o]) > 1 for n in graph.node)


def _drop_unused_saved_statistics(graph: onnx.GraphProto) -> None:
    """Training-mode BatchNormalization before opset 14 may list saved_mean/saved_var outputs, which opset 14
    removed (torch's TorchScript exporter writes them, unused); the converter refuses them, so drop them."""
    read = {x for n in graph.node for x in node_inputs(n)} | {o.name for o in graph.output}
    for node in graph.node:
        if node.op_type == "BatchNormalization" and len(node.output) > 3 and not read & set(node.output[3:]):
            del node.output[3:]


def _upgrade(proto: onnx.ModelProto, weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    """Convert to opset 17 (the converter needs the initializers back, so add and strip them again)."""
    from onnx import version_converter

    proto.graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in weights.items())
    _drop_unused_saved_statistics(proto.graph)
    try:
        try:
            proto = version_converter.convert_version(proto, MIN_OPSET)
        except RuntimeError as exc:
            if "is a param instead of an int" not in str(exc):
                raise
            proto = _convert_with_pinned_dims(proto)
    except Exception as exc:
        raise OpsetConversionError(f"cannot convert the model to opset {MIN_OPSET} (onnxtrain needs at least "
                         f"{MIN_OPSET}): {exc}") from None
    for node in proto.graph.node:  # before opset 14 the output count meant training mode; the converter drops it
        if (node.op_type == "BatchNormalization" and len(node.output) > 1
                and not any(a.name == "training_mode" for a in node.attribute)):
            node.attribute.append(onnx.helper.make_attribute("training_mode", 1))
    weights.clear()
    weights.update({i.name: numpy_helper.to_array(i) for i in proto.graph.initializer})
    del proto.graph.initializer[:]
    return proto


def _convert_with_pinned_dims(proto: onnx.ModelProto) -> onnx.ModelProto:
    """Convert with the symbolic dimensions of the inputs and outputs set to 1, then give them back: some of the
    converter's adapters (Gemm 6 -> 7, which drops ``broadcast``) check shapes and refuse a dynamic batch axis,
    though the converted node does not depend on it."""
    from onnx import version_converter

    pinned = onnx.ModelProto()
    pinned.CopyFrom(proto)
    del pinned.graph.value_info[:]
    symbolic = {}
    for vi in [*pinned.graph.input, *pinned.graph.output]:
        for k, dim in enumerate(vi.type.tensor_type.shape.dim):
            if not dim.HasField("dim_value"):
                symbolic[vi.name, k] = onnx.TensorShapeProto.Dimension()
                symbolic[vi.name, k].CopyFrom(dim)
                dim.dim_value = 1
    converted = version_converter.convert_version(pinned, MIN_OPSET)
    del converted.graph.value_info[:]
    for vi in [*converted.graph.input, *converted.graph.output]:
        for k, dim in enumerate(vi.type.tensor_type.shape.dim):
            if (vi.name, k) in symbolic:
                dim.CopyFrom(symbolic[vi.name, k])
    return converted
