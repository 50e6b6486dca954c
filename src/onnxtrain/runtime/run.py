"""TrainingRun: the one object that runs a training loop's graphs over its values.

It owns the sessions (the training graph in its two reset variants, the eval graph, the training graph fused
with the optimizer graph) and decides, for each training call, which one runs. The peer's API objects are
thin: ``Module`` calls :meth:`train_step` / :meth:`eval_step`, ``Optimizer`` calls :meth:`optimizer_step`.

One training step, with an optimizer attached and the loop stepping after every call::

    train_step(feeds) --fused session--> loss, gradients -> grads (in place), update -> params.spare, states.spare
                                         (a PreparedUpdate records what the update was computed from)
    optimizer_step()  --prepared update still valid?--> yes: swap the spare buffers in
                                                         no:  run the optimizer graph on its own, then swap

The update is stale if the learning rate, the parameters or the step changed after the training call
(``TrainingValues.version``), or if the optimizer is another one. A loop that accumulates gradients over
several calls per step does not fuse: the update would be computed, and thrown away, at every call.

With an optimizer attached ``in_backward`` (``Optimizer(..., update_in_backward=True)``), every training call
runs the training graph with the update inside it, each chunk of the parameters updated in place as soon as
its gradient exists (runtime/passes/update_in_backward.py): no gradient vector, and ``optimizer_step`` only
reports what the last call did.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, fields

import numpy as np
import onnx

from onnxtrain import conventions as names
from onnxtrain.conventions import TRAINING_META, TrainingMeta
from onnxtrain.errors import ArtifactError, PassError
from onnxtrain.runtime.backends import check_device, supports_constants
from onnxtrain.runtime.backends.base import graph_io
from onnxtrain.runtime.engine_errors import run_session
from onnxtrain.runtime.inputs import ClassLabels, TableIndices, class_label_inputs, table_index_inputs
from onnxtrain.runtime.loading import check_connected, open_artifact_session
from onnxtrain.runtime.passes import (
    FrozenAsConstants,
    FusedNames,
    FuseOptimizer,
    ScatterIntoGradient,
    SpecializeReset,
    UpdateInBackward,
    chunk_slots,
    constant_names,
    finite_name,
    zeroed_before_run,
)
from onnxtrain.runtime.update import UpdateGraph
from onnxtrain.runtime.values import TrainingValues

__all__ = ["TrainingRun", "PreparedUpdate"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PreparedUpdate:
    """An optimizer update a fused training call computed in advance, and what it was computed from."""

    update: UpdateGraph
    learning_rate: float
    values_version: int


@dataclass
class InBackward:
    """The training graph with the update inside it (runtime/passes/update_in_backward.py), and its session."""

    model: onnx.ModelProto
    names: FusedNames
    scattered: list[str]  # parameters whose gradient is scattered into its buffer (bound, zeroed before a run)
    finite: list[np.ndarray]  # one flag per chunk, written by each run: that chunk was updated
    session: object = None
    warned_accumulation: bool = False


def _differing_fields(meta: TrainingMeta, eval_model: onnx.ModelProto) -> list[str]:
    """The fields of the eval model's training description that differ from ``meta`` (none if it has none)."""
    if not any(p.key == TRAINING_META for p in eval_model.metadata_props):
        return []
    other = TrainingMeta.from_model(eval_model, "eval model")
    return [f.name for f in fields(meta) if getattr(meta, f.name) != getattr(other, f.name)]


