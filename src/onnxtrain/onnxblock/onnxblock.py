"""``ForwardBlock`` and ``TrainingBlock``: blocks that turn the base model into a finished model.

A ``ForwardBlock`` stacks blocks on the base model and makes its outputs the model's outputs; a
``TrainingBlock`` does the same and then builds the training and eval models with onnxtrain's offline phase
(the same graphs ``generate_artifacts`` writes).
"""

from __future__ import annotations

import copy

import onnx
from onnx import numpy_helper

from onnxtrain.blocks.model_accessor import ModelAccessor, calling, current_accessor
from onnxtrain.onnxblock.blocks import Block, _check_arguments

__all__ = ["ForwardBlock", "TrainingBlock"]


def _built(block: Block, accessor: ModelAccessor, args, kwargs):
    """``block.build(*args, **kwargs)``, its nodes checked as every block's (:meth:`Block.__call__`)."""
    _check_arguments(block, args, kwargs, as_loss=False)
    start = len(accessor.model.graph.node)
    with calling(block):
        output = block.build(*args, **kwargs)
    accessor.check_block(block, start)
    return output


def _register_outputs(accessor: ModelAccessor, outputs) -> onnx.ModelProto:
    """Make ``outputs`` (a name or a list of names) the graph outputs of the accessor's model."""
    names = [outputs] if isinstance(outputs, str) else list(outputs)
    value_infos = [accessor.value_info(name) for name in names]
    model = accessor.model
    del model.graph.output[:]
    model.graph.output.extend(value_infos)
    return model


class ForwardBlock(Block):
    """A block whose ``build`` returns the model's new output(s); calling it builds the forward model.

    Example::

        class WithLoss(onnxblock.ForwardBlock):
            def __init__(self):
                super().__init__()
                self.loss = onnxblock.loss.CrossEntropyLoss()

            def build(self, output_name):
                return self.loss(output_name)
    """

    def __init__(self) -> None:
        super().__init__()
        self._model: onnx.ModelProto | None = None

    def build(self, *args, **kwargs):  # pragma: no cover - abstract
        raise NotImplementedError(f"{type(self).__name__} must implement build()")

    def __call__(self, *args, **kwargs):
        accessor = current_accessor()
        output = _built(self, accessor, args, kwargs)
        self._model = copy.deepcopy(_register_outputs(accessor, output))
        return output

    def to_model_proto(self) -> onnx.ModelProto:
        """The forward model (after the block was called)."""
        if self._model is None:
            raise RuntimeError("Please build the forward models first before trying to retrieve it.")
        return self._model


class TrainingBlock(Block):
    """A block whose ``build`` returns the loss; calling it builds the training and eval models.

    Parameters marked with ``requires_grad(name)`` are trained; with none marked, every floating-point
    initializer is (as ``generate_artifacts(requires_grad=None)``), except those marked
    ``requires_grad(name, False)``, which stay frozen inputs. Graph inputs can be marked too: the training
    model then also returns their gradient.
    """

    def __init__(self) -> None:
        super().__init__()
        self._requires_grad: list[str] = []
        self._frozen_params: list[str] = []
        self._parameters: tuple[list[onnx.TensorProto], list[onnx.TensorProto]] | None = None
        self._training_model: onnx.ModelProto | None = None
        self._eval_model: onnx.ModelProto | None = None

    def build(self, *args, **kwargs):  # pragma: no cover - abstract
        raise NotImplementedError(f"{type(self).__name__} must implement build()")

    def requires_grad(self, argument_name: str, value: bool = True) -> None:
        """Train (``value=True``) or freeze (``False``) the parameter or graph input ``argument_name``."""
        add, remove = (self._requires_grad, self._frozen_params) if value else (self._frozen_params,
                                                                                self._requires_grad)
        if argument_name in remove:
            remove.remove(argument_name)
        if argument_name not in add:
            add.append(argument_name)

    def parameters(self) -> tuple[list[onnx.TensorProto], list[onnx.TensorProto]]:
        """(trainable, frozen) parameters as TensorProtos, known once the block was called."""
        if self._parameters is None:
            raise RuntimeError("Please build the training model first before trying to retrieve the parameters.")
        return self._parameters

    def to_model_proto(self) -> tuple[onnx.ModelProto, onnx.ModelProto]:
        """(training model, eval model), once the block was called."""
        if self._training_model is None or self._eval_model is None:
            raise RuntimeError("Please build the training and eval models first before trying to retrieve them.")
        return self._training_model, self._eval_model

    def __call__(self, *args, **kwargs):
        from onnxtrain.onnxblock._training import build_training_models

        accessor = current_accessor()
        output = _built(self, accessor, args, kwargs)
        forward = _register_outputs(accessor, output)
        outputs = [output] if isinstance(output, str) else list(output)
        built = build_training_models(forward, outputs[0], self._requires_grad, self._frozen_params, outputs[1:])
        self._training_model, self._eval_model = built.training, built.eval
        self._parameters = ([numpy_helper.from_array(built.weights[n], n) for n in built.trainable],
                            [numpy_helper.from_array(built.weights[n], n) for n in built.frozen])
        accessor.model.CopyFrom(self._training_model)
        return output
