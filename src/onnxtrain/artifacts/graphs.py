"""Build the training and eval graphs from the forward graph, a loss block and a parameter plan."""

from __future__ import annotations

import copy
import logging
import warnings
from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import onnx
from onnx import helper

from onnxtrain import conventions as names
from onnxtrain.artifacts.params import QUANTIZED_ADVICE, ParameterPlan, quantized_away
from onnxtrain.artifacts.passes import DropUnreadIndices, EvalMode, PoolBeforeRelu
from onnxtrain.autodiff import build_gradients
from onnxtrain.blocks import ops
from onnxtrain.blocks.base import Block
from onnxtrain.blocks.model_accessor import building_on, check_defined
from onnxtrain.conventions import TrainingMeta
from onnxtrain.errors import UnknownShapeError
from onnxtrain.ir.builder import GraphBuilder
from onnxtrain.ir.pass_infra import PassManager
from onnxtrain.ir.passes import (
    constant_values,
    default_opset,
    fresh_name,
    node_inputs,
    portable_ir_version,
    rename_values,
    used_names,
)
from onnxtrain.ir.types import TensorInfo, infer_from_inputs, infer_tensor_info, redeclare, value_info
from onnxtrain.runtime.size_limits import size_limits

__all__ = ["TrainingGraphs", "build_graphs"]

logger = logging.getLogger(__name__)


@dataclass
class TrainingGraphs:
    training: onnx.ModelProto
    eval: onnx.ModelProto
    user_inputs: list[str]
    label_inputs: list[str]
    eval_checked: bool = False  # whether the eval model's passes ran the full ONNX check on it
    infos: dict[str, TensorInfo] = field(default_factory=dict)  # types and shapes of the forward's values


def declare_class_scores(model: onnx.ModelProto, infos: dict[str, TensorInfo]) -> None:
    """Declare (as a value_info) the scores a class loss of ``model`` reads, when their class count is static:
    the runtime then refuses a label past it before the run, naming the label (runtime.inputs)."""
    graph = model.graph
    declared = {v.name for v in (*graph.value_info, *graph.input, *graph.output)}
    for node in graph.node:
        if node.op_type not in names.CLASS_LOSSES or node.domain not in ("", "ai.onnx"):
            continue
        scores, info = node.input[0], infos.get(node.input[0])
        if scores in declared or info is None or info.shape is None or len(info.shape) < 2 \
                or not isinstance(info.shape[1], int):
            continue
        graph.value_info.append(value_info(scores, info))
        declared.add(scores)


def _model(template: onnx.ModelProto, graph: onnx.GraphProto, meta: dict) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[op for op in template.opset_import if op.domain in ("", "ai.onnx")],
                              producer_name="onnxtrain")
    model.ir_version = portable_ir_version(model.opset_import)
    for key, value in meta.items():
        model.metadata_props.add(key=key, value=value)
    return model


def _forward_graph(graph: onnx.GraphProto, weights: dict[str, np.ndarray], state: list[str]) -> onnx.GraphProto:
    """The forward graph with the state (parameters, buffers) as inputs and the other weights as constants."""
    fwd = copy.deepcopy(graph)
    user_inputs = [i for i in graph.input if i.name not in weights]
    del fwd.input[:]
    fwd.input.extend(user_inputs)
    fwd.input.extend(helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(weights[n].dtype),
                                                   weights[n].shape) for n in state)
    fwd.initializer.extend(onnx.numpy_helper.from_array(v, k) for k, v in weights.items() if k not in state)
    return fwd


@dataclass
class _LossPart:
    """What the loss block added to the forward graph: its nodes, constants and new (label) inputs, the loss and
    the other values it returned (outputs after the loss)."""

    nodes: list[onnx.NodeProto]
    initializers: list[onnx.TensorProto]
    labels: list[onnx.ValueInfoProto]
    loss: str
    outputs: list[str]


