"""Names shared by the artifacts and the runtime (the contract between the two phases).

The gradient-buffer and reset-flag names are those of onnxruntime-training, so tools that look for them
still find them.
"""

__all__ = [
    "LAZY_RESET_GRAD", "grad_buffer_name", "grad_output_name", "buffer_output_name", "TRAINING_META",
    "OPTIMIZER_META", "LEARNING_RATE", "STEP", "PARAMS", "GRADIENTS", "GRADIENTS_FINITE", "output_name",
]

LAZY_RESET_GRAD = "lazy_reset_grad"
LEARNING_RATE = "learning_rate"
STEP = "step"
PARAMS = "params"
GRADIENTS = "gradients"
GRADIENTS_FINITE = "gradients_finite"  # optimizer output: False when a gradient is NaN or infinite

# metadata_props keys holding a JSON description of each artifact's interface
TRAINING_META = "onnxtrain.training"
OPTIMIZER_META = "onnxtrain.optimizer"


def grad_buffer_name(param: str) -> str:
    return f"{param}_grad.accumulation.buffer"


def grad_output_name(param: str) -> str:
    return f"{param}_grad.accumulation.out"


def buffer_output_name(buffer: str) -> str:
    """The training graph's output carrying the updated value of a state buffer (BatchNorm running stats)."""
    return f"{buffer}.updated"


def output_name(name: str) -> str:
    """Optimizer graph output for input ``name`` (``params`` -> ``params.out``)."""
    return f"{name}.out"
