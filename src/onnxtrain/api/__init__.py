"""Drop-in replacement for ``onnxruntime.training.api``::

    from onnxtrain.api import CheckpointState, Module, Optimizer   # was: from onnxruntime.training.api import ...
"""

from onnxtrain.runtime import (
    CheckpointState,
    CosineLRScheduler,
    LinearLRScheduler,
    LRScheduler,
    Module,
    Optimizer,
    Parameter,
    StepLRScheduler,
)

__all__ = ["CheckpointState", "Parameter", "Module", "Optimizer", "LRScheduler", "LinearLRScheduler",
           "CosineLRScheduler", "StepLRScheduler"]
