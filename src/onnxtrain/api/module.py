"""``onnxruntime.training.api.module``'s names, for scripts that import the peer's submodules."""

from onnxtrain.runtime.module import Module

__all__ = ["Module"]