def _add_loss(fwd_model: onnx.ModelProto, infos: dict[str, TensorInfo], loss: Block,
              loss_inputs: list[str], weights: Collection[str] = ()) -> _LossPart:
    """Let the loss block build its nodes on the forward graph, in place, as the peer builds it inside
    ``onnxblock.base(model)``: an onnxblock loss reads and edits ``self.base`` (this model), onnxtrain blocks build
    on the values they are given. The block returns the loss, or a tuple ``(loss, *outputs)`` whose other values
    the steps return after the loss."""
    graph = fwd_model.graph
    model_outputs = {o.name for o in graph.output}
    counts = len(graph.node), len(graph.initializer), len(graph.input)
    computed = {o for n in graph.node for o in n.output} | {t.name for t in graph.initializer} | set(weights)
    who = f"the loss block {type(loss).__name__}"
    with building_on(fwd_model, infos=infos, owner=who) as accessor:
        ctx = accessor.context
        returned = loss(*map(ctx.value, loss_inputs))
        names_out = list(returned) if isinstance(returned, (tuple, list)) else [returned]
        if not names_out or not all(isinstance(n, str) for n in names_out):
            raise TypeError(f"{who} must return the loss's value name, or a tuple (loss, *other outputs) of value "
                            f"names, got {returned!r}")
        graph = accessor.model.graph
        check_defined(graph, who, counts[0])
        loss_out, outputs = str(names_out[0]), list(dict.fromkeys(str(n) for n in names_out[1:]))
        defined = {v.name for v in graph.input} | {t.name for t in graph.initializer} | {
            o for n in graph.node for o in n.output}
        unknown = [n for n in [loss_out, *outputs] if n not in defined]
        if unknown:
            raise ValueError(f"{who} returned {unknown[0]!r}, which is not a value of the model (its outputs are "
                             f"{[o.name for o in graph.output]})")
        _check_label_names(graph, computed, len(loss_inputs), loss)
        ctx.builder.take(used_names(graph))  # with the names edits of self.base added
        if loss_out in model_outputs and loss_out not in outputs:
            loss_name = loss_out  # the model's own loss output (loss=None) keeps its name, as the peer's does
        else:
            loss_name = ctx.builder.unique("loss")
            if loss_out in outputs or not _rename_value(graph.node[counts[0]:], loss_out, loss_name):
                ctx.builder.node("Identity", [loss_out], [loss_name])  # or the loss node writes the output itself
        graph = accessor.model.graph
    return _LossPart(list(graph.node[counts[0]:]), list(graph.initializer[counts[1]:]),
                     list(graph.input[counts[2]:]), loss_name, outputs)


def _check_label_names(graph: onnx.GraphProto, computed: set[str], given: int, loss: Block) -> None:
    """ValueError when the name of a built-in loss's label is taken by a value the model computes (an output
    called ``target``): the loss would take that value for the label instead of declaring an input (as the peer's
    losses reuse a graph input of that name) and compare the model with itself. ``given``: the loss's arguments
    the caller named (loss_input_names); the labels after them have the block's default names."""
    import inspect

    from onnxtrain.builtins import LossType

    if not isinstance(loss, tuple(t.block_class for t in LossType)):
        return  # a custom block may read any value of the model
    params = list(inspect.signature(loss.build).parameters.values())[given:]
    labels = [p.default for p in params if isinstance(p.default, str)]
    taken = next((n for n in labels if n in computed), None)
    if taken is not None:
        where = ("an output of the model" if any(o.name == taken for o in graph.output) else
                 "a value of the model" if taken not in {i.name for i in graph.input} else "a weight of the model")
        raise ValueError(f"{type(loss).__name__}'s label input is called {taken!r}, which is {where}: the loss would "
                         f"read that value as the label, not the labels you feed; rename {taken!r} in the model (its "
                         f"producer, its readers and the outputs)")


def _builtin_loss_name(loss: Block) -> str:
    """The ``LossType`` name of a built-in loss block (not of a subclass, which may compute another loss), else ""."""
    from onnxtrain.builtins import LossType

    return next((t.name for t in LossType if type(loss) is t.block_class), "")


