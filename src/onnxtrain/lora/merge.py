"""The merge: fold each adapter's ``scale * B A`` into its frozen weight and drop the adapter nodes.

Cases: a weight used by one adapted node is replaced in place; a weight shared by nodes that carry the same
adapter (tied modules) is replaced once; a weight also read by another node, or by nodes with different
adapters, gets a merged copy per adapter. The result has no ``lora_A`` / ``lora_B`` weights left.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx

from onnxtrain.errors import LoRAError
from onnxtrain.ir.passes import node_inputs, reader_index
from onnxtrain.lora.config import Adapter, LoRAMeta

__all__ = ["merge_adapters", "merged_weight"]


def merged_weight(w: np.ndarray, a: np.ndarray, b: np.ndarray, adapter: Adapter, scale: float) -> np.ndarray:
    """``W + scale * B A`` in ``W``'s layout (MatMul stores ``W`` as in x out, Gemm with transB=0 too), divided
    by the Gemm's alpha, which the base node applies to ``W`` but not to the adapter."""
    ba = b.reshape(b.shape[0], -1).astype(np.float64) @ a.reshape(a.shape[0], -1).astype(np.float64)  # out x in
    delta = scale / adapter.gemm_alpha * (ba if adapter.weight_transposed else ba.T)
    return (w.astype(np.float64) + delta.reshape(w.shape)).astype(w.dtype)


def merge_adapters(graph: onnx.GraphProto, weights: dict[str, np.ndarray], meta: LoRAMeta) -> dict[str, np.ndarray]:
    """Rewrite ``graph`` in place so that it reads merged weights, and return its new weights: ``weights`` (name ->
    array; W, A and B of every adapter among them) without the adapters, with the merged values. Only the adapted
    weights are copied (the export of a 3 GB model merged from the file it had written peaked at 23.5 GB)."""
    written = {o for n in graph.node for o in n.output}
    meta = replace(meta, adapters=[a for a in meta.adapters if a.base_output in written])  # others were pruned
    missing = [n for a in meta.adapters for n in (a.weight, a.A, a.B) if n not in weights]
    if missing:
        raise LoRAError(f"cannot merge the adapters: {missing[:4]} are not weights of the model")
    dropped = {n for a in meta.adapters for n in a.nodes}
    base_nodes = {n.output[0]: n for n in graph.node if n.output}  # every adapter's base_output is among them
    in_place = _in_place_weights(graph, meta)

    merged: dict[str, np.ndarray] = {}
    transposed: dict[str, str] = {}   # a merged copy -> its Transpose's output, for nodes reading W transposed
    added: list[onnx.NodeProto] = []
    for a in meta.adapters:
        node = base_nodes[a.base_output]
        name = a.weight if a.weight in in_place else f"{a.weight}/merged/{a.module}"
        if name not in merged:
            merged[name] = merged_weight(weights[a.weight], weights[a.A], weights[a.B], a, meta.scale)
        if node.input[1] == a.weight:
            node.input[1] = name
        elif name != a.weight:   # MatMul(x, Transpose(W)) where W stays for other readers: the copy's transpose
            if name not in transposed:
                transposed[name] = f"{name}/transposed"
                added.append(onnx.helper.make_node("Transpose", [name], [transposed[name]], perm=[1, 0],
                                                   name=transposed[name]))
            node.input[1] = transposed[name]
        node.output[0] = a.output
    keep = added + [n for n in graph.node if n.name not in dropped]
    del graph.node[:]
    graph.node.extend(keep)
    used = {x for n in keep for x in node_inputs(n)} | {o.name for o in graph.output}
    out = {n: merged.pop(n, w) for n, w in weights.items()}
    out.update(merged)
    return {n: w for n, w in out.items() if n in used}


def _in_place_weights(graph: onnx.GraphProto, meta: LoRAMeta) -> set[str]:
    """The weights that can be replaced by their merged value: every node reading them is the base node of
    an adapter, and all those adapters are the same (A, B)."""
    adapter_nodes = {n for a in meta.adapters for n in a.nodes}
    pairs: dict[str, set[tuple[str, str]]] = {}
    bases: dict[str, set[str]] = {}
    for a in meta.adapters:
        pairs.setdefault(a.weight, set()).add((a.A, a.B))
        bases.setdefault(a.weight, set()).add(a.base_output)
    readers = reader_index(map(node_inputs, graph.node))

    def feeds_only_bases(n: onnx.NodeProto, w: str) -> bool:   # W's Transpose, read by the base nodes only
        return n.op_type == "Transpose" and all(graph.node[k].output[0] in bases[w]
                                                for k in readers.get(n.output[0], []))

    shared = {x for n in graph.node if n.name not in adapter_nodes for x in node_inputs(n)
              if x in bases and n.output[0] not in bases[x] and not feeds_only_bases(n, x)}
    return {w for w, p in pairs.items() if len(p) == 1 and w not in shared}
