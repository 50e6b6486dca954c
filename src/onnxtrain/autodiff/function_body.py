"""The fallback for ops without a rule: expand the function body the ONNX spec defines, and differentiate that.

Many ops are defined by the spec as a small graph of other ops (``ReduceL2`` is ``Sqrt(ReduceSum(x * x))``,
``MeanVarianceNormalization``, ``Attention``, ``CenterCropPad``, ...), like ``onnx.reference``'s ``load_op``
runs an op without an implementation. The engine calls :func:`function_body_rule` when an op has no
registered rule. The body is recomputed in the gradient graph (the forward keeps the fused op), so the
fallback costs one more forward of that op; a hand-written rule is still better for hot ops.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
from onnx import defs, helper

from onnxtrain.autodiff.context import GradContext
from onnxtrain.autodiff.registry import Rule, register_fallback
from onnxtrain.autodiff.subgraph import differentiate, infer_infos, inline_constant_ifs
from onnxtrain.ir.passes import clone
from onnxtrain.ir.types import TensorInfo

__all__ = ["differentiate_function_body", "expand_function", "function_body_rule", "has_function_body"]


def _schema(op_type: str, opset: int) -> defs.OpSchema | None:
    try:
        return defs.get_schema(op_type, opset, "")
    except defs.SchemaError:
        return None


def has_function_body(op_type: str, opset: int) -> bool:
    """Whether the spec defines ``op_type`` (as of ``opset``) by a function body, plain or context-dependent."""
    schema = _schema(op_type, opset)
    if schema is None:
        return False
    versions = [*schema.function_opset_versions, *schema.context_dependent_function_opset_versions]
    return any(v <= opset for v in versions)


def function_body_rule(node: onnx.NodeProto, opset: int) -> Rule | None:
    """The fallback rule for ``node`` if the spec defines its op by a function body, else None."""
    return differentiate_function_body if has_function_body(node.op_type, opset) else None


register_fallback(function_body_rule)


def _with_defaults(node: onnx.NodeProto, schema: defs.OpSchema) -> onnx.NodeProto:
    full = clone(node)
    present = {a.name for a in node.attribute}
    for name, attr in schema.attributes.items():
        if name not in present and attr.default_value.type != onnx.AttributeProto.UNDEFINED:
            default = clone(attr.default_value)
            default.name = name
            full.attribute.append(default)
    return full


def _function_proto(node: onnx.NodeProto, schema: defs.OpSchema, opset: int,
                    infos: Mapping[str, TensorInfo]) -> onnx.FunctionProto | None:
    fn = onnx.FunctionProto()
    plain = [v for v in schema.function_opset_versions if v <= opset]
    if plain:
        fn.ParseFromString(schema.get_function_with_opset_version(max(plain)))
        return fn
    dependent = [v for v in schema.context_dependent_function_opset_versions if v <= opset]
    if not dependent:
        return None
    types = []
    for x in node.input:
        info = infos.get(x) if x else None
        types.append(helper.make_tensor_type_proto(info.elem_type, info.shape).SerializeToString() if info
                     else onnx.TypeProto().SerializeToString())
    data = schema.get_context_dependent_function_with_opset_version(max(dependent), node.SerializeToString(), types)
    if not data:
        return None
    fn.ParseFromString(data)
    return fn


def expand_function(node: onnx.NodeProto, opset: int, infos: Mapping[str, TensorInfo],
                    prefix: str) -> tuple[list[onnx.NodeProto], list[str]] | None:
    """The nodes of ``node``'s function body and the names of its outputs, or None without a body.

    The body reads the node's inputs; every value it defines, outputs included, is renamed with ``prefix``
    (so the forward node and its outputs stay as they are).
    """
    schema = _schema(node.op_type, opset)
    if schema is None:
        return None
    node = _with_defaults(node, schema)
    fn = _function_proto(node, schema, opset, infos)
    if fn is None:
        return None
    if any(o.domain not in ("", "ai.onnx") for o in fn.opset_import):
        return None
    attrs = {a.name: a for a in node.attribute}
    names = {formal: (node.input[i] if i < len(node.input) else "") for i, formal in enumerate(fn.input)}

    def rename(name: str) -> str:
        if not name:
            return ""
        if name not in names:
            names[name] = prefix + name
        return names[name]

    body = [_renamed(n, rename, attrs) for n in fn.node]
    for i, n in enumerate(body):       # node names must be unique too
        n.name = f"{prefix}{i}_{n.op_type}"
    return body, [rename(o) for o in fn.output]


def _renamed(node: onnx.NodeProto, rename, attrs: Mapping[str, onnx.AttributeProto]) -> onnx.NodeProto:
    out = clone(node)
    del out.input[:], out.output[:], out.attribute[:]
    out.input.extend(rename(x) for x in node.input)
    out.output.extend(rename(y) for y in node.output)
    for attr in node.attribute:
        if attr.ref_attr_name:
            if attr.ref_attr_name not in attrs:
                continue                                        # an optional attribute the node leaves unset
            new = clone(attrs[attr.ref_attr_name])
            new.name = attr.name
        else:
            new = clone(attr)
            for g in [new.g] if new.type == onnx.AttributeProto.GRAPH else list(new.graphs):
                for v in [*g.input, *g.output, *g.initializer]:
                    v.name = rename(v.name)
                renamed = [_renamed(n, rename, attrs) for n in g.node]
                del g.node[:]
                g.node.extend(renamed)
        out.attribute.append(new)
    return out


def _scalar_range_bounds(body: list[onnx.NodeProto], prefix: str) -> list[onnx.NodeProto]:
    """Reshape every Range bound to a scalar. Some bodies (AffineGrid's) pass 1-element vectors, which
    onnxruntime accepts only while an If hides their shape, and inlining the If uncovers it."""
    out, scalar, done = [], prefix + "scalar_shape", set()
    for n in body:
        if n.op_type == "Range":
            for x in n.input:
                if x not in done:
                    done.add(x)
                    out.append(helper.make_node("Reshape", [x, scalar], [f"{x}_scalar"], name=f"{x}_to_scalar"))
            n = helper.make_node("Range", [f"{x}_scalar" for x in n.input], list(n.output), name=n.name)
        out.append(n)
    if done:
        out.insert(0, helper.make_node("Constant", [], [scalar], name=scalar,
                                       value=onnx.numpy_helper.from_array(np.zeros(0, dtype=np.int64))))
    return out


def _axisless_squeeze(node: onnx.NodeProto) -> bool:
    return node.op_type == "Squeeze" and len(node.input) < 2 and not node.attribute


def _squeeze_axes(body: list[onnx.NodeProto], ctx: GradContext) -> list[onnx.NodeProto]:
    """Give every Squeeze without axes the axes of its input's static 1s. AffineGrid's body squeezes theta's
    (N, 1, 3) rows that way: with N unknown, inference lost their rank (no gradient graph), and a batch of 1 would be
    squeezed too, where onnxruntime's AffineGrid kernel keeps it."""
    if ctx.b.opset < 13 or not any(map(_axisless_squeeze, body)):
        return body  # before opset 13 the axes are an attribute
    infos = {**ctx.infos, **infer_infos(body, ctx.infos, ctx.b.opset, ctx.constants)}
    out = []
    for n in body:
        info = infos.get(n.input[0]) if _axisless_squeeze(n) else None
        ones = [k for k, d in enumerate(info.shape) if d == 1] if info is not None and info.shape is not None else []
        if ones:
            axes = f"{n.output[0]}_axes"
            out.append(helper.make_node("Constant", [], [axes], name=axes,
                                        value=onnx.numpy_helper.from_array(np.array(ones, dtype=np.int64))))
            n = helper.make_node("Squeeze", [n.input[0], axes], list(n.output), name=n.name)
        out.append(n)
    return out


def differentiate_function_body(ctx: GradContext) -> list[str | None]:
    """The rule of an op without one: recompute the op from its function body and differentiate the body."""
    prefix = ctx.b.unique(f"{ctx.node.name or ctx.node.op_type}_body") + "/"
    expanded = expand_function(ctx.node, ctx.b.opset, ctx.infos, prefix)
    if expanded is None:  # pragma: no cover - function_body_rule checked that a body exists
        raise ValueError(f"{ctx.node.op_type} node {ctx.node.name!r}: the spec's function body could not be built")
    body, outputs = expanded
    if any(n.op_type == "If" for n in body):   # a path picked by shape: keep only the taken branch
        body = _scalar_range_bounds(inline_constant_ifs(body, ctx.infos, ctx.b.opset, ctx.constants), prefix)
    body = _squeeze_axes(body, ctx)
    ctx.b.nodes.extend(body)
    wrt = [x for x in ctx.x if x and ctx.is_float(x)]
    grads = differentiate(ctx, body, dict(zip(outputs, ctx.dy)), wrt)
    seen: set[str] = set()
    result = []
    for x in ctx.x:          # an input used twice gets its total gradient once
        result.append(grads.get(x) if x and x not in seen else None)
        seen.add(x)
    return result