def _check_loss_typed(infos: dict[str, TensorInfo], part: _LossPart, loss: Block) -> None:
    """ValueError naming the node when shape inference gives a built-in loss no type: its inputs do not fit
    together (a model input of the label's name, reused as the label as the peer does, with another shape); or when
    a softmax cross-entropy reads scores of one class (a regression output: the loss would be 0 whatever the
    weights)."""
    from onnxtrain.builtins import LossType

    for n in part.nodes:
        scores = infos.get(n.input[0]) if n.op_type == "SoftmaxCrossEntropyLoss" and n.input else None
        if scores is not None and scores.shape is not None and len(scores.shape) >= 2 and scores.shape[1] == 1:
            raise ValueError(f"{type(loss).__name__} reads {n.input[0]!r} {_spell(scores)}, scores of one class: "
                             f"softmax cross-entropy over one class is 0 for every example, so nothing would train; "
                             f"for a regression output use LossType.MSELoss (or L1Loss), for one binary logit "
                             f"LossType.BCEWithLogitsLoss")
    if not isinstance(loss, tuple(t.block_class for t in LossType)):
        return
    for n in part.nodes:
        label = infos.get(n.input[1]) if n.op_type in names.CLASS_LOSSES and len(n.input) > 1 else None
        if label is not None and label.elem_type not in (onnx.TensorProto.INT32, onnx.TensorProto.INT64):
            raise ValueError(f"{type(loss).__name__} reads its labels from {n.input[1]!r}, {_spell(label)}: class "
                             f"labels are int64 or int32 (a model input of the label's name is taken as the label)")
    if infos.get(part.loss) is not None:
        return
    node = next((n for n in part.nodes if any(o and o not in infos for o in n.output)), None)
    if node is None:
        return
    described = ", ".join(f"{x!r} {_spell(infos.get(x))}" for x in node.input if x)
    raise ValueError(f"{type(loss).__name__} cannot compute the loss: its {node.op_type} node reads {described}, "
                     f"which do not fit together; check the loss inputs (loss_input_names) and the labels (a model "
                     f"input of the label's name is taken as the label)")


def _spell(info: TensorInfo | None) -> str:
    if info is None:
        return "(type unknown)"
    dims = "?" if info.shape is None else ", ".join("?" if d is None else str(d) for d in info.shape)
    return f"{onnx.helper.tensor_dtype_to_np_dtype(info.elem_type)}[{dims}]"


def _check_scalar_loss(info: TensorInfo | None, loss: Block, first_input: str) -> None:
    """ValueError unless the loss holds one number (shape (), [1], [1, 1]...); a loss of unknown shape is left to the
    run. ``loss``: the block (an Identity for ``loss=None``, whose loss is the model's value ``first_input``)."""
    if info is None or info.shape is None or all(d == 1 for d in info.shape):
        return
    shape = [d if d is not None else "?" for d in info.shape]
    if isinstance(loss, ops.Identity):
        raise ValueError(f"loss=None takes the model's output {first_input!r} as the loss, but it has shape {shape}, "
                         "not one number; pass a loss (e.g. loss=LossType.CrossEntropyLoss) to compute one from it, "
                         "or name the model's scalar loss output in loss_input_names")
    raise ValueError(f"the loss block {type(loss).__name__} gives a loss of shape {shape}, not one number: a loss "
                     "must reduce to a scalar (reduction='mean' or 'sum', or a ReduceMean/ReduceSum in a custom "
                     "block)")


