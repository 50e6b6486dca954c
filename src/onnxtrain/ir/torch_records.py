"""What torch's dynamo exporter records on each node: the torch call it came from and the module scopes.

``torch.onnx.export(dynamo=True)`` writes, in each node's ``metadata_props``, the FX node it was made from
(``pkg.torch.onnx.fx_node``: ``%linear : ... = call_function[target=torch.ops.aten.linear.default](args = (%x,
%p_fc_weight, %p_fc_bias), kwargs = {})``, parameters as ``%p_<name>``, buffers as ``%b_<name>``) and the module
scopes it ran in (``pkg.torch.onnx.name_scopes``). artifacts/torch_names.py gives parameters their torch names back
from them; gradient rules read the arguments the ONNX op dropped (an embedding's ``padding_idx``).
"""

from __future__ import annotations

import ast
import dataclasses
import re

import onnx

__all__ = ["FX_NODE", "NAME_SCOPES", "FxCall", "fx_call", "embedding_padding_index",
           "embedding_scales_by_frequency", "is_detach", "fx_output", "DETACH_TARGET"]

FX_NODE = "pkg.torch.onnx.fx_node"
NAME_SCOPES = "pkg.torch.onnx.name_scopes"

_CALL = re.compile(r"target=([\w.]+)\]\(args = \((.*)\), kwargs = ")


@dataclasses.dataclass(frozen=True)
class FxCall:
    """The torch call a node was exported from: ``aten.linear`` and its arguments (``%``-names, or None)."""

    target: str
    args: tuple[str | None, ...]     # the %-names, None for literals
    scopes: tuple[str, ...]          # module paths, outermost first ('' is the root module)
    texts: tuple[str, ...] = ()      # every argument as written


def fx_call(node: onnx.NodeProto) -> FxCall | None:
    """The torch call recorded on ``node`` by the dynamo exporter, or None."""
    record = next((p.value for p in node.metadata_props if p.key == FX_NODE), None)
    found = _CALL.search(record) if record is not None else None
    if found is None:
        return None
    meta = {p.key: p.value for p in node.metadata_props}
    target = found.group(1).removeprefix("torch.ops.")
    target = target.rsplit(".", 1)[0] if target.count(".") >= 2 else target     # aten.linear.default
    try:
        scopes = tuple(s for s in ast.literal_eval(meta.get(NAME_SCOPES, "[]"))[:-1] if isinstance(s, str))
    except (ValueError, SyntaxError):
        scopes = ()
    texts = tuple(_split_arguments(found.group(2)))
    return FxCall(target, tuple(_argument(a) for a in texts), scopes, texts)


def _split_arguments(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _argument(text: str) -> str | None:
    return text[1:] if re.fullmatch(r"%\w+", text) else None


def embedding_padding_index(node: onnx.NodeProto) -> int | None:
    """The ``padding_idx`` of the ``torch.nn.Embedding`` a Gather was exported from (the row torch never
    updates), or None: no record, or no padding index (-1)."""
    call = fx_call(node)
    if call is None or call.target != "aten.embedding" or len(call.texts) < 3:
        return None
    try:
        index = int(call.texts[2])
    except ValueError:
        return None
    return index if index >= 0 else None


def embedding_scales_by_frequency(node: onnx.NodeProto) -> bool:
    """Whether the ``torch.nn.Embedding`` a Gather was exported from has ``scale_grad_by_freq=True`` (its gradient
    divides each looked-up row's share by how often the index occurs in the batch); False without a record."""
    call = fx_call(node)
    return call is not None and call.target == "aten.embedding" and len(call.texts) > 3 and call.texts[3] == "True"


def is_detach(node: onnx.NodeProto) -> bool:
    """Whether ``node`` is a ``tensor.detach()`` of the torch model (the dynamo exporter writes it as an Identity):
    torch passes no gradient through it."""
    call = fx_call(node)
    return call is not None and call.target in ("aten.detach", "aten.detach_")


DETACH_TARGET = "torch.ops.aten.detach.default"
_OUTPUT = re.compile(r"^%(\w+) :")


def fx_output(node: onnx.NodeProto) -> str | None:
    """The name of the FX value the dynamo exporter recorded ``node`` as computing (``linear``), or None."""
    record = next((p.value for p in node.metadata_props if p.key == FX_NODE), None)
    found = _OUTPUT.match(record) if record is not None else None
    return found.group(1) if found else None
