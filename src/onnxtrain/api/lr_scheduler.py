"""``onnxruntime.training.api.lr_scheduler``'s names, for scripts that import the peer's submodules."""

from onnxtrain.runtime.schedulers import CosineLRScheduler, LinearLRScheduler, LRScheduler, StepLRScheduler

__all__ = ["LinearLRScheduler", "LRScheduler", "CosineLRScheduler", "StepLRScheduler"]