def _squeeze_loss(full: onnx.GraphProto, infos: dict[str, TensorInfo], loss_name: str) -> None:
    """A loss of one number kept in a [1] or [1, 1] tensor becomes a scalar, as the runtimes bind it (onnxruntime
    1.17 refuses a 0-d buffer for an output declared [1, 1]): its producer writes a new value, which a Reshape to
    [] makes the loss (in place: ``full`` and ``infos``)."""
    taken = used_names(full)
    kept = fresh_name(f"{loss_name}/kept_dims", taken)
    shape = fresh_name(f"{loss_name}/scalar_shape", taken | {kept})
    producer = next(n for n in full.node if loss_name in n.output)
    producer.output[list(producer.output).index(loss_name)] = kept
    full.initializer.append(onnx.numpy_helper.from_array(np.zeros(0, np.int64), shape))
    full.node.append(helper.make_node("Reshape", [kept, shape], [loss_name], name=f"{loss_name}/to_scalar"))
    infos[kept] = infos[loss_name]
    infos[loss_name] = TensorInfo(infos[kept].elem_type, ())
    infos[shape] = TensorInfo(onnx.TensorProto.INT64, (0,))


def _with_loss_infos(model: onnx.ModelProto, infos: dict[str, TensorInfo], full: onnx.GraphProto,
                     part: _LossPart) -> dict[str, TensorInfo]:
    """The infos of ``full`` (the unchanged forward graph, whose ``infos`` are known, and the loss ``part``):
    shape inference over the loss nodes alone, their forward inputs declared with the types inferred for them
    and their constants included; the same result as over the whole graph again, for a fraction of the time. A
    loss node reading an integer forward value (a shape, whose content inference may have propagated) gets the
    whole graph inferred."""
    made = {o for n in part.nodes for o in n.output} | {i.name for i in part.initializers} | {
        i.name for i in part.labels}
    read = list(dict.fromkeys(x for n in part.nodes for x in node_inputs(n) if x and x not in made))
    constants = {i.name: i for i in full.initializer if i.name in read}
    if any(x not in constants and (x not in infos or not infos[x].is_float) for x in read):
        return infer_tensor_info(_model(model, full, {}))
    graph = helper.make_graph(part.nodes, "loss", [*(value_info(x, infos[x]) for x in read if x not in constants),
                                                   *part.labels], [],
                              initializer=[*constants.values(), *part.initializers])
    return {**infer_tensor_info(_model(model, graph, {})), **infos}


def _rename_value(nodes: list[onnx.NodeProto], old: str, new: str) -> bool:
    """Rename a value that one of ``nodes`` produces, in all of them; False (nothing done) if none does."""
    if not any(old in n.output for n in nodes):
        return False
    rename_values(nodes, {old: new})
    return True


def _warn_unreached(graph: onnx.GraphProto, unreached: list[str]) -> None:
    """Trainable parameters the loss does not depend on (a second head's weights when the loss reads the first
    head): their gradient is zero at every step. Those read by a quantizing op are warned about on their own, and
    here again when no path around it reaches the loss (a QDQ model quantizes its output too)."""
    quantized = set(quantized_away(graph, unreached))
    if quantized:
        stuck = [p for p in unreached if p in quantized]
        warnings.warn(f"{len(stuck)} trainable parameters (e.g. {stuck[:3]}) reach the loss only through quantizing "
                      f"ops: their gradient is zero at every step and they will not train; {QUANTIZED_ADVICE}",
                      stacklevel=4)
    unreached = [p for p in unreached if p not in quantized]
    if unreached:
        warnings.warn(f"{len(unreached)} trainable parameters do not reach the loss (e.g. {unreached[:3]}): their "
                      "gradient is zero at every step (a weight decay still shrinks them); freeze them "
                      "(frozen_params), or make the loss read the outputs they compute (loss_input_names)",
                      stacklevel=4)


def _accumulate(acc: GraphBuilder, grads: dict[str, str | None], params: list[str], infos: dict[str, TensorInfo]):
    """out = reset ? g : buffer + g per parameter, as onnxruntime-training; returns (buffer inputs, outputs,
    {parameter: (g, buffer + g)}: what the runtime selects from once it knows the flag)."""
    grad_inputs, grad_outputs, accumulation = [], [], {}
    for p in params:
        info = infos[p]
        g = grads[p] or acc.zeros_like(p, info.elem_type)
        buf, out = names.grad_buffer_name(p), names.grad_output_name(p)
        accumulated = acc.op.Add(buf, g)
        acc.node("Where", [names.LAZY_RESET_GRAD, g, accumulated], [out])
        accumulation[p] = (g, accumulated)
        grad_inputs.append(helper.make_tensor_value_info(buf, info.elem_type, info.shape))
        grad_outputs.append(helper.make_tensor_value_info(out, info.elem_type, info.shape))
    return grad_inputs, grad_outputs, accumulation


