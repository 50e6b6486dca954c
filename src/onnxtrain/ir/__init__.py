"""Graph helpers: a node builder, shape/type lookup and small graph passes over ONNX protos."""

from onnxtrain.ir.builder import GraphBuilder
from onnxtrain.ir.types import TensorInfo, infer_tensor_info, np_dtype, onnx_dtype

__all__ = ["GraphBuilder", "TensorInfo", "infer_tensor_info", "np_dtype", "onnx_dtype"]
