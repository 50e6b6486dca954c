"""`import_model`: a .tflite / .circle file -> a forward ONNX model with the same outputs.

Every float constant becomes an initializer named as its TFLite tensor, in TFLite's layout (Conv2D weights
OHWI, DepthwiseConv2D [1, KH, KW, C*M], FullyConnected [out, in]); the ONNX graph transposes them where ONNX
wants another layout, so training updates exactly the tensors that are written back. Graph inputs and outputs
keep their TFLite names, shapes (NHWC) and dynamic batch.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import helper

from onnxtrain.ir.builder import GraphBuilder
from onnxtrain.tflite.context import ImportContext, UnsupportedModelError
from onnxtrain.tflite.ops import CONVERTERS
from onnxtrain.tflite.reader import FlatModel, read_flatbuffer
from onnxtrain.tflite.source import SourceRecord, WeightSlot

__all__ = ["import_model", "convert", "OPSET"]

OPSET = 17


def _check_float(model: FlatModel, source: str) -> None:
    """Training needs a float model: refuse quantized and sparse tensors with their names."""
    quantized = [t.name for t in model.tensors if t.quantized]
    if quantized:
        shown = ", ".join(repr(n) for n in quantized[:3]) + (f" and {len(quantized) - 3} more" if len(quantized) > 3
                                                             else "")
        raise UnsupportedModelError(f"{source} is quantized ({len(quantized)} quantized tensors: {shown}); only "
                                    f"float models can be imported for training: convert the float model without "
                                    f"optimizations")
    sparse = [t.name for t in model.tensors if t.sparse]
    if sparse:
        raise UnsupportedModelError(f"{source} has sparse tensors ({', '.join(repr(n) for n in sparse[:3])}); "
                                    f"densify them")


def _check_io(model: FlatModel, source: str) -> None:
    for index in model.inputs + model.outputs:
        t = model.tensors[index]
        if t.type_code != 0:
            kind = np.dtype(t.dtype).name if t.dtype else f"TensorType {t.type_code}"
            raise UnsupportedModelError(f"{source}: graph input/output {t.name!r} is {kind}, expected float32")


def _unsupported(model: FlatModel, source: str) -> None:
    missing = sorted({op.code for op in model.operators if op.code not in CONVERTERS})
    if missing:
        raise UnsupportedModelError(f"{source} uses operators onnxtrain cannot import: {', '.join(missing)} "
                                    f"(supported: {', '.join(sorted(CONVERTERS))}; see docs/tflite.md)")


def _value_info(model: FlatModel, index: int, name: str) -> onnx.ValueInfoProto:
    t = model.tensors[index]
    dims = [d if d >= 0 else ("batch" if axis == 0 else f"{name}_dim{axis}") for axis, d in enumerate(t.signature)]
    return helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, dims)


def _weights(model: FlatModel) -> tuple[dict[int, str], list[onnx.TensorProto], dict[str, WeightSlot], list[str]]:
    """Float32 initializers for the float32 and float16 constants: one per buffer (tensors sharing a buffer
    share the weight)."""
    by_buffer: dict[int, str] = {}
    names: dict[int, str] = {}
    inits, slots, untouched, taken = [], {}, [], set()
    for t in model.tensors:
        if t.data is None:
            continue
        if not t.is_weight:
            untouched.append(t.name)
            continue
        if t.buffer not in by_buffer:
            name = t.name if t.name and t.name not in taken else f"{t.name or 'weight'}#{t.index}"
            taken.add(name)
            by_buffer[t.buffer] = name
            inits.append(onnx.numpy_helper.from_array(np.asarray(t.data, dtype=np.float32), name))  # keeps 0-d
            slots[name] = WeightSlot(t.location[0], t.location[1], list(t.shape), [], np.dtype(t.dtype).name)
        names[t.index] = by_buffer[t.buffer]
        slots[by_buffer[t.buffer]].tensors.append(t.name)
    return names, inits, slots, untouched


def _operator_weights(model: FlatModel, weight_names: dict[int, str]) -> list[list[str]]:
    """The weights each operator reads, in order; a float16 weight counts for the operator reading its
    DEQUANTIZE, and those DEQUANTIZE operators (weight storage, not computation) are not counted."""
    stored = {op.outputs[0]: weight_names[op.inputs[0]] for op in model.operators
              if op.code == "DEQUANTIZE" and op.inputs[0] in weight_names}
    lookup = {**weight_names, **stored}
    return [[lookup[i] for i in op.inputs if i in lookup] for op in model.operators
            if not (op.code == "DEQUANTIZE" and op.outputs[0] in stored)]


def convert(model: FlatModel, source: str = "model") -> onnx.ModelProto:
    """The forward ONNX model of a parsed flatbuffer (its first subgraph)."""
    _check_float(model, source)
    _unsupported(model, source)   # before the inputs' types: an int32 token input goes with an unsupported GATHER
    _check_io(model, source)
    if model.subgraphs > 1:
        raise UnsupportedModelError(f"{source} has {model.subgraphs} subgraphs (control flow or several "
                                    f"signatures); only single-subgraph models are supported")
    weight_names, inits, slots, untouched = _weights(model)
    io_names = [model.tensors[i].name for i in model.inputs + model.outputs]
    builder = GraphBuilder(OPSET, taken=[i.name for i in inits] + io_names)
    ctx = ImportContext(model, builder, weights=weight_names)
    inputs = []
    for index in model.inputs:
        name = model.tensors[index].name
        ctx.define(index, name)
        inputs.append(_value_info(model, index, name))
    for op in model.operators:
        try:
            CONVERTERS[op.code](ctx, op)
        except UnsupportedModelError as exc:
            raise UnsupportedModelError(f"{source}: {exc}") from None
    outputs = []
    for index in model.outputs:
        name = model.tensors[index].name
        value = ctx.nhwc(index)
        if value != name:
            builder.node("Identity", [value], [name])
        outputs.append(_value_info(model, index, name))
    graph = helper.make_graph(builder.nodes, "tflite", inputs, outputs, initializer=inits + builder.initializers)
    onnx_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="onnxtrain")
    onnx_model.ir_version = 8
    op_weights = _operator_weights(model, weight_names)
    SourceRecord.from_file_bytes(model.format, source, model.data, slots, untouched, op_weights).attach(onnx_model)
    onnx.checker.check_model(onnx_model, full_check=True)
    return onnx_model


def import_model(path: str | os.PathLike, output: str | os.PathLike | None = None) -> onnx.ModelProto:
    """Convert a .tflite or .circle file to a forward ONNX model (written to ``output`` if given).

    The model's metadata records the source file, so `onnxtrain export --format tflite|circle` can write the
    trained weights back into a copy of it.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"model file not found: {path}")
    with open(path, "rb") as f:
        data = f.read()
    model = convert(read_flatbuffer(data, path), os.path.basename(path))
    if output is not None:
        onnx.save(model, os.fspath(output))
    return model