def _buffer_outputs(acc: GraphBuilder, nodes: list[onnx.NodeProto], buffers: list[str],
                    infos: dict[str, TensorInfo], keep: Sequence[str], sizes: dict[str, tuple[str, int]]
                    ) -> tuple[list[onnx.ValueInfoProto], list[onnx.NodeProto]]:
    """Expose the running statistics that training-mode BatchNormalization nodes compute as graph outputs
    (under the runtime's names), updated as torch updates them (:func:`_running_statistics`; ``sizes``: where
    each symbolic size can be read from a user input). Returns the outputs and the training graph's forward
    nodes: ``nodes`` with each such BatchNormalization replaced by the nodes that run in its place (``nodes`` stay
    the eval graph's)."""
    outputs = []
    read: set[str] = set()   # every value a forward node reads, and keep: walked at the first BatchNorm
    forward: list[onnx.NodeProto] = []
    for node in nodes:
        training = node.op_type == "BatchNormalization" and any(a.name == "training_mode" and a.i
                                                                 for a in node.attribute)
        stats = [(k, node.input[k + 2]) for k in (1, 2) if training and node.input[k + 2] in buffers]
        if not stats:
            forward.append(node)
            continue
        outs = list(node.output) + [""] * (3 - len(node.output))
        read = read or {x for n in nodes for x in node_inputs(n)} | set(keep)
        if any(outs[k] and outs[k] in read for k, _ in stats):
            # the model reads a running statistic itself (rare): the node's own update, passed on by an Identity
            for k, buffer in stats:
                if outs[k] and outs[k] in read:
                    acc.node("Identity", [outs[k]], [names.buffer_output_name(buffer)])
                else:
                    outs[k] = names.buffer_output_name(buffer)
            del node.output[:]
            node.output.extend(outs)
            forward.append(node)
        else:
            forward += _running_statistics(acc, node, dict(stats), infos, sizes)
        outputs += [helper.make_tensor_value_info(names.buffer_output_name(b), infos[b].elem_type, infos[b].shape)
                    for _, b in stats]
    return outputs, forward


def _running_statistics(acc: GraphBuilder, node: onnx.NodeProto, stats: dict[int, str],
                        infos: dict[str, TensorInfo], sizes: dict[str, tuple[str, int]]) -> list[onnx.NodeProto]:
    """The running statistics ``stats`` (output index -> buffer) of a training-mode BatchNormalization ``node``
    as torch updates them, under the runtime's buffer output names; returns the nodes to run in the node's place
    (the rest go to ``acc``, after the backward).

    ONNX's BatchNormalization (and onnxruntime's kernel) updates running = m r + (1 - m) s with the batch's mean,
    and for the variance its biased variance b; torch with the unbiased one, b n / (n - 1), n the values per
    channel (at batch 4 of a BatchNorm1d the running variance drifted 10 % from torch's). onnxruntime's kernel
    also writes the updates into its running-statistic inputs' memory, whatever else reads them: bound to the
    checkpoint's buffers, a step whose loss is not finite (skipped) would still overwrite them. So the node reads
    r * 0, computed at every run (zeros from ConstantOfShape were folded into a constant that the kernel then wrote
    into), and gives (1 - m) s; the update m r + (1 - m) s (times n / (n - 1) for the variance) is made on
    per-channel vectors after it. n = 1 (torch refuses it) keeps the biased update rather than dividing by 0."""
    op = acc.op
    dtype = helper.tensor_dtype_to_np_dtype(infos[next(iter(stats.values()))].elem_type)
    momentum = next((a.f for a in node.attribute if a.name == "momentum"), 0.9)
    zero = acc.const(np.array(0, dtype))
    zeros, before = _emitted_apart(acc, lambda: {k: op.Mul(buffer, zero) for k, buffer in stats.items()})
    reading_zeros = onnx.NodeProto()
    reading_zeros.CopyFrom(node)
    del reading_zeros.output[:]
    outs = list(node.output) + [""] * (3 - len(node.output))
    for k in stats:
        reading_zeros.input[k + 2] = zeros[k]
        outs[k] = acc.unique(f"{stats[k]}/batch_share")
    reading_zeros.output.extend(outs)
    m = acc.const(np.array(momentum, dtype))
    for k, buffer in stats.items():
        share = outs[k]
        if k == 2:
            count = _values_per_channel(acc, node.input[0], infos.get(node.input[0]), sizes, before, dtype)
            if isinstance(count, int):
                factor = acc.const(np.array(count / max(count - 1, 1), dtype))
            else:
                one = acc.const(np.array([1], dtype))
                factor = op.Div(count, op.Max(op.Sub(count, one), one))
            share = op.Mul(share, factor)
        acc.node("Add", [op.Mul(buffer, m), share], [names.buffer_output_name(buffer)])
    return [*before, reading_zeros]


