"""Build the training and eval graphs from the forward graph, a loss block and a parameter plan."""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from onnxtrain import conventions as names
from onnxtrain.artifacts.params import ParameterPlan
from onnxtrain.autodiff import build_gradients
from onnxtrain.blocks.base import Block, BuildContext, building
from onnxtrain.ir.builder import GraphBuilder
from onnxtrain.ir.passes import constant_values, default_opset, node_inputs, prune_nodes, rename_values, used_names
from onnxtrain.ir.types import TensorInfo, infer_tensor_info

__all__ = ["TrainingGraphs", "build_graphs"]


@dataclass
class TrainingGraphs:
    training: onnx.ModelProto
    eval: onnx.ModelProto
    user_inputs: list[str]
    label_inputs: list[str]


def _value_info(name: str, info: TensorInfo | None) -> onnx.ValueInfoProto:
    if info is None:
        return helper.make_tensor_value_info(name, onnx.TensorProto.UNDEFINED, None)
    return helper.make_tensor_value_info(name, info.elem_type, info.shape)


def _model(template: onnx.ModelProto, graph: onnx.GraphProto, meta: dict) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[op for op in template.opset_import if op.domain in ("", "ai.onnx")],
                              producer_name="onnxtrain")
    model.ir_version = max(template.ir_version, 8)
    for key, value in meta.items():
        model.metadata_props.add(key=key, value=value)
    return model


