"""Build the optimizer graph: one update of the flat vector of all trainable parameters."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from onnxtrain import conventions as names
from onnxtrain.artifacts.passes import FoldOutputIdentities
from onnxtrain.blocks.base import BuildContext
from onnxtrain.blocks.optim import Optimizer, OptimizerInputs
from onnxtrain.conventions import OptimizerMeta
from onnxtrain.ir.builder import GraphBuilder
from onnxtrain.ir.passes import portable_ir_version

__all__ = ["build_optimizer_model"]


def build_optimizer_model(optimizer: Optimizer, params: dict[str, np.ndarray], opset: int) -> onnx.ModelProto:
    """The optimizer model for ``params`` (name -> initial value, in flat-buffer order)."""
    dtypes = {v.dtype for v in params.values()}
    if len(dtypes) > 1:
        raise TypeError(f"all trainable parameters must share one dtype for the flat optimizer, got "
                        f"{sorted(str(d) for d in dtypes)}")
    dtype = dtypes.pop() if dtypes else np.dtype(np.float32)
    if dtype != np.float32:  # the update runs in float32 scalars (learning rate, step)
        raise TypeError(f"the optimizer graph supports float32 parameters; the {len(params)} trainable parameters are "
                        f"{dtype} (e.g. {next(iter(params))!r}): convert the model to float32 first (skl2onnx: "
                        f"FloatTensorType inputs; otherwise cast its float initializers, inputs and Cast nodes), or "
                        f"pass optimizer=None and update the parameters yourself")
    elem = helper.np_dtype_to_tensor_dtype(dtype)
    size = int(sum(v.size for v in params.values()))
    b = GraphBuilder(opset)
    vector_names = [names.PARAMS, names.GRADIENTS, *optimizer.state_names]
    for n in [names.LEARNING_RATE, names.STEP, *vector_names, *map(names.output_name, vector_names),
              names.GRADIENTS_FINITE]:
        b.reserve(n)
    lr = names.LEARNING_RATE
    step = b.op.Cast(names.STEP, to=onnx.TensorProto.FLOAT)
    new_params, new_states = optimizer.build(OptimizerInputs(BuildContext(b, {}), lr, step, names.PARAMS,
                                                             names.GRADIENTS, {s: s for s in optimizer.state_names}))
    b.node("Identity", [new_params], [names.output_name(names.PARAMS)])
    # One reduction tells whether any gradient is NaN or infinite; the runtime then keeps the old values.
    gradient_sum = b.reduce("ReduceSum", names.GRADIENTS, None, keepdims=False)
    b.node("Not", [b.op.Or(b.op.IsNaN(gradient_sum), b.op.IsInf(gradient_sum))], [names.GRADIENTS_FINITE])
    for s in optimizer.state_names:
        b.node("Identity", [new_states[s]], [names.output_name(s)])

    vec = lambda n: helper.make_tensor_value_info(n, elem, [size])  # noqa: E731
    graph = helper.make_graph(
        b.nodes, "optimizer",
        [helper.make_tensor_value_info(lr, onnx.TensorProto.FLOAT, []),
         helper.make_tensor_value_info(names.STEP, onnx.TensorProto.INT64, []),
         *[vec(n) for n in vector_names]],
        [vec(names.output_name(n)) for n in [names.PARAMS, *optimizer.state_names]]
        + [helper.make_tensor_value_info(names.GRADIENTS_FINITE, onnx.TensorProto.BOOL, [])],
        initializer=b.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="onnxtrain")
    model.ir_version = portable_ir_version(model.opset_import)
    model = FoldOutputIdentities()(model).model
    meta = OptimizerMeta(type(optimizer).__name__, optimizer.config(), list(optimizer.state_names),
                         [(k, tuple(v.shape)) for k, v in params.items()], str(dtype))
    for key, value in meta.to_props().items():
        model.metadata_props.add(key=key, value=value)
    return model