def _values_per_channel(acc: GraphBuilder, x: str, info: TensorInfo | None, sizes: dict[str, tuple[str, int]],
                        before: list[onnx.NodeProto], dtype: np.dtype) -> int | str:
    """The number of values per channel of ``x`` (N C D1 D2 ...): an int when static; else computed from the user
    inputs' shapes (``sizes``: symbol -> input and axis), which are alive anyway. Reading ``Size(x)`` in the update
    instead kept every BatchNorm's input alive to the end of the step (MobileNetV2: peak RSS 302 -> 341 MB);
    when a size has no such symbol, Size(x) and Shape(x) are read next to the node (appended to ``before``)."""
    shape = info.shape if info is not None else None
    if shape is not None and all(isinstance(d, int) for d in shape):
        return int(np.prod(shape)) // shape[1]
    op = acc.op
    if shape is not None and all(isinstance(d, int) or d in sizes for d in shape):
        static = int(np.prod([d for k, d in enumerate(shape) if k != 1 and isinstance(d, int)]))
        count = acc.const(np.array([static], np.int64))
        for k, d in enumerate(shape):
            if k != 1 and not isinstance(d, int):
                source, axis = sizes[d]
                count = op.Mul(count, op.Gather(op.Shape(source), acc.ints([axis])))
        return op.Cast(count, to=helper.np_dtype_to_tensor_dtype(dtype))
    count, nodes = _emitted_apart(acc, lambda: op.Cast(op.Div(op.Size(x), op.Gather(op.Shape(x), acc.ints([1]))),
                                                       to=helper.np_dtype_to_tensor_dtype(dtype)))
    before += nodes
    return count


def _emitted_apart(acc: GraphBuilder, build):
    """(what ``build()`` returns, the nodes it emitted into ``acc``), those nodes taken back out of ``acc``: they run
    beside a forward node, not after the backward (``acc``'s names and constants stay its own)."""
    first = len(acc.nodes)
    result = build()
    emitted = acc.nodes[first:]
    del acc.nodes[first:]
    return result, emitted


def _check_reserved_names(graph: onnx.GraphProto, weights: dict[str, np.ndarray], plan: ParameterPlan) -> None:
    """ValueError when a value of the model has a name the training graph gives its own inputs and outputs (the
    reset flag, the gradient buffers and outputs, the updated buffers): the two would be one value."""
    reserved = {names.LAZY_RESET_GRAD: "the flag that restarts gradient accumulation"}
    for p in [*plan.trainable, *plan.inputs]:
        reserved[names.grad_buffer_name(p)] = f"the gradient buffer of {p!r}"
        reserved[names.grad_output_name(p)] = f"the gradient output of {p!r}"
    for b in plan.buffers:
        reserved[names.buffer_output_name(b)] = f"the updated value of the buffer {b!r}"
    taken = {v.name for v in [*graph.input, *graph.output]} | set(weights) | {
        x for n in graph.node for x in [*n.input, *n.output]}
    clash = next((n for n in reserved if n in taken), None)
    if clash is not None:
        raise ValueError(f"the model has a value named {clash!r}, the name the training graph gives "
                         f"{reserved[clash]}: rename it in the model (its inputs, outputs and the nodes that use it)")


