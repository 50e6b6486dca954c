"""Module: runs the training and eval graphs on a CheckpointState (onnxruntime.training.api.Module)."""

from __future__ import annotations

import os
import warnings

import numpy as np

from onnxtrain.errors import NonFiniteError
from onnxtrain.runtime.arguments import flag
from onnxtrain.runtime.inputs import check_inputs, owned_ortvalue
from onnxtrain.runtime.loading import load_model
from onnxtrain.runtime.run import TrainingRun
from onnxtrain.runtime.state import CheckpointState

__all__ = ["Module"]


def _is_ortvalue(value) -> bool:
    return type(value).__name__ == "OrtValue"


def _peer_device(device):
    """The peer's ``"cpu:<id>"`` (its ``device.split(":")``) is the CPU; other devices are checked by the backend."""
    if isinstance(device, str) and device.startswith("cpu:") and device[4:].isdigit():
        return "cpu"
    return device


class Module:
    """The trainable model: ``loss = module(inputs..., labels...)`` runs a training step in training mode
    (accumulating gradients) and an evaluation in eval mode.

    Args:
        train_model_uri: the training model written by generate_artifacts.
        state: the CheckpointState holding the parameters.
        eval_model_uri: the eval model (needed for eval mode and export).
        device: "cpu" (onnxruntime; the peer's "cpu:0" too) or "reference" (onnx.reference, pure Python).
        session_options: onnxruntime.SessionOptions for the sessions.
        on_nonfinite: what a NaN/inf loss does: "skip" (default: the next optimizer step is skipped and a
            warning is issued) or "raise" (NonFiniteError).

    Attributes:
        training_run: the :class:`~onnxtrain.runtime.run.TrainingRun` that owns the sessions (an Optimizer
            created on this Module attaches to it).
        nonfinite_steps: training calls whose loss was NaN or infinite.
    """

    def __init__(self, train_model_uri, state: CheckpointState, eval_model_uri=None, device: str = "cpu",
                 session_options=None, on_nonfinite: str = "skip"):
        if not isinstance(state, CheckpointState):
            raise TypeError(f"state must be a CheckpointState, got {type(state).__name__}")
        if on_nonfinite not in ("skip", "raise"):
            raise ValueError(f"on_nonfinite must be 'skip' or 'raise', got {on_nonfinite!r}")
        self.on_nonfinite = on_nonfinite
        device = _peer_device(device)
        train_model = load_model(train_model_uri, "training model")
        eval_model = load_model(eval_model_uri, "eval model") if eval_model_uri is not None else None
        self.training_run = TrainingRun(state.values, train_model, eval_model, device, session_options)
        # The peer's Module keeps its CheckpointState as `_state`, and published scripts reach it there
        # (`CheckpointState.save_checkpoint(model._state, path)`, `model._state.parameters[name].data = ...`).
        self._state = state
        self._train_names = [m.name for m in self.training_run.train_inputs]
        self.training = True
        self.nonfinite_steps = 0

    # -- the peer's API ---------------------------------------------------------------------------------
    def train(self, mode: bool = True) -> Module:
        """Switch to training mode (``mode=True``) or eval mode."""
        self.training = mode
        return self

    def eval(self) -> Module:
        """Switch to eval mode."""
        return self.train(False)

    def lazy_reset_grad(self) -> None:
        """Start the gradient accumulation afresh at the next training step."""
        self.training_run.lazy_reset_grad()

    def input_names(self) -> list[str]:
        """The inputs a call takes in the current mode (user inputs, then labels)."""
        run = self.training_run
        return [m.name for m in (run.train_inputs if self.training else run.eval_inputs or [])]

    def output_names(self) -> list[str]:
        """The outputs a call returns in the current mode (the loss first)."""
        run = self.training_run
        if self.training:
            return [m.name for m in run.train_outputs[:1 + len(run.meta.additional_outputs)]]
        return [m.name for m in run.eval_outputs or []]

    def __call__(self, *user_inputs):
        self.training_run.values.require_loaded()
        given_ortvalues = any(map(_is_ortvalue, user_inputs))
        arrays = [v.numpy() if _is_ortvalue(v) else v for v in user_inputs] if given_ortvalues else user_inputs
        outputs = self._train_step(arrays) if self.training else self._eval_step(arrays)
        # as the peer: OrtValues out for OrtValues in, numpy arrays as soon as one input is a numpy array
        if given_ortvalues and not any(isinstance(v, np.ndarray) for v in user_inputs):
            outputs = [owned_ortvalue(o) for o in outputs]
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def _train_step(self, arrays) -> list[np.ndarray]:
        run = self.training_run
        arrays = check_inputs(run.train_inputs, arrays, "training step", run.train_labels, run.train_indices)
        extras = run.train_step(dict(zip(self._train_names, arrays)))
        if not run.last_loss_finite:
            self._nonfinite_loss()
        return [run.loss.copy(), *extras]

    def _nonfinite_loss(self) -> None:
        self.nonfinite_steps += 1
        message = f"the training loss is {float(self.training_run.loss)} (not finite)"
        if self.on_nonfinite == "raise":
            raise NonFiniteError(message + "; lower the learning rate or check the inputs for NaN/inf")
        skipped = ("no parameter was updated" if self.training_run.updates_in_backward
                   else "the next optimizer step will be skipped")
        warnings.warn(f"{message}; {skipped}", RuntimeWarning, stacklevel=4)

    def _eval_step(self, arrays) -> list[np.ndarray]:
        inputs = self.training_run.eval_inputs
        if inputs is None:
            return self.training_run.eval_step({})  # raises: there is no eval model
        arrays = check_inputs(inputs, arrays, "eval step", self.training_run.eval_labels,
                              self.training_run.eval_indices)
        return self.training_run.eval_step(dict(zip((m.name for m in inputs), arrays)))

    def get_parameters_size(self, trainable_only: bool = True) -> int:
        """Number of parameter elements (trainable only, or all)."""
        trainable_only = flag(trainable_only, "trainable_only", "Module.get_parameters_size")
        return self.training_run.values.parameter_count(trainable_only)

    def get_contiguous_parameters(self, trainable_only: bool = False):
        """All parameters (trainable, then frozen unless ``trainable_only``) as one flat OrtValue."""
        trainable_only = flag(trainable_only, "trainable_only", "Module.get_contiguous_parameters")
        self.training_run.values.require_loaded()
        return owned_ortvalue(self.training_run.values.flat_parameters(trainable_only))

    def copy_buffer_to_parameters(self, buffer, trainable_only: bool = True) -> None:
        """Set the parameters from one flat buffer (numpy array or OrtValue), in get_contiguous_parameters order."""
        trainable_only = flag(trainable_only, "trainable_only", "Module.copy_buffer_to_parameters")
        self.training_run.values.set_flat_parameters(buffer.numpy() if _is_ortvalue(buffer) else buffer,
                                                     trainable_only)

    def add_to_gradients(self, flat) -> None:
        """Add ``flat`` to the accumulated gradients of the trainable parameters, in place.

        For a term of the objective that the training graph does not compute, e.g. FedProx's proximal term
        ``mu/2 * ||w - w_global||^2``, whose gradient is ``mu * (w - w_global)``. Call it after the training
        call(s) of a step and before ``optimizer.step()`` (the first training call after ``lazy_reset_grad()``
        overwrites the gradients, so between the two it raises).

        Args:
            flat: a 1-D numpy array (or OrtValue) of ``get_parameters_size()`` elements in
                ``get_contiguous_parameters(trainable_only=True)`` order, with the parameters' dtype.

        Raises:
            TypeError: ``flat`` has another dtype than the trainable parameters (it is not cast).
            ValueError: ``flat`` is not 1-D or has another number of elements.
            RuntimeError: called after ``lazy_reset_grad()`` and before the next training call, or with an
                optimizer that updates in the backward (there is no gradient to add to).
        """
        if self.training_run.updates_in_backward:
            raise RuntimeError("add_to_gradients: the Optimizer updates in the backward (update_in_backward=True), "
                               "so the training call has already applied its gradients and keeps none to add to; "
                               "use an Optimizer without update_in_backward to add a term to the gradients")
        flat = flat.numpy() if _is_ortvalue(flat) else np.asarray(flat)
        values = self.training_run.values
        grads = values.grads.current
        if flat.ndim != 1 or flat.size != grads.size:
            raise ValueError(f"add_to_gradients expects a flat array of {grads.size} elements (the trainable "
                             f"parameters, in get_contiguous_parameters(trainable_only=True) order), got shape "
                             f"{list(flat.shape)}")
        if flat.dtype != grads.dtype:
            raise TypeError(f"add_to_gradients expects dtype {grads.dtype} (the trainable parameters'), got "
                            f"{flat.dtype}; cast it with .astype({str(grads.dtype)!r})")
        if self.training_run.reset_pending:
            raise RuntimeError("add_to_gradients after lazy_reset_grad() and before the training call: that call "
                               "overwrites the gradients, so the addition would be lost; call the module first")
        values.add_to_gradients(flat)  # a new version: optimizer.step() recomputes an update computed in advance

    def export_model_for_inferencing(self, inference_model_uri: str | os.PathLike,
                                     graph_output_names: list[str] | None = None,
                                     merge_adapters: bool = False) -> None:
        """Write an inference model: the forward graph in inference mode with the current weights inside.

        ``merge_adapters=True`` folds LoRA adapters into their weights (the model then has the base model's
        nodes); otherwise they stay separate nodes.
        """
        from onnxtrain.runtime.export import inference_model, write_model

        run = self.training_run
        if run.eval_model is None:
            raise RuntimeError("exporting needs the eval model: pass eval_model_uri=... to Module()")
        if isinstance(graph_output_names, str):  # one name, not its letters
            graph_output_names = [graph_output_names]
        if merge_adapters:
            from onnxtrain.lora import lora_meta
            from onnxtrain.lora import merge_adapters as merge

            adapters = lora_meta(run.eval_model)  # before writing anything: ValueError without adapters
        model, weights = inference_model(run.eval_model, run.meta, run.values.graph_values(),
                                         graph_output_names or run.meta.model_outputs)
        if merge_adapters:
            weights = merge(model.graph, weights, adapters)
        write_model(model, weights, inference_model_uri)
