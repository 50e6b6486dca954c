"""Generate artifacts for a foreign model, train through onnxtrain.api, and check gradients by finite differences.

The finite differences run on the eval model widened to float64 (onnx.reference), against the training
model's gradients widened the same way, so that a wrong rule shows up at 1e-6, not hidden in float32 noise.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from onnxtrain import blocks
from onnxtrain.api import CheckpointState, Module, Optimizer
from onnxtrain.artifacts import generate_artifacts
from onnxtrain.conventions import LAZY_RESET_GRAD, grad_buffer_name, grad_output_name
from tests.float64 import as_float64

DATA = Path(__file__).resolve().parent / "data"


class Trained:
    """Artifacts generated from ``model`` in ``folder`` and a fresh Module/Optimizer on them."""

    def __init__(self, model, folder: Path, loss, optimizer=None, **kwargs):
        self.folder = Path(folder)
        self.paths = generate_artifacts(model, loss=loss, optimizer=optimizer or blocks.SGD(),
                                        artifact_directory=self.folder, **kwargs)
        self.state = CheckpointState.load_checkpoint(self.paths["checkpoint"])
        self.module = Module(self.paths["training"], self.state, self.paths["eval"])
        self.optimizer = Optimizer(self.paths["optimizer"], self.module)
        self.optimizer.set_learning_rate(0.05)

    @property
    def trainable(self) -> list[str]:
        return [n for n, p in self.state.parameters if p.requires_grad]

    def gradients(self, *feeds) -> tuple[float, dict[str, np.ndarray]]:
        """(loss, gradients) of one training step in float32 on onnxruntime, from zeroed gradients."""
        self.module.train()
        self.module.lazy_reset_grad()
        out = self.module(*feeds)
        loss = out[0] if isinstance(out, list) else out
        return float(loss), {n: self.state.parameters[n].grad.copy() for n in self.trainable}

    def train(self, steps: int, *feeds) -> list[float]:
        losses = []
        for _ in range(steps):
            self.module.train()
            out = self.module(*feeds)
            losses.append(float(out[0] if isinstance(out, list) else out))
            self.optimizer.step()
            self.module.lazy_reset_grad()
        return losses

    def export(self, outputs: list[str] | None = None) -> Path:
        path = self.folder / "inference.onnx"
        self.module.export_model_for_inferencing(str(path), outputs)
        return path


def _float64_session(model: onnx.ModelProto):
    """onnx.reference on ``model`` widened to float64."""
    from onnx.reference import ReferenceEvaluator

    from onnxtrain.runtime.backends.reference_ops import PATCHED_OPS

    return ReferenceEvaluator(as_float64(model), new_ops=PATCHED_OPS)


def finite_difference_errors(run: Trained, feeds: list[np.ndarray], per_parameter: int = 3, eps: float = 1e-6,
                             seed: int = 0) -> dict[str, float]:
    """Per trainable parameter: max |analytic - central difference| / (1e-8 + 1e-6 (|difference| +
    max|gradient|)) over ``per_parameter`` random elements: the training graph's gradients and the eval
    model's loss, both in float64."""
    training, evaluation = onnx.load(run.paths["training"]), onnx.load(run.paths["eval"])
    wide = lambda a: a.astype(np.float64) if a.dtype == np.float32 else a  # noqa: E731
    params = {n: wide(p.data) for n, p in run.state.parameters}
    data = [wide(np.asarray(f)) for f in feeds]

    def bind(model: onnx.ModelProto, extra: dict) -> dict:
        it = iter(data)
        return {i.name: extra[i.name] if i.name in extra else next(it) for i in model.graph.input}

    grads_in = {grad_buffer_name(n): np.zeros_like(params[n]) for n in run.trainable}
    feeds_in = bind(training, {**params, **grads_in, LAZY_RESET_GRAD: np.array(True)})
    outs = dict(zip([o.name for o in training.graph.output], _float64_session(training).run(None, feeds_in)))
    analytic = {n: outs[grad_output_name(n)] for n in run.trainable}
    scale = max(float(np.abs(g).max()) for g in analytic.values())
    loss_of = _float64_session(evaluation)
    loss_name = evaluation.graph.output[0].name
    rng = np.random.default_rng(seed)
    errors = {}
    for name in run.trainable:
        value = params[name]
        worst = 0.0
        for i in rng.choice(value.size, min(per_parameter, value.size), replace=False):
            flat = value.reshape(-1)
            orig = flat[i]
            losses = []
            for delta in (eps, -eps):
                flat[i] = orig + delta
                losses.append(float(loss_of.run([loss_name], bind(evaluation, params))[0]))
            flat[i] = orig
            numeric = (losses[0] - losses[1]) / (2 * eps)
            got = float(analytic[name].reshape(-1)[i])
            worst = max(worst, abs(got - numeric) / (1e-8 + 1e-6 * (abs(numeric) + scale)))
        errors[name] = worst
    return errors