class TrainingRun:
    """The training and eval graphs of one Module, run over a :class:`TrainingValues`.

    Args:
        values: the parameters, gradients, buffers and optimizer state (shared with the CheckpointState).
        train_model: the training model written by generate_artifacts.
        eval_model: the eval model, or None.
        device: "cpu" (onnxruntime) or "reference" (onnx.reference).
        session_options: onnxruntime.SessionOptions for every session.

    Attributes:
        fuse: run the training and optimizer graphs as one session when the loop allows it (True); False
            always runs the optimizer graph on its own (the results are the same).
        frozen_constants: give onnxruntime the frozen convolution and BatchNormalization weights as constants of
            the training sessions (True; runtime/passes/frozen_constants.py): it folds and re-lays them out once
            instead of at every step, and holds that copy. False reads them as inputs, as every other value.
            Applies to the sessions opened after it is set; the eval session always reads them as inputs.
        last_loss_finite: whether the last training call's loss was finite.
        train_labels, eval_labels: the inputs each graph's class loss reads as labels (checked before a run).
        train_indices, eval_indices: the inputs each graph reads as row indices of a parameter (checked too).
    """

    def __init__(self, values: TrainingValues, train_model: onnx.ModelProto, eval_model: onnx.ModelProto | None,
                 device: str, session_options):
        check_device(device)  # the sessions open on first use: a bad device fails here, not at the first step
        self.meta = TrainingMeta.from_model(train_model)
        values.check_matches(self.meta)
        self.values = values
        self._device, self._session_options = device, session_options
        self.train_model, self.eval_model = train_model, eval_model
        self.train_outputs = graph_io(train_model.graph.output)
        self._check_interface()
        train_inputs = graph_io(train_model.graph.input)
        values.check_declared(train_inputs, "training model")
        n_user = len(self.meta.user_inputs) + len(self.meta.labels)
        self.train_inputs = train_inputs[:n_user]
        self.train_labels = class_label_inputs(train_model)
        parameters = [*self.meta.trainable, *self.meta.frozen]
        self.train_indices = table_index_inputs(train_model, parameters)
        # The eval session opens on first use: a training loop may never evaluate, and a session holds memory.
        # An eval graph that does not connect still fails here (check_connected), not at the first evaluation.
        self._eval = None
        self.eval_inputs = self.eval_outputs = None
        self.eval_labels: dict[str, ClassLabels] = {}
        self.eval_indices: dict[str, TableIndices] = {}
        if eval_model is not None:
            check_connected(eval_model, "eval model")
            eval_inputs = graph_io(eval_model.graph.input)
            values.check_declared(eval_inputs, "eval model")
            state = values.graph_values()
            foreign = [m.name for m in eval_inputs[n_user:] if m.name not in state]
            # both models of one generation carry the same description; one of other artifacts over the same
            # parameters (another loss, say) would pass the checks of inputs
            differs = _differing_fields(self.meta, eval_model)
            if foreign or differs or [m.name for m in eval_inputs[:n_user]] != [m.name for m in self.train_inputs]:
                raise ArtifactError(
                    "the eval model does not belong to the training model's artifacts: "
                    + (f"it reads {foreign[:3]}, which the checkpoint and the training model do not have"
                       if foreign else f"its {TRAINING_META!r} metadata differs from the training model's in "
                       f"{differs}" if differs else f"it takes the inputs {[m.name for m in eval_inputs[:n_user]]}, "
                       f"the training model {[m.name for m in self.train_inputs]}")
                    + "; pass the eval_model.onnx written with this training_model.onnx")
            self.eval_inputs = eval_inputs[:n_user]
            self.eval_labels = class_label_inputs(eval_model)
            self.eval_indices = table_index_inputs(eval_model, parameters)
            self.eval_outputs = graph_io(eval_model.graph.output)
        self.loss = np.zeros((), dtype=self.train_outputs[0].dtype)
        self._reset = np.array(True)
        self._reset_pending = True
        self._buffer_spare = {n: np.empty_like(a) for n, a in values.buffers.items()}
        # The training graph with the reset flag decided in advance, and its sessions; built on first use.
        self._specialized_models: dict[bool, onnx.ModelProto] = {}
        self._zeroed: dict[bool, list[str]] = {}  # gradients the variant scatters into, zeroed before a reset run
        self._variants: dict[bool, object] = {}
        # No session yet: with an optimizer the loop runs the fused graph, and a training session opened and
        # closed before it leaves memory behind (on a BERT, 4.5 MB of peak RSS; 8 MB with a dynamic batch).
        # A graph that does not connect fails here; one that onnxruntime refuses, at the first step.
        check_connected(train_model, "training model")
        self.fuse = True
        self.frozen_constants = True
        self._constants_version: int | None = None  # values.frozen_version the training sessions' constants hold
        self._update: UpdateGraph | None = None
        self._fused: dict[bool, tuple[object, FusedNames] | None] = {}
        self._in_backward: InBackward | None = None
        self._in_backward_skipped: str | None = None  # why the last in-backward call left parameters unchanged
        self._prepared: PreparedUpdate | None = None
        self._calls_since_step, self._calls_last_cycle = 0, 1
        self.last_loss_finite = True

    def _check_interface(self) -> None:
        """The training graph has what its metadata promises: the loss output first, then the user inputs and
        labels as its first inputs (a damaged file can parse and still lack them)."""
        if not self.train_outputs:
            raise ArtifactError("the training model has no outputs (expected the loss first)")
        expected = [*self.meta.user_inputs, *self.meta.labels]
        found = [i.name for i in self.train_model.graph.input[:len(expected)]]
        if found != expected:
            raise ArtifactError(f"the training model's first inputs are {found}, its metadata says {expected}")
        outputs = {o.name for o in self.train_outputs}
        without = [p for p in self.meta.trainable if names.grad_output_name(p) not in outputs]
        if without:
            raise ArtifactError(f"the training model has no gradient output for {without[:3]} (expected "
                                f"{names.grad_output_name(without[0])!r}): is it the eval model?")

    # -- training calls --------------------------------------------------------------------------------------
    def lazy_reset_grad(self) -> None:
        """The next training call starts the gradient accumulation afresh."""
        self._reset_pending = True

    @property
    def reset_pending(self) -> bool:
        """True when the next training call will overwrite the gradients (``lazy_reset_grad`` since the last)."""
        return self._reset_pending

    def train_step(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """One forward and backward pass; accumulates the gradients and updates the buffers.

        Args:
            feeds: the user inputs and labels by graph input name (checked by the caller).

        Returns:
            The additional outputs (the loss is in ``self.loss``, written in place).
        """
        values = self.values
        if self._constants_version not in (None, values.frozen_version):  # a frozen parameter was written
            self._variants.clear()
            self._fused.clear()
            if self._in_backward is not None:
                self._in_backward.session = None
            self._constants_version = None
        if self._update is not None and self._update.in_backward:
            return self._train_step_in_backward(feeds)
        state = values.graph_values()
        state.update({names.grad_buffer_name(p): g for p, g in values.grads.views().items()})
        self._reset[...] = self._reset_pending
        state[names.LAZY_RESET_GRAD] = self._reset
        out = self._loss_and_buffer_outputs()
        self._prepared = None
        fused = self._fused_session_for(self._reset_pending) if self._fusing() else None
        for p in self._zeroed_before(self._reset_pending) if self._reset_pending else ():
            values.grads.zero(p)
        if fused is not None:
            session, fused_names = fused
            update_inputs, update_out = self._update.bind(fused_names)
            state.update(update_inputs)
            out.update(update_out)
            # The fused graph flattens the gradients; grads.spare is grads.current (read and written in place).
            grads = values.grads
            out.update({fused_names(k): v for k, v in
                        self._update.vectors(names.GRADIENTS, grads.spare, grads, spare=True).items()})
        else:
            session = self._session_for(self._reset_pending)
            out.update({names.grad_output_name(p): g for p, g in values.grads.spare_views().items()})
        extras = run_session(session, "training step", feeds, out, list(self.meta.additional_outputs), state=state)
        if fused is not None:
            self._prepared = PreparedUpdate(self._update, float(self._update.learning_rate), values.version)
        values.grads.swap()
        self._finish_training_call()
        return extras

    def _loss_and_buffer_outputs(self) -> dict[str, np.ndarray]:
        """A training run's outputs that every variant binds: the loss, and the new buffers into the spare ones."""
        out = {self.train_outputs[0].name: self.loss}
        out.update({names.buffer_output_name(b): self._buffer_spare[b] for b in self.values.buffers})
        return out

    def _finish_training_call(self) -> None:
        """After a training run: count it, note whether the loss is finite, and take the new buffers unless it is
        not (a batch whose loss is not finite leaves the running statistics as they were)."""
        self._calls_since_step += 1
        self.last_loss_finite = bool(np.isfinite(self.loss))
        if self.last_loss_finite:
            values = self.values
            for b in values.buffers:
                values.buffers[b], self._buffer_spare[b] = self._buffer_spare[b], values.buffers[b]
        self._reset_pending = False

    def eval_step(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """The eval graph's outputs (loss first) for ``feeds``; RuntimeError without an eval model."""
        if self.eval_model is None:
            raise RuntimeError("this Module has no eval model: pass eval_model_uri=... to Module() to evaluate, "
                               "or call module.train() to run training steps")
        if self._eval is None:
            self._eval = open_artifact_session(self.eval_model, "eval model", self._device, self._session_options)
        return run_session(self._eval, "eval step", feeds, {}, [m.name for m in self.eval_outputs],
                           state=self.values.graph_values())

    # -- optimizer steps -------------------------------------------------------------------------------------
    def attach_optimizer(self, model: onnx.ModelProto, in_backward: bool = False) -> UpdateGraph:
        """Bind an optimizer model to these values; its update is the one a training call may compute in
        advance (the last one attached), or, ``in_backward``, the one every training call applies (ArtifactError
        if the two graphs cannot be rewritten for it)."""
        update = UpdateGraph(model, self.values, self._device, self._session_options, in_backward=in_backward)
        in_backward_graph = self._build_in_backward(update) if in_backward else None
        self._update, self._in_backward = update, in_backward_graph
        self._fused.clear()
        self._prepared = None
        return self._update

    @property
    def updates_in_backward(self) -> bool:
        """Whether a training call also updates the parameters (an optimizer attached ``in_backward``)."""
        return self._in_backward is not None

    @property
    def update_graph(self) -> UpdateGraph | None:
        """The attached optimizer's graph (None before an Optimizer is created on the Module)."""
        return self._update

    @property
    def training_calls_since_step(self) -> int:
        """Training calls since the last optimizer step (or since loading)."""
        return self._calls_since_step

    def optimizer_step(self, update: UpdateGraph) -> str | None:
        """Apply one update of ``update`` to the parameters. Returns None, or why the step was skipped (the
        parameters and optimizer state are then unchanged)."""
        prepared, self._prepared = self._prepared, None
        self._calls_last_cycle, self._calls_since_step = self._calls_since_step, 0
        if update.in_backward:  # the training calls applied it
            skipped, self._in_backward_skipped = self._in_backward_skipped, None
            return skipped
        if not self.last_loss_finite:
            return "the loss is not finite (parameters unchanged)"
        if not update.checks_finite and not np.isfinite(self.values.grads.current.sum()):
            return "the gradients are not finite (parameters unchanged)"
        valid = PreparedUpdate(update, float(update.learning_rate), self.values.version)
        if prepared != valid:  # no fused training call computed this update
            update.run()
        if update.checks_finite and not update.finite:
            return "the gradients are not finite (parameters unchanged)"  # the results went to the spare buffers
        update.commit()
        return None

    # -- the update inside the backward ---------------------------------------------------------------------
    def _build_in_backward(self, update: UpdateGraph) -> InBackward:
        """The training graph (gradients reset at every call) fused with ``update``'s chunks, each updated as
        soon as its gradient exists; ArtifactError naming why if it cannot be built."""
        model = self._specialized(True)
        scattered = self._zeroed_before(True)
        values = self.values
        try:
            fused = FuseOptimizer(update.model, self.meta.trainable, update.bounds, values.params.sizes,
                                  keep_gradients=scattered).run(model).model
            fused_names = FusedNames.of_fused(fused)
            model = UpdateInBackward(fused_names, self.meta.trainable, values.params.sizes, update.bounds,
                                     [names.PARAMS, *update.meta.states], self.train_outputs[0].name).run(fused).model
        except PassError as exc:
            raise ArtifactError(f"update_in_backward=True cannot update these parameters during the backward: {exc}; "
                                "use the default Optimizer") from None
        finite = [np.zeros((), dtype=bool) for _ in update.bounds]
        return InBackward(model, fused_names, scattered, finite)

    def _train_step_in_backward(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """One training call that also applies the update (each chunk whose gradient and the loss are finite)."""
        values, update, graph = self.values, self._update, self._in_backward
        if not self._reset_pending and not graph.warned_accumulation:  # a loop that accumulates gradients
            graph.warned_accumulation = True
            warnings.warn("two training calls without lazy_reset_grad() in between: with update_in_backward=True "
                          "every call updates the parameters with its own gradients, nothing is accumulated",
                          RuntimeWarning, stacklevel=4)
        if graph.session is None:
            graph.session = self._open_training(graph.model, "training model updating in the backward")
            self._variants.clear()  # as for the fused session: the separate ones are not needed
            update.close_session()
        state = values.graph_values()
        out = self._loss_and_buffer_outputs()
        for p in graph.scattered:  # scattered into the buffer, which its output is bound to
            values.grads.zero(p)  # its pages given back: resident for the rows the run writes only
            state[names.grad_buffer_name(p)] = out[names.grad_output_name(p)] = values.gradient(p)
        update_inputs, update_out = update.bind(graph.names)
        state.update(update_inputs)
        out.update(update_out)
        out.update({finite_name(graph.names, i): flag for i, flag in enumerate(graph.finite)})
        self._prepared = None
        extras = run_session(graph.session, "training step", feeds, out, list(self.meta.additional_outputs),
                             state=state)
        self._finish_training_call()
        skipped = [i for i, flag in enumerate(graph.finite) if not flag]
        if len(skipped) < len(graph.finite):
            values.advance_step()
        if not self.last_loss_finite:
            self._in_backward_skipped = "the loss is not finite (parameters unchanged)"
        elif skipped:
            slots = chunk_slots(values.params.sizes, update.bounds)
            unchanged = [self.meta.trainable[k] for k in sorted({k for i in skipped for k in slots[i]})]
            self._in_backward_skipped = (f"the gradients of {unchanged[:5]}{' ...' if len(unchanged) > 5 else ''} "
                                         "are not finite (those parameters unchanged, the others updated)")
        else:
            self._in_backward_skipped = None
        return extras

    # -- sessions --------------------------------------------------------------------------------------------
    def _specialized(self, reset: bool) -> onnx.ModelProto:
        """The training model with the reset flag fixed (runtime/passes/specialize_reset.py) and embedding
        gradients scattered into their buffers (scatter_gradient.py), or as written if it cannot be specialised
        (the flag input then decides at run time: slower, same results)."""
        if reset not in self._specialized_models:
            zeroed = []
            try:
                model = SpecializeReset(self.meta.accumulation, reset).run(self.train_model).model
                try:
                    model = ScatterIntoGradient(self.meta.trainable, reset).run(model).model
                    zeroed = zeroed_before_run(model, self.meta.trainable) if reset else []
                except PassError as exc:
                    logger.info("embedding gradients scattered into zeros: %s", exc)
            except PassError as exc:
                logger.warning("running the training model with its reset flag as an input: %s", exc)
                model = self.train_model
            self._specialized_models[reset], self._zeroed[reset] = model, zeroed
        return self._specialized_models[reset]

    def _zeroed_before(self, reset: bool) -> list[str]:
        """The gradients the training graph for this reset flag scatters into, which a run must zero first."""
        self._specialized(reset)
        return self._zeroed[reset]

    def _session_for(self, reset: bool):
        """The training session for this value of the reset flag, created on first use (each session holds
        its own memory plan, so only the ones a training loop needs exist)."""
        if reset not in self._variants:
            self._variants[reset] = self._open_training(self._specialized(reset), "training model")
        return self._variants[reset]

    def _open_training(self, model: onnx.ModelProto, what: str):
        """A session for a training graph, its frozen convolution weights as constants if ``frozen_constants``
        (an optimisation: if onnxruntime refuses them, logged, the session reads them as inputs)."""
        if self.frozen_constants and self.values.frozen and supports_constants(self._device, self._session_options):
            with_constants = FrozenAsConstants(self.values.frozen).run(model).model
            constants = {n: self.values.frozen[n] for n in constant_names(with_constants)}
            if constants:
                try:
                    session = open_artifact_session(with_constants, what, self._device, self._session_options,
                                                    constants)
                except ArtifactError as exc:
                    logger.warning("the %s reads its frozen weights as inputs: with them as constants, %s", what, exc)
                else:
                    self._constants_version = self.values.frozen_version
                    return session
        return open_artifact_session(model, what, self._device, self._session_options)

    def _fusing(self) -> bool:
        """Fuse when an optimizer is attached, its update is double-buffered (an update computed in place could
        not be thrown away) and the last cycle had one training call per optimizer step (an accumulation loop
        would throw the update away at every call but the last). Nothing to fuse when nothing trains."""
        return (self.fuse and self._update is not None and not self._update.in_place and bool(self.meta.trainable)
                and self._calls_since_step == 0 and self._calls_last_cycle == 1)

    def _fused_session_for(self, reset: bool):
        """(session, names) of the training graph fused with the optimizer graph, or None if they cannot be
        fused (logged; the two graphs then run one after the other, with the same results)."""
        if reset not in self._fused:
            self._fused[reset] = self._open_fused(reset)
        return self._fused[reset]

    def _open_fused(self, reset: bool):
        try:
            fused = FuseOptimizer(self._update.model, self.meta.trainable, self._update.bounds,
                                  self.values.params.sizes).run(self._specialized(reset)).model
        except PassError as exc:
            logger.warning("running the training and optimizer graphs separately: %s", exc)
            return None
        try:
            session = self._open_training(fused, "training model fused with the optimizer")
        except ArtifactError as exc:  # fusing is an optimisation: the separate graphs still train
            self._session_for(reset)  # unless onnxruntime rejects the training model itself: that error, then
            warnings.warn(f"the training and optimizer graphs could not be fused; running them separately ({exc})",
                          RuntimeWarning, stacklevel=6)
            return None
        # The separate sessions (the optimizer's opened early, so that a broken artifact fails at construction)
        # are closed: their memory and idle threads are not needed while the loop fuses. Reopened if needed.
        self._variants.clear()
        self._update.close_session()
        return session, FusedNames.of_fused(fused)