def _shape_of(infos: dict, name: str) -> tuple:
    """The inferred shape of ``name``, () when unknown or not a tensor (a sequence or optional input)."""
    info = infos.get(name)
    return tuple(info.shape or ()) if info is not None else ()


def build_graphs(model: onnx.ModelProto, weights: dict[str, np.ndarray], plan: ParameterPlan, loss: Block,
                 loss_input_names: Sequence[str] | None, additional_output_names: Sequence[str] | None,
                 all_outputs_to_loss: bool) -> TrainingGraphs:
    """Assemble the training graph (forward + loss + gradients + accumulation) and the eval graph."""
    graph = model.graph
    _check_reserved_names(graph, weights, plan)
    state = [*plan.trainable, *plan.frozen, *plan.buffers]
    extras = list(additional_output_names or [])
    fwd_model = _model(model, _forward_graph(graph, weights, state), {})
    fwd = fwd_model.graph  # the loss is built on it, in place
    user_inputs = [i for i in fwd.input if i.name not in weights]
    state_inputs = [i for i in fwd.input if i.name in weights]
    infos, corrected = infer_from_inputs(fwd_model)
    if corrected:
        logger.info("%d declared shapes of the model (value infos, outputs) differ from what its inputs give (a "
                    "static size for a dynamic one, another name for a size; e.g. %r): the inputs' are used",
                    len(corrected), next(iter(corrected)))
        redeclare(fwd, corrected)

    output_names = [o.name for o in graph.output]
    loss_inputs = list(loss_input_names or (output_names if all_outputs_to_loss else output_names[:1]))
    for name in [*loss_inputs, *extras]:
        if name not in infos:
            raise ValueError(f"{name!r} is not a value of the model (its outputs are {output_names})")
    part = _add_loss(fwd_model, infos, loss, loss_inputs, weights)
    labels, loss_name = part.labels, part.loss
    extras = list(dict.fromkeys([*part.outputs, *extras]))  # the block's outputs after the loss, then the asked

    full = fwd  # with the loss part
    pooled = PoolBeforeRelu(keep={*output_names, *loss_inputs, *extras})(_model(model, full, {}))
    full = pooled.model.graph
    forward_nodes = _copy_nodes(full.node)  # the gradient rules add outputs to them
    infos = (infer_tensor_info(_model(model, full, {})) if pooled.modified
             else _with_loss_infos(model, infos, full, part))

    _check_loss_typed(infos, part, loss)
    _check_scalar_loss(infos.get(loss_name), loss, loss_inputs[0])
    if infos.get(loss_name) is not None and infos[loss_name].shape:
        _squeeze_loss(full, infos, loss_name)
        forward_nodes = _copy_nodes(full.node)

    full_names = used_names(full)
    constants = constant_values(full)
    gb = GraphBuilder(default_opset(model), taken=full_names, prefix="grad/")
    wrt = [*plan.trainable, *plan.inputs]
    try:
        grads = build_gradients(forward_nodes, loss_name, wrt, gb, infos, constants=constants)
    except UnknownShapeError as exc:
        shapeless = [i.name for i in user_inputs if not i.type.tensor_type.HasField("shape")]
        if not shapeless:
            raise
        raise UnknownShapeError(
            f"{exc}: the model's input {shapeless[0]!r} has no shape, not even a rank; give every input its shape, "
            f"a name for each dynamic dimension, e.g. model.graph.input[k].CopyFrom(onnx.helper."
            f"make_tensor_value_info({shapeless[0]!r}, elem_type, ['N', 3, 'H', 'W']))") from exc
    acc = GraphBuilder(default_opset(model), taken=full_names | {n.name for n in gb.nodes} |
                       {o for n in gb.nodes for o in n.output}, prefix="acc/")
    grad_inputs, grad_outputs, accumulation = _accumulate(acc, grads, wrt, infos)
    _warn_unreached(graph, [p for p in plan.trainable if grads.get(p) is None])
    sizes = {d: (i.name, axis) for i in reversed(user_inputs) for axis, d in enumerate(_shape_of(infos, i.name))
             if isinstance(d, str)}   # a symbol -> a user input's axis of that size
    buffer_outputs, train_forward = _buffer_outputs(acc, forward_nodes, plan.buffers, infos, extras, sizes)

    extra_outputs = [value_info(n, infos.get(n)) for n in extras]
    loss_vi = value_info(loss_name, infos.get(loss_name))
    outputs = [loss_vi, *extra_outputs, *grad_outputs, *buffer_outputs]
    train_nodes, train_reads = _prune([*train_forward, *gb.nodes, *acc.nodes], [o.name for o in outputs])
    train_graph = helper.make_graph(
        train_nodes, "training",
        [*user_inputs, *labels, *state_inputs, *grad_inputs,
         helper.make_tensor_value_info(names.LAZY_RESET_GRAD, onnx.TensorProto.BOOL, [])],
        outputs, initializer=_used([*full.initializer, *gb.initializers, *acc.initializers], train_reads))
    meta = TrainingMeta(
        user_inputs=[i.name for i in user_inputs], labels=[i.name for i in labels], loss=loss_name,
        additional_outputs=list(extras), trainable=list(plan.trainable), frozen=list(plan.frozen),
        buffers=list(plan.buffers), model_outputs=list(output_names), accumulation=accumulation,
        loss_reduction=loss.batch_reduction, loss_type=_builtin_loss_name(loss),
        size_limits=[asdict(limit) for limit in size_limits(full, infos, constants)
                     if limit.input in {i.name for i in user_inputs}],
    ).to_props()
    training = _model(model, train_graph, meta)
    declare_class_scores(training, infos)

    # The forward's other outputs stay computable (not as graph outputs: onnxruntime drops their nodes when it
    # evaluates) so that an inference model can be exported with them, e.g. softmax probabilities beside the
    # logits a loss reads.
    eval_nodes, eval_reads = _prune(forward_nodes, [loss_name, *extras, *output_names])
    eval_graph = helper.make_graph(eval_nodes, "eval", [*user_inputs, *labels, *state_inputs],
                                   [loss_vi, *extra_outputs], initializer=_used(full.initializer, eval_reads))
    eval_model = _model(model, eval_graph, meta)
    declare_class_scores(eval_model, infos)
    eval_passes = PassManager([EvalMode(), DropUnreadIndices()])(eval_model)
    return TrainingGraphs(training, eval_passes.model, [i.name for i in user_inputs], [i.name for i in labels],
                          eval_checked=eval_passes.modified, infos=infos)


def _copy_nodes(nodes) -> list[onnx.NodeProto]:
    """Copies of ``nodes``, made in one protobuf call (a deepcopy per node costs several times more)."""
    holder = onnx.GraphProto()
    holder.node.extend(nodes)
    return list(holder.node)


def _prune(nodes: list[onnx.NodeProto], outputs: list[str]) -> tuple[list[onnx.NodeProto], set[str]]:
    """``prune_nodes(nodes, outputs)`` and every value the kept nodes read, found in the same walk."""
    needed = set(outputs)
    needed.discard("")
    kept, read = [], set()
    for node in reversed(nodes):
        if not needed.isdisjoint(node.output):
            kept.append(node)
            xs = node_inputs(node)
            needed.update(xs)
            read.update(xs)
            needed.discard("")
    kept.reverse()
    return kept, read


def _used(initializers, read: set[str]) -> list[onnx.TensorProto]:
    """The ``initializers`` among the values ``read``, each name once."""
    seen, out = set(), []
    for init in initializers:
        if init.name in read and init.name not in seen:
            seen.add(init.name)
            out.append(init)
    return out
