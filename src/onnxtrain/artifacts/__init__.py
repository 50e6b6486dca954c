"""The offline phase: training, eval and optimizer graphs plus a checkpoint, all plain ONNX."""

from onnxtrain.artifacts.generate import LossType, OptimType, generate_artifacts
from onnxtrain.lora import LoRA

__all__ = ["generate_artifacts", "LossType", "OptimType", "LoRA"]
