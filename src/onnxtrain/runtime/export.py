"""Export an inference model: the eval graph without loss or labels, with the trained weights inside."""

from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnxtrain.conventions import TrainingMeta
from onnxtrain.ir.files import PROTO_LIMIT, StagedFiles, atomic_write_bytes
from onnxtrain.ir.passes import node_inputs, prune_nodes
from onnxtrain.ir.types import infer_tensor_info

__all__ = ["inference_model", "write_model"]

EXTERNAL_MIN_SIZE = 64  # elements: smaller tensors stay inline in a model whose weights are in PATH.data
STREAMED_MIN_BYTES = 4096  # smaller weights are serialized as TensorProtos, larger ones written from their arrays



def inference_model(eval_model: onnx.ModelProto, meta: TrainingMeta, values: dict[str, np.ndarray],
                    output_names: list[str]) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The part of ``eval_model`` that computes ``output_names``, and the entries of ``values`` it reads (the
    arrays themselves, not copies), to be written by :func:`write_model`."""
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
    weights = {n: values[n] for n in values if n in needed}
    outputs = [helper.make_tensor_value_info(n, infos[n].elem_type, infos[n].shape) for n in output_names]
    out_graph = helper.make_graph(nodes, "inference", inputs, outputs,
                                  initializer=[i for i in graph.initializer if i.name in needed])
    model = helper.make_model(out_graph, opset_imports=list(eval_model.opset_import), producer_name="onnxtrain")
    model.ir_version = eval_model.ir_version
    return model, weights


def write_model(model: onnx.ModelProto, weights: dict[str, np.ndarray], path: str | os.PathLike) -> None:
    """Write ``model`` with ``weights`` added to its initializers, atomically, from the arrays' own memory (no
    TensorProto copies of them): below protobuf's 2 GB as pieces of the model file (:func:`_initializer_pieces`),
    over it in ``PATH.data``, the two files replaced together (onnx.save_model would append to an older
    ``.data``)."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"cannot export to {path}: the folder {directory} does not exist")
    data_path = path + ".data"
    if sum(a.nbytes for a in weights.values()) <= PROTO_LIMIT - (64 << 20):
        pieces = [model.SerializeToString()]
        for name, array in weights.items():
            pieces += _initializer_pieces(name, array)
        atomic_write_bytes(path, pieces)
        return
    # shapes, axes, scales and other small tensors stay in the model: onnxruntime reads no external data to infer
    # shapes
    outside = {n: a for n, a in weights.items() if a.dtype.kind == "f" and a.size >= EXTERNAL_MIN_SIZE}
    model.graph.initializer.extend(numpy_helper.from_array(a, n) for n, a in weights.items() if n not in outside)
    model.graph.initializer.extend(_external_tensors(outside, os.path.basename(data_path)))
    with StagedFiles() as files:
        files.stage(data_path, [_little_endian(a).data for a in outside.values()])
        files.stage(path, model.SerializeToString())
        files.commit()


def _initializer_pieces(name: str, array: np.ndarray) -> list[bytes | memoryview]:
    """The protobuf encoding of a ModelProto holding only ``graph.initializer: [array as name]``, the raw data of
    a large one the array's own memory. Appended to a serialized model, it adds that initializer: a parser merges
    a message field that occurs twice (the graph) and concatenates repeated ones (its initializers). Serializing
    the model with every weight in it held them twice more (TensorProto copies, then the bytes: 2.5 GB peak to
    export GPT-2's 475 MB)."""
    if array.dtype.kind not in "biuf" or array.nbytes < STREAMED_MIN_BYTES:
        tensor: list[bytes | memoryview] = [numpy_helper.from_array(array, name).SerializeToString()]
    else:
        data = _little_endian(array)
        head = onnx.TensorProto(name=name, dims=list(array.shape),
                                data_type=helper.np_dtype_to_tensor_dtype(data.dtype)).SerializeToString()
        raw = memoryview(data.reshape(-1).view(np.uint8))
        tensor = [head, _length_delimited_tag(_RAW_DATA, raw.nbytes), raw]
    graph = [_length_delimited_tag(_GRAPH_INITIALIZER, _size(tensor)), *tensor]
    return [_length_delimited_tag(_MODEL_GRAPH, _size(graph)), *graph]


_MODEL_GRAPH, _GRAPH_INITIALIZER, _RAW_DATA = 7, 5, 9   # field numbers in onnx.proto


def _size(pieces: list[bytes | memoryview]) -> int:
    return sum(len(p) if isinstance(p, bytes) else p.nbytes for p in pieces)


def _length_delimited_tag(field: int, length: int) -> bytes:
    """A length-delimited field's key (wire type 2) and the payload's length, as varints."""
    out = bytearray()
    for value in (field << 3 | 2, length):
        while value > 0x7F:
            out.append(value & 0x7F | 0x80)
            value >>= 7
        out.append(value)
    return bytes(out)


def _little_endian(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))


def _external_tensors(weights: dict[str, np.ndarray], location: str) -> list[onnx.TensorProto]:
    """TensorProtos whose data is in ``location``, the arrays laid one after the other in ``weights``' order."""
    tensors, offset = [], 0
    for name, array in weights.items():
        tensor = onnx.TensorProto(name=name, dims=list(array.shape),
                                  data_type=helper.np_dtype_to_tensor_dtype(array.dtype),
                                  data_location=onnx.TensorProto.EXTERNAL)
        for key, value in (("location", location), ("offset", str(offset)), ("length", str(array.nbytes))):
            tensor.external_data.add(key=key, value=value)
        tensors.append(tensor)
        offset += array.nbytes
    return tensors
