"""The training phase: CheckpointState, Module, Optimizer and LR schedulers on stock onnxruntime."""

from onnxtrain.runtime.module import Module
from onnxtrain.runtime.optimizer import Optimizer
from onnxtrain.runtime.schedulers import CosineLRScheduler, LinearLRScheduler, LRScheduler, StepLRScheduler
from onnxtrain.runtime.state import CheckpointState, Parameter

__all__ = ["CheckpointState", "Parameter", "Module", "Optimizer", "LRScheduler", "LinearLRScheduler",
           "CosineLRScheduler", "StepLRScheduler"]
