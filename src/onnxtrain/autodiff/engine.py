"""Reverse-mode differentiation of an ONNX graph into more ONNX nodes.

The sweep visits, in reverse topological order, only the nodes that lie on a path from a parameter to the
loss, asks each op's rule for its input gradients and sums the contributions of values used more than once.
"""

from __future__ import annotations

import warnings
from collections import deque
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import onnx

from onnxtrain.autodiff.context import GradContext
from onnxtrain.autodiff.registry import NON_DIFFERENTIABLE, lookup
from onnxtrain.errors import UnsupportedOpError
from onnxtrain.ir.builder import GraphBuilder
from onnxtrain.ir.passes import implicit_inputs, node_inputs
from onnxtrain.ir.types import TensorInfo, np_dtype

__all__ = ["build_gradients", "vjp", "node_inputs", "implicit_inputs"]


def _forward_reachable(nodes: Sequence[onnx.NodeProto], sources: set[str]) -> tuple[set[str], set[int]]:
    values, reached = set(sources), set()
    for i, n in enumerate(nodes):
        if any(x in values for x in node_inputs(n) if x):
            reached.add(i)
            values.update(o for o in n.output if o)
    return values, reached


def _backward_reachable(nodes: Sequence[onnx.NodeProto], targets: Iterable[str]) -> set[int]:
    needed, reached = set(targets), set()
    for i in range(len(nodes) - 1, -1, -1):
        n = nodes[i]
        if any(o in needed for o in n.output if o):
            reached.add(i)
            needed.update(x for x in node_inputs(n) if x)
    return reached


def _path_to(nodes: Sequence[onnx.NodeProto], params: Sequence[str], node_index: int) -> str:
    """A readable chain of nodes from some parameter to ``nodes[node_index]`` (for error messages)."""
    producer = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    chain, frontier, seen = [], deque([node_index]), {node_index}
    parent: dict[int, int | str] = {}
    while frontier:
        i = frontier.popleft()
        for x in node_inputs(nodes[i]):
            if x in params:
                chain = [x]
                j: int | str = i
                while isinstance(j, int):
                    chain.append(f"{nodes[j].op_type}({nodes[j].name or nodes[j].output[0]})")
                    j = parent.get(j, "")
                return " -> ".join(chain)
            p = producer.get(x)
            if p is not None and p not in seen:
                seen.add(p)
                parent[p] = i
                frontier.append(p)
    return "?"


def _may_be_float(infos: dict[str, TensorInfo], name: str) -> bool:
    """Integer and boolean values (indices, shapes, masks) never carry a gradient."""
    info = infos.get(name)
    return info is None or info.is_float or info.elem_type == onnx.TensorProto.UNDEFINED


def build_gradients(nodes: list[onnx.NodeProto], loss: str, params: Sequence[str], builder: GraphBuilder,
                    infos: dict[str, TensorInfo], constants: dict[str, np.ndarray] | None = None,
                    seed: str | None = None) -> dict[str, str | None]:
    """Append to ``builder`` the nodes computing d(loss)/d(param) for each of ``params``.

    Args:
        nodes: the forward nodes in topological order. Rules may add optional outputs to them (a Dropout
            mask, MaxPool indices), so they are modified in place.
        loss: name of the value to differentiate (a scalar, or seeded with ones of its shape).
        params: names of the values to differentiate with respect to.
        builder: receives the gradient nodes.
        infos: element types and shapes of the forward values.
        constants: values of constant inputs (rules read axes, shapes, ... from them).
        seed: name of the gradient of ``loss``; ones when omitted.

    Returns:
        param name -> gradient name, or None for a parameter the loss does not depend on.
    """
    constants, infos = _fold(nodes, builder.opset, constants or {}, infos)
    if seed is None:
        loss_info = infos.get(loss)
        if loss_info is not None and loss_info.rank == 0:
            seed = builder.const(np.ones((), dtype=np_dtype(loss_info.elem_type)), name="loss_grad_seed")
        else:
            seed = builder.ones_like(loss, loss_info.elem_type if loss_info else onnx.TensorProto.FLOAT)
    return vjp(nodes, {loss: seed}, params, builder, infos, constants)


