"""``onnxruntime.training.api.checkpoint_state``'s names, for scripts that import the peer's submodules."""

from onnxtrain.runtime.state import CheckpointState, Parameter, Parameters, Properties

__all__ = ["CheckpointState", "Parameter", "Parameters", "Properties"]
