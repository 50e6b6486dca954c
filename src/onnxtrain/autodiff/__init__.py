"""Reverse-mode autodiff over ONNX graphs: one gradient rule per op type, registered by op type.

Importing this package registers every rule module below.
"""

from onnxtrain.autodiff import (  # noqa: F401  (registration)
    activations,
    attention,
    control_flow,
    conv,
    elementwise,
    function_body,
    im2col,
    linalg,
    loops,
    loss,
    normalization,
    pooling,
    recurrent,
    reduce,
    sampling,
    shape,
    spectral,
    tensor,
    trigonometry,
    unsupported,
)
from onnxtrain.autodiff.context import GradContext
from onnxtrain.autodiff.engine import build_gradients
from onnxtrain.autodiff.registry import GRADIENT_RULES, NON_DIFFERENTIABLE, register, register_zero_gradient

__all__ = ["GradContext", "build_gradients", "GRADIENT_RULES", "NON_DIFFERENTIABLE", "register",
           "register_zero_gradient"]
