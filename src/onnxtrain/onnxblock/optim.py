"""``onnxblock.optim``: the peer's optimizer blocks (``AdamW``, ``SGD``, ``ClipGradNorm``) over tensor sequences.

The optimizer model takes ``learning_rate`` (float [1]), ``step`` (int64 [1], AdamW only) and the sequences
``params``, ``gradients`` (and ``first_order_moments``, ``second_order_moments`` for AdamW), as the peer's.
The update is onnxtrain's (:mod:`onnxtrain.blocks.optim`) applied to the concatenation of every tensor, in
standard ONNX ops; the updated sequences are the outputs ``params.out`` (and ``first_order_moments.out``,
``second_order_moments.out``). The block returns the name of ``updated_flag`` (bool [1], True), as the peer's.

The model also records its update rule (``RULE_KEY`` metadata): ``onnxtrain.api.Optimizer`` given such a model runs
the same rule as onnxtrain's flat optimizer graph over the Module's parameters (see :func:`flat_optimizer_model`).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import helper

from onnxtrain import conventions as names
from onnxtrain.blocks import optim as _optim
from onnxtrain.blocks.transforms import ClipByGlobalNorm, UpdateState
from onnxtrain.onnxblock._sequences import constant_true, flatten, sequence_input, unflatten
from onnxtrain.onnxblock.blocks import Block

__all__ = ["ClipGradNorm", "AdamW", "SGD", "flat_optimizer_model", "RULE_KEY"]

UPDATED_FLAG = "updated_flag"
RULE_KEY = "onnxtrain.onnxblock_optimizer"
_RULES = {"AdamW": _optim.AdamW, "SGD": _optim.SGD}


class ClipGradNorm(Block):
    """Scale a sequence of gradients so that their global L2 norm is at most ``max_norm``
    (``torch.nn.utils.clip_grad_norm_``); returns the name of the clipped sequence."""

    def __init__(self, max_norm: float):
        super().__init__()
        self.max_norm = max_norm

    def build(self, gradients_name: str, elem_type: int = onnx.TensorProto.FLOAT) -> str:
        update = UpdateState(self.builder, "", "", "", flatten(self.builder, gradients_name, elem_type), {})
        ClipByGlobalNorm(self.max_norm).apply(update)
        return unflatten(self.builder, update.direction, gradients_name, elem_type)


class _SequenceOptimizer(Block):
    """Shared by AdamW and SGD: declare the inputs, clip, update the flat vectors, split them back."""

    states: tuple[str, ...] = ()
    uses_step = False

    def __init__(self, rule: _optim.Optimizer, clip_grad: ClipGradNorm | None):
        super().__init__()
        self._rule, self._clip_grad = rule, clip_grad
        self._model: onnx.ModelProto | None = None

    @property
    def flat_rule(self) -> _optim.Optimizer:
        """The same update as an onnxtrain optimizer block (flat vectors; clipping included)."""
        config = {**self._rule.config(), "max_norm": self._clip_grad.max_norm if self._clip_grad else None}
        return type(self._rule)(**config)

    def __call__(self, *args, **kwargs):
        output = super().__call__(*args, **kwargs)
        rule = self.flat_rule
        self.base.metadata_props.add(key=RULE_KEY, value=json.dumps({"type": type(rule).__name__,
                                                                     "config": rule.config()}))
        self._model = copy.deepcopy(self.base)
        return output

    def to_model_proto(self) -> onnx.ModelProto:
        """The optimizer model, once the block was called (the peer's optimizers are ForwardBlocks)."""
        if self._model is None:
            raise RuntimeError("Please build the optimizer model first: call the block inside "
                               "`with onnxblock.empty_base():` before to_model_proto()")
        return self._model

    def build(self, parameters: tuple[Sequence[onnx.TensorProto], Sequence[onnx.TensorProto]]) -> str:
        trainable, _ = parameters
        if not trainable:
            raise ValueError(f"{type(self).__name__}: there are no trainable parameters to optimize")
        ctx, b = self.context, self.builder
        elem = trainable[0].data_type
        lr = ctx.require_input(names.LEARNING_RATE, onnx.TensorProto.FLOAT, [1])
        step = ctx.require_input(names.STEP, onnx.TensorProto.INT64, [1]) if self.uses_step else None
        seqs = {n: sequence_input(ctx, n, elem) for n in (names.PARAMS, names.GRADIENTS, *self.states)}
        gradients = seqs[names.GRADIENTS]
        if self._clip_grad is not None:
            gradients = self._clip_grad(gradients, elem)
        op = self.op
        flat_step = op.Cast(step, to=onnx.TensorProto.FLOAT) if step else None
        rule_states = dict(zip(self._rule.state_names, (flatten(b, seqs[s], elem) for s in self.states)))
        new_params, new_states = self._rule.build(_optim.OptimizerInputs(
            ctx, lr, flat_step, flatten(b, seqs[names.PARAMS], elem), flatten(b, gradients, elem), rule_states))
        outputs = {names.PARAMS: new_params,
                   **{s: new_states[r] for s, r in zip(self.states, self._rule.state_names)}}
        model_outputs = [helper.make_tensor_value_info(constant_true(b, UPDATED_FLAG), onnx.TensorProto.BOOL, [1])]
        for seq, flat in outputs.items():
            out = unflatten(b, flat, seqs[names.PARAMS], elem, output=names.output_name(seq))
            model_outputs.append(helper.make_tensor_sequence_value_info(out, elem, None))
        self.base.graph.output.extend(model_outputs)
        return UPDATED_FLAG


class AdamW(_SequenceOptimizer):
    """AdamW as the peer's (epsilon outside the bias correction; see :class:`onnxtrain.blocks.AdamW`)."""

    states = ("first_order_moments", "second_order_moments")
    uses_step = True

    def __init__(self, bias_correction: bool = True, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.0, clip_grad: ClipGradNorm | None = None):
        super().__init__(_optim.AdamW(bias_correction, betas, eps, weight_decay), clip_grad)


class SGD(_SequenceOptimizer):
    """Plain stochastic gradient descent: ``p -= learning_rate * g``."""

    def __init__(self, clip_grad: ClipGradNorm | None = None):
        super().__init__(_optim.SGD(), clip_grad)


def flat_optimizer_model(model: onnx.ModelProto, params: dict[str, np.ndarray],
                         opset: int | None = None) -> onnx.ModelProto | None:
    """onnxtrain's flat optimizer model for ``params`` (name -> value, in the Module's order) with the rule recorded
    in ``model`` by an onnxblock optimizer; None if ``model`` has no such record.

    ``opset``: the training model's default opset, which the flat model then uses (as generate_artifacts' optimizer
    model does), so that the runtime can fuse the two graphs; None: the opset of ``model``, at most 17."""
    from onnxtrain.artifacts.optimizer import build_optimizer_model

    text = next((p.value for p in model.metadata_props if p.key == RULE_KEY), None)
    if text is None:
        return None
    record = json.loads(text)
    if record.get("type") not in _RULES:
        raise ValueError(f"the onnxblock optimizer model records an unknown rule {record.get('type')!r}; "
                         f"known: {sorted(_RULES)}")
    config = record.get("config", {})
    config["betas"] = tuple(config.get("betas", ())) or (0.9, 0.999)
    if record["type"] == "SGD":
        config.pop("betas")
    rule = _RULES[record["type"]](**config)
    if opset is None:
        # The flat update uses ops of opset 13 or older; a model built on a newer opset (empty_base(opset_version=N))
        # would make an older onnxruntime (1.17 runs up to opset 20) refuse it for no reason.
        opset = min(next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 17)
    return build_optimizer_model(rule, params, opset)
