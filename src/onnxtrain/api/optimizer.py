"""``onnxruntime.training.api.optimizer``'s names, for scripts that import the peer's submodules."""

from onnxtrain.runtime.optimizer import Optimizer

__all__ = ["Optimizer"]
