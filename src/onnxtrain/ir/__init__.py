"""Graph helpers: a node builder, shape/type lookup and small graph passes over ONNX protos."""

# symbolic: infer_tensor_info's solvers, which ir.types imports on first use (they build on its TensorInfo); loaded
# with the package, so that the first inference does not pay for the import
from onnxtrain.ir import symbolic
from onnxtrain.ir.builder import GraphBuilder
from onnxtrain.ir.types import TensorInfo, infer_tensor_info, np_dtype, onnx_dtype

__all__ = ["GraphBuilder", "TensorInfo", "infer_tensor_info", "np_dtype", "onnx_dtype", "symbolic"]