def _to_eval_mode(nodes: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """Dropout off, BatchNormalization on running statistics (and without its training-only outputs)."""
    out = []
    for node in nodes:
        node = copy.deepcopy(node)
        if node.op_type == "BatchNormalization":
            for a in node.attribute:
                if a.name == "training_mode":
                    a.i = 0
            del node.output[1:]
        elif node.op_type == "Dropout":
            if len(node.input) > 2:
                node.input[2] = ""  # training_mode off; the slot stays, as in the peer's eval model
            del node.output[1:]
        out.append(node)
    return out


def _pool_before_relu(nodes: list[onnx.NodeProto], keep: set[str], taken: set[str]) -> list[onnx.NodeProto]:
    """MaxPool(Relu(x)) -> Relu(MaxPool(x)) where the Relu feeds only the pool: the same values (Relu is
    monotone), the same gradients (a window's first maximum is the same element, and a window whose maximum
    is <= 0 gets no gradient either way), and the Relu and its gradient mask run on the pooled, smaller tensor
    (a quarter of the elements for 2x2 pools)."""
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in nodes:
        for x in set(node_inputs(n)):
            consumers.setdefault(x, []).append(n)
    swapped: dict[int, list[onnx.NodeProto]] = {}
    dropped: set[int] = set()
    for relu in nodes:
        if relu.op_type != "Relu" or relu.output[0] in keep:
            continue
        readers = consumers.get(relu.output[0], [])
        if len(readers) != 1 or readers[0].op_type != "MaxPool" or len([o for o in readers[0].output if o]) != 1:
            continue
        pool = readers[0]
        pooled = f"{pool.output[0]}/before_relu"
        while pooled in taken:
            pooled += "_"
        taken.add(pooled)
        early = copy.deepcopy(pool)
        early.input[0], early.output[0] = relu.input[0], pooled
        late = helper.make_node("Relu", [pooled], [pool.output[0]], name=f"{relu.name or 'Relu'}/after_pool")
        swapped[id(pool)] = [early, late]
        dropped.add(id(relu))
    out = []
    for n in nodes:
        if id(n) not in dropped:
            out.extend(swapped.get(id(n), [n]))
    return out


def _drop_unread_indices(nodes: list[onnx.NodeProto], outputs: list[str]) -> list[onnx.NodeProto]:
    """MaxPool without the Indices output the gradient asked for, where nothing else reads it (onnxruntime
    then runs its faster indices-free kernel). The nodes are _to_eval_mode's copies."""
    read = {x for n in nodes for x in node_inputs(n)} | set(outputs)
    for node in nodes:
        if node.op_type == "MaxPool" and len(node.output) > 1 and node.output[1] not in read:
            del node.output[1:]
    return nodes


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


def _add_loss(model: onnx.ModelProto, fwd: onnx.GraphProto, infos: dict[str, TensorInfo], loss: Block,
              loss_inputs: list[str]) -> tuple[GraphBuilder, list[onnx.ValueInfoProto], str]:
    """Let the loss block build its nodes on the forward graph: (their builder, new label inputs, loss name)."""
    lb = GraphBuilder(default_opset(model), taken=used_names(fwd))

    def reinfer(ctx: BuildContext) -> dict[str, TensorInfo]:  # types of values the blocks made so far
        partial = copy.deepcopy(fwd)
        partial.node.extend(ctx.builder.nodes)
        partial.input.extend(ctx.new_inputs)
        partial.initializer.extend(ctx.builder.initializers)
        return infer_tensor_info(_model(model, partial, {}))

    bctx = BuildContext(lb, dict(infos), reinfer=reinfer)
    with building(bctx):
        loss_out = loss(*loss_inputs)
    if not isinstance(loss_out, str):
        raise TypeError(f"the loss block {type(loss).__name__} must return one value name, got {loss_out!r}")
    loss_name = lb.unique("loss")
    if not _rename_value(lb.nodes, loss_out, loss_name):  # the loss node writes the output itself
        lb.node("Identity", [loss_out], [loss_name])
    return lb, list(bctx.new_inputs), loss_name


def _rename_value(nodes: list[onnx.NodeProto], old: str, new: str) -> bool:
    """Rename a value that one of ``nodes`` produces, in all of them; False (nothing done) if none does."""
    if not any(old in n.output for n in nodes):
        return False
    rename_values(nodes, {old: new})
    return True


def _accumulate(acc: GraphBuilder, grads: dict[str, str | None], params: list[str], infos: dict[str, TensorInfo]):
    """out = reset ? g : buffer + g per parameter, as onnxruntime-training; returns (buffer inputs, outputs)."""
    grad_inputs, grad_outputs = [], []
    for p in params:
        info = infos[p]
        g = grads[p] or acc.zeros_like(p, info.elem_type)
        buf, out = names.grad_buffer_name(p), names.grad_output_name(p)
        acc.node("Where", [names.LAZY_RESET_GRAD, g, acc.op.Add(buf, g)], [out])
        grad_inputs.append(helper.make_tensor_value_info(buf, info.elem_type, info.shape))
        grad_outputs.append(helper.make_tensor_value_info(out, info.elem_type, info.shape))
    return grad_inputs, grad_outputs


def _buffer_outputs(acc: GraphBuilder, nodes: list[onnx.NodeProto], buffers: list[str],
                    infos: dict[str, TensorInfo], keep: Sequence[str]) -> list[onnx.ValueInfoProto]:
    """Expose the running statistics that training-mode BatchNormalization nodes compute as graph outputs
    (under the runtime's names; a value the model itself reads, or ``keep``, is passed on by an Identity)."""
    outputs = []
    read: set[str] = set()
    for node in nodes:
        if node.op_type != "BatchNormalization" or not any(a.name == "training_mode" and a.i for a in node.attribute):
            continue
        outs = list(node.output) + [""] * (3 - len(node.output))
        for k, buffer in ((1, node.input[3]), (2, node.input[4])):
            if buffer in buffers:
                if outs[k] and not read:
                    read = {x for n in nodes for x in node_inputs(n)} | set(keep)
                if outs[k] and outs[k] in read:
                    acc.node("Identity", [outs[k]], [names.buffer_output_name(buffer)])
                else:
                    outs[k] = names.buffer_output_name(buffer)
                outputs.append(helper.make_tensor_value_info(names.buffer_output_name(buffer),
                                                             infos[buffer].elem_type, infos[buffer].shape))
        del node.output[:]
        node.output.extend(outs)
    return outputs


def build_graphs(model: onnx.ModelProto, weights: dict[str, np.ndarray], plan: ParameterPlan, loss: Block,
                 loss_input_names: Sequence[str] | None, additional_output_names: Sequence[str] | None,
                 all_outputs_to_loss: bool) -> TrainingGraphs:
    """Assemble the training graph (forward + loss + gradients + accumulation) and the eval graph."""
    graph = model.graph
    state = [*plan.trainable, *plan.frozen, *plan.buffers]
    extras = list(additional_output_names or [])
    fwd = _forward_graph(graph, weights, state)
    user_inputs = [i for i in fwd.input if i.name not in weights]
    state_inputs = [i for i in fwd.input if i.name in weights]
    infos = infer_tensor_info(_model(model, fwd, {}))

    output_names = [o.name for o in graph.output]
    loss_inputs = list(loss_input_names or (output_names if all_outputs_to_loss else output_names[:1]))
    for name in [*loss_inputs, *extras]:
        if name not in infos:
            raise ValueError(f"{name!r} is not a value of the model (its outputs are {output_names})")
    lb, labels, loss_name = _add_loss(model, fwd, infos, loss, loss_inputs)

    forward_nodes = _pool_before_relu([copy.deepcopy(n) for n in fwd.node] + lb.nodes,
                                      keep={*output_names, *loss_inputs, *extras}, taken=used_names(fwd))
    full = copy.deepcopy(fwd)
    del full.node[:]
    full.node.extend(forward_nodes)
    full.input.extend(labels)
    full.initializer.extend(lb.initializers)
    infos = infer_tensor_info(_model(model, full, {}))

    gb = GraphBuilder(default_opset(model), taken=used_names(full), prefix="grad/")
    wrt = [*plan.trainable, *plan.inputs]
    grads = build_gradients(forward_nodes, loss_name, wrt, gb, infos, constants=constant_values(full))
    acc = GraphBuilder(default_opset(model), taken=used_names(full) | {n.name for n in gb.nodes} |
                       {o for n in gb.nodes for o in n.output}, prefix="acc/")
    grad_inputs, grad_outputs = _accumulate(acc, grads, wrt, infos)
    buffer_outputs = _buffer_outputs(acc, forward_nodes, plan.buffers, infos, extras)

    extra_outputs = [_value_info(n, infos.get(n)) for n in extras]
    loss_vi = _value_info(loss_name, infos.get(loss_name))
    outputs = [loss_vi, *extra_outputs, *grad_outputs, *buffer_outputs]
    train_nodes = prune_nodes([*forward_nodes, *gb.nodes, *acc.nodes], [o.name for o in outputs])
    train_graph = helper.make_graph(
        train_nodes, "training",
        [*user_inputs, *labels, *state_inputs, *grad_inputs,
         helper.make_tensor_value_info(names.LAZY_RESET_GRAD, onnx.TensorProto.BOOL, [])],
        outputs, initializer=_used([*full.initializer, *gb.initializers, *acc.initializers], train_nodes))
    meta = json.dumps({
        "user_inputs": [i.name for i in user_inputs], "labels": [i.name for i in labels], "loss": loss_name,
        "additional_outputs": extras, "trainable": plan.trainable, "frozen": plan.frozen, "buffers": plan.buffers,
        "model_outputs": output_names,
    })
    training = _model(model, train_graph, {names.TRAINING_META: meta})

    eval_nodes = _drop_unread_indices(prune_nodes(_to_eval_mode(forward_nodes), [loss_name, *extras]),
                                      [loss_name, *extras])
    eval_graph = helper.make_graph(eval_nodes, "eval", [*user_inputs, *labels, *state_inputs],
                                   [loss_vi, *extra_outputs], initializer=_used(full.initializer, eval_nodes))
    evaluation = _model(model, eval_graph, {names.TRAINING_META: meta})
    return TrainingGraphs(training, evaluation, [i.name for i in user_inputs], [i.name for i in labels])


def _used(initializers, nodes) -> list[onnx.TensorProto]:
    consumed = {x for n in nodes for x in node_inputs(n)}
    seen, out = set(), []
    for init in initializers:
        if init.name in consumed and init.name not in seen:
            seen.add(init.name)
            out.append(init)
    return out

