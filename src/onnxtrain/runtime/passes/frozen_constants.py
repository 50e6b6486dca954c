"""FrozenAsConstants: frozen convolution weights become initializers that onnxruntime reads from memory.

A training graph reads every parameter as an input, so that the runtime binds its arrays once and the sessions
hold none. For a frozen convolution that costs speed: onnxruntime folds a BatchNormalization into the Conv before
it and lays the weights out for its blocked (NCHWc) kernels only when they are constants; with the weights as
inputs it reorders them at every run and runs the BatchNormalization on its own. On a frozen backbone (the
usual on-device fine-tuning of a CNN's head) the forward is most of the step: ResNet-18's head-only step takes
about two thirds of its time with the weights constant, MobileNetV2's about a third (docs/memory.md).

Cases handled: a graph input named in ``frozen`` becomes an initializer when every node that reads it is a
``Conv`` (weight or bias), a ``BatchNormalization`` (scale, bias, mean, variance), or a ``Shape`` or ``Size`` (the
dynamo exporter reads convolution weights' shapes) of the top-level graph. The initializer holds no bytes: it is
marked as external data at the location :data:`LOCATION`, and the session supplies the array itself
(``SessionOptions.add_external_initializers``), so that onnxruntime optimises it before anything runs and no copy
of it is serialized. A frozen value read by any other node (a convolution's input gradient, a MatMul) or inside a
subgraph stays an input. Nothing else changes.

The result is meant for an onnxruntime session opened with those arrays (:func:`constant_names` lists them). The
ONNX checker would look for the placeholders' data in a file: the postconditions are checked with the
placeholders declared as graph inputs again (:meth:`FrozenAsConstants.ensures`).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
from onnx import helper

from onnxtrain.ir.pass_infra import Pass, PassResult
from onnxtrain.ir.passes import clone_without, implicit_inputs
from onnxtrain.ir.types import onnx_dtype

__all__ = ["FrozenAsConstants", "constant_names", "LOCATION", "CONSTANT_WEIGHT_INPUTS"]

# The input positions at which onnxruntime folds or re-lays out a constant (op type -> positions), and the ops that
# read only a tensor's shape (torch's dynamo exporter takes the Shape of convolution weights).
CONSTANT_WEIGHT_INPUTS: Mapping[str, frozenset[int]] = {
    "Conv": frozenset({1, 2}),
    "BatchNormalization": frozenset({1, 2, 3, 4}),
    "Shape": frozenset({0}),
    "Size": frozenset({0}),
}
LOCATION = "onnxtrain:frozen-parameter"  # the placeholders' external-data location: not a file


class FrozenAsConstants(Pass):
    """Turn the frozen convolution and BatchNormalization weights among ``frozen`` (name -> array, for the dtype
    and shape) into data-less initializers (cases in the module's docstring)."""

    def __init__(self, frozen: Mapping[str, np.ndarray]):
        self.frozen = frozen

    def call(self, model: onnx.ModelProto) -> PassResult:
        graph = model.graph
        candidates = {i.name for i in graph.input if i.name in self.frozen}
        for node in graph.node:
            if not candidates:
                break
            allowed = CONSTANT_WEIGHT_INPUTS.get(node.op_type, frozenset()) if node.domain in ("", "ai.onnx") else ()
            for position, name in enumerate(node.input):
                if name in candidates and position not in allowed:
                    candidates.discard(name)
            candidates.difference_update(implicit_inputs(node))
        if not candidates:
            return PassResult(model, False)
        out = clone_without(model, "input")
        out.graph.input.extend(i for i in graph.input if i.name not in candidates)
        for name in sorted(candidates):
            array = self.frozen[name]
            tensor = onnx.TensorProto(name=name, data_type=onnx_dtype(array.dtype),
                                      dims=array.shape, data_location=onnx.TensorProto.EXTERNAL)
            tensor.external_data.add(key="location", value=LOCATION)
            out.graph.initializer.append(tensor)
        return PassResult(out, True)

    def ensures(self, model: onnx.ModelProto) -> None:
        """The postconditions of every pass, checked with the placeholders declared as inputs again: the ONNX
        checker looks for external data in files, and these have their data in the session."""
        placeholders = set(constant_names(model))
        declared = clone_without(model, "initializer")
        declared.graph.initializer.extend(t for t in model.graph.initializer if t.name not in placeholders)
        declared.graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, t.dims)
                                    for t in model.graph.initializer if t.name in placeholders)
        super().ensures(declared)


def constant_names(model: onnx.ModelProto) -> list[str]:
    """The initializers of ``model`` that :class:`FrozenAsConstants` made (their data comes from the session)."""
    return [t.name for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL
            and any(e.key == "location" and e.value == LOCATION for e in t.external_data)]
