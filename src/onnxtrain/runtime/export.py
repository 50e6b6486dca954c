"""Export an inference model: the eval graph without loss or labels, with the trained weights inside."""

from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnxtrain.conventions import TrainingMeta
from onnxtrain.ir.files import PROTO_LIMIT, atomic_write_bytes
from onnxtrain.ir.passes import node_inputs, prune_nodes
from onnxtrain.ir.types import infer_tensor_info

__all__ = ["export_inference_model"]



def export_inference_model(eval_model: onnx.ModelProto, meta: TrainingMeta, values: dict[str, np.ndarray],
                           path: str | os.PathLike, output_names: list[str]) -> None:
    """Write the part of ``eval_model`` that computes ``output_names``, with ``values`` (parameters and
    buffers by name) as its initializers."""
    graph = eval_model.graph
    infos = infer_tensor_info(eval_model)
    unknown = [n for n in output_names if n not in infos]
    if unknown:
        raise ValueError(f"cannot export: {unknown} are not values of the model (model outputs: "
                         f"{meta.model_outputs})")
    nodes = prune_nodes(graph.node, output_names)
    needed = {x for n in nodes for x in node_inputs(n)} | set(output_names)
    labels = [n for n in meta.labels if n in needed]
    if labels:
        raise ValueError(f"cannot export {output_names}: they depend on the label inputs {labels}")
    # Only the inputs the outputs depend on: a loss written into the forward model (onnxblock) has its target
    # among the user inputs, and the peer's exported model does not ask for it.
    inputs = [i for i in graph.input if i.name in meta.user_inputs and i.name in needed]
    initializers = [numpy_helper.from_array(values[n], n) for n in values if n in needed]
    initializers += [i for i in graph.initializer if i.name in needed]
    outputs = [helper.make_tensor_value_info(n, infos[n].elem_type, infos[n].shape) for n in output_names]
    out_graph = helper.make_graph(nodes, "inference", inputs, outputs, initializer=initializers)
    model = helper.make_model(out_graph, opset_imports=list(eval_model.opset_import), producer_name="onnxtrain")
    model.ir_version = eval_model.ir_version
    path = os.fspath(path)
    if sum(i.ByteSize() for i in initializers) > PROTO_LIMIT - (64 << 20):
        onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                        location=os.path.basename(path) + ".data")
        return
    atomic_write_bytes(path, model.SerializeToString())