def _fold(nodes: list[onnx.NodeProto], opset: int, constants: dict[str, np.ndarray],
          infos: dict[str, TensorInfo]) -> tuple[dict[str, np.ndarray], dict[str, TensorInfo]]:
    """Fold the constant subgraphs exporters compute axes, scales and shapes with (a Concat of Constants),
    so that rules can read them, and refine the shapes with them (a Resize whose scales are such a Concat)."""
    from onnxtrain.autodiff.folding import fold_constants, infer_infos  # folding reads the engine's helpers

    folded = fold_constants(nodes, infos, opset, constants)
    if not folded:
        return constants, infos
    constants = {**constants, **folded}
    refined = dict(infos)
    for name, info in infer_infos(nodes, infos, opset, constants).items():
        if _knows_more(info, infos.get(name)):
            refined[name] = info
    return constants, refined


def _knows_more(new: TensorInfo, old: TensorInfo | None) -> bool:
    """Whether ``new`` fixes more dimensions than ``old`` (a Pad whose folded pads give the spatial sizes while the
    batch stays symbolic)."""
    if old is None or old.shape is None:
        return new.shape is not None
    if new.shape is None or len(new.shape) != len(old.shape):
        return False
    return sum(isinstance(d, int) for d in new.shape) > sum(isinstance(d, int) for d in old.shape)


def vjp(nodes: list[onnx.NodeProto], seeds: Mapping[str, str], params: Sequence[str], builder: GraphBuilder,
        infos: dict[str, TensorInfo], constants: dict[str, np.ndarray] | None = None) -> dict[str, str | None]:
    """The vector-Jacobian product: append the nodes computing sum_k seeds[y_k] . d(y_k)/d(param) for each param.

    ``seeds`` maps values of ``nodes`` to the names of their gradients; :func:`build_gradients` is the case of
    one loss. Rules use this to differentiate a small graph of their own (a function body, an If branch).
    """
    constants = constants or {}
    param_set = set(params)
    _, forward = _forward_reachable(nodes, param_set)
    backward = _backward_reachable(nodes, seeds)
    differentiable_values, _ = _forward_reachable([nodes[i] for i in sorted(forward & backward)], param_set)

    # A value's gradient is a running sum, added to as soon as each contribution exists: a Sum of all of them at
    # the end would keep every contribution alive until then, and onnxruntime's Sum of more than two inputs
    # allocates a full-size temporary besides.
    gradients: dict[str, str] = dict(seeds)

    def contribute(name: str, g: str) -> None:
        gradients[name] = builder.op.Add(gradients[name], g) if name in gradients else g

    def gradient_of(name: str) -> str | None:
        return gradients.get(name)

    for i in sorted(forward & backward, reverse=True):
        node = nodes[i]
        dy = [gradient_of(o) if o else None for o in node.output]
        if all(g is None for g in dy):
            continue
        inputs = node_inputs(node)
        reached = [bool(x) and x in differentiable_values and _may_be_float(infos, x) for x in inputs]
        if not any(reached):
            continue  # it reads the parameters only through integers (a quantized value): no gradient flows back
        rule = lookup(node, builder.opset)
        if rule is None:
            raise UnsupportedOpError(
                f"no gradient rule for op {node.op_type!r} (domain {node.domain or 'ai.onnx'!r}) at node "
                f"{node.name!r}, on the path {_path_to(nodes, params, i)} -> loss, and the ONNX spec defines no "
                f"function body for it at opset {builder.opset}. Freeze the parameters before it (frozen_params "
                f"or trainable_ops) or register a rule with onnxtrain.autodiff.register({node.op_type!r})")
        ctx = GradContext(node, dy, builder, infos, constants)
        dxs = list(rule(ctx))
        if any(dx is not None for dx in dxs[len(inputs):]):   # rules may omit or pad trailing Nones
            raise ValueError(f"the gradient rule of {node.op_type} returned {len(dxs)} gradients for node "
                             f"{node.name!r}, expected one per input ({len(inputs)}; None for no gradient)")
        if len(dxs) < len(inputs):
            dxs += [None] * (len(inputs) - len(dxs))
        for position, (x, dx, needed) in enumerate(zip(inputs, dxs, reached)):
            if needed and dx is not None:
                contribute(x, dx)
            elif needed and node.op_type not in NON_DIFFERENTIABLE:
                _warn_dropped(node, position, x, _path_to(nodes, params, i))
    return {p: gradient_of(p) for p in params}


def _warn_dropped(node: onnx.NodeProto, position: int, value: str, path: str) -> None:
    """A trainable parameter reaches ``value``, input ``position`` of ``node``, whose rule gives that input no
    gradient (a setting such as a Resize's scales or a Dropout's ratio): what flows through it is not trained."""
    warnings.warn(f"no gradient through input {position} ({value!r}) of {node.op_type} node {node.name!r}, which "
                  f"is computed from trainable parameters (path {path}): that dependence is not trained (its "
                  f"gradient is taken as zero)", stacklevel=4)
