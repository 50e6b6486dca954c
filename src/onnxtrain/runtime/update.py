"""UpdateGraph: the optimizer graph and the state it carries from step to step.

The optimizer graph is a pure function, ``(params, gradients, states, lr, step) -> (params', states',
gradients_finite)``, in the spirit of optax's ``update(grads, state, params) -> (updates, state)``. This
object holds its inputs that are not gradients (learning rate, step, the optimizer state vectors) and binds
inputs and outputs for a run.

On onnxruntime, from ``MIN_CHUNKS`` chunks up (about 1M parameters), the graph runs split into chunks of about
``CHUNK`` elements bound to slices of the vectors (runtime/passes/chunk_update.py), each chunk's ops running
while its slices are in the cache, and **in place** (runtime/passes/in_place.py): the new parameters and states
are written over the old ones, after the gradients were found finite (so a skipped step leaves them as they were).
One copy of the parameters and of each state, where double buffers would hold two (docs/memory.md).

Smaller models (or graphs the passes cannot rewrite) run whole and double-buffered: the new values go to the
spare halves and become current when :meth:`commit` is called, so the training graph fused with this one can
compute an update in advance that ``optimizer.step()`` keeps or throws away (runtime/run.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import onnx

from onnxtrain import conventions as names
from onnxtrain.conventions import OptimizerMeta
from onnxtrain.errors import ArtifactError, PassError
from onnxtrain.runtime.engine_errors import run_session
from onnxtrain.runtime.loading import open_artifact_session
from onnxtrain.runtime.passes import ChunkUpdate, InPlaceUpdate, chunk_bounds, chunk_name
from onnxtrain.runtime.values import TrainingValues

__all__ = ["UpdateGraph", "CHUNK"]

logger = logging.getLogger(__name__)

# Elements per chunk of the split update: 1 MiB of float32 per vector, so a chunk's inputs, outputs and
# temporaries stay in the L2/L3 caches (BENCHMARKS.md, design history).
CHUNK = 1 << 18
# Updated inside the backward, each chunk costs a few nodes of its own (its gate, its finiteness sum, the waits
# for its parameters' readers): larger chunks, 4 MiB. bert_small (2 threads, alternating): 2^18 -> 2^20 took the
# step from about 1.2x to 1.05x the usual loop's and the peak from 536 to 512 MiB (2^21: 508, 2^22: 522).
IN_BACKWARD_CHUNK = 1 << 20
# Below this many chunks the split's extra nodes cost more than cache reuse saves (MLP, 269k parameters:
# 1.0 ms whole, 1.1-1.2 ms as 2 chunks) and the temporaries are small anyway.
MIN_CHUNKS = 4


def _same(name: str) -> str:
    return name


def _layout_difference(optimizer: list, checkpoint: list) -> str:
    """The first difference between two (name, shape) layouts, in words."""
    for i, ((name, shape), (c_name, c_shape)) in enumerate(zip(optimizer, checkpoint)):
        if name != c_name:
            return f"parameter {i} is {name!r} in the optimizer, {c_name!r} in the checkpoint"
        if tuple(shape) != tuple(c_shape):
            return f"{name!r} is {list(shape)} in the optimizer, {list(c_shape)} in the checkpoint"
    return (f"{len(optimizer)} parameters in the optimizer, {len(checkpoint)} in the checkpoint (a model of other "
            "artifacts?)")


class UpdateGraph:
    """The optimizer model bound to the values it updates.

    Args:
        model: the optimizer model written by generate_artifacts.
        values: the training values (parameters, gradients, optimizer states) it updates.
        device, session_options: as for the training model's sessions.
        in_backward: the update will run inside the training graph, each chunk as soon as its gradient exists
            (runtime/passes/update_in_backward.py): always split and bound in place, else ArtifactError.
    """

    def __init__(self, model: onnx.ModelProto, values: TrainingValues, device: str, session_options,
                 in_backward: bool = False):
        self.meta = OptimizerMeta.from_model(model)
        if self.meta.layout != values.params.layout:
            raise ArtifactError("the optimizer model does not match the checkpoint's trainable parameters: "
                                + _layout_difference(self.meta.layout, values.params.layout))
        self.artifact = model
        self.checks_finite = any(o.name == names.GRADIENTS_FINITE for o in model.graph.output)
        self.in_backward = in_backward
        if in_backward:
            self.bounds, self.model = self._for_backward(model, values, device)
            self.in_place = True
        else:
            self.bounds, self.model = self._split(model, values, device)
            self.in_place = False
            if self.bounds is not None:
                self.in_place, self.model = self._in_place(self.model, len(self.bounds))
        if self.in_place:
            self.checks_finite = False  # the flag is not computed in the graph: TrainingRun checks first
        self._values = values
        self._device, self._session_options = device, session_options
        self._session = self._open()  # now, so that a broken optimizer model fails here
        self.states = values.optimizer_states(tuple(self.meta.states))
        self.learning_rate = np.array(1e-3, dtype=np.float32)
        self._step = np.array(0, dtype=np.int64)
        # Optimizer graphs with a finiteness output check the gradients in the same run (no extra numpy pass).
        self.finite = np.zeros((), dtype=bool)

    @staticmethod
    def _split(model: onnx.ModelProto, values: TrainingValues, device: str):
        """(chunk bounds, the model as run): split on onnxruntime when there are at least MIN_CHUNKS chunks."""
        bounds = chunk_bounds(values.params.sizes, CHUNK)
        if device != "cpu" or len(bounds) < MIN_CHUNKS:
            return None, model
        try:
            return bounds, ChunkUpdate(bounds).run(model).model
        except PassError as exc:
            logger.info("running the optimizer graph over whole vectors: %s", exc)
            return None, model

    def _in_place(self, model: onnx.ModelProto, chunks: int) -> tuple[bool, onnx.ModelProto]:
        """(True, the graph rewritten to be bound in place), or (False, the graph) if it cannot be."""
        try:
            return True, self._bound_in_place(model, chunks)
        except PassError as exc:
            logger.info("updating the parameters double-buffered, not in place: %s", exc)
            return False, model

    def _bound_in_place(self, model: onnx.ModelProto, chunks: int) -> onnx.ModelProto:
        """The chunked graph rewritten to be bound in place (PassError if it cannot be)."""
        pairs = [(chunk_name(n, i), chunk_name(names.output_name(n), i))
                 for n in (names.PARAMS, *self.meta.states) for i in range(chunks)]
        return InPlaceUpdate(pairs, drop=[names.GRADIENTS_FINITE]).run(model).model

    def _for_backward(self, model: onnx.ModelProto, values: TrainingValues, device: str):
        """(chunk bounds, the model as run) for an update inside the backward: always split, in chunks of
        IN_BACKWARD_CHUNK, and bound in place; ArtifactError saying why if it cannot be."""
        if device != "cpu":
            raise ArtifactError(f"update_in_backward=True runs on onnxruntime (device='cpu'), not on {device!r}")
        bounds = chunk_bounds(values.params.sizes, IN_BACKWARD_CHUNK)
        try:
            return bounds, self._bound_in_place(ChunkUpdate(bounds).run(model).model, len(bounds))
        except PassError as exc:
            raise ArtifactError("update_in_backward=True needs an optimizer graph that can be split into chunks "
                                f"and run in place, and this one cannot: {exc}") from None

    def vectors(self, name: str, vector: np.ndarray, storage, spare: bool = False) -> dict[str, np.ndarray]:
        """The graph's input(s) or output(s) for the flat vector ``name``: the vector, or its chunks."""
        if self.bounds is None:
            return {name: vector}
        return {chunk_name(name, i): v for i, v in enumerate(storage.chunks(self.bounds, spare))}

    def _open(self):
        return open_artifact_session(self.model, "optimizer model", self._device, self._session_options)

    def close_session(self) -> None:
        """Drop the session (a fused training step does its work); :meth:`run` reopens it if needed."""
        self._session = None

    def bind(self, name: Callable[[str], str] = _same) -> tuple[dict, dict]:
        """The update's persistent inputs and outputs except the gradients, keyed by ``name(graph name)``."""
        values = self._values
        self._step[...] = values.step + 1
        inputs = {name(names.LEARNING_RATE): self.learning_rate, name(names.STEP): self._step}
        out = {}
        spare = not self.in_place
        for n, storage in [(names.PARAMS, values.params), *self.states.items()]:
            inputs.update({name(k): v for k, v in self.vectors(n, storage.current, storage).items()})
            target = storage.spare if spare else storage.current
            out.update({name(k): v for k, v in
                        self.vectors(names.output_name(n), target, storage, spare=spare).items()})
        if self.checks_finite:
            out[name(names.GRADIENTS_FINITE)] = self.finite
        return inputs, out

    def run(self) -> None:
        """Run the optimizer graph on its own, on the current gradients."""
        inputs, out = self.bind()
        grads = self._values.grads
        inputs.update(self.vectors(names.GRADIENTS, grads.current, grads))
        if self._session is None:
            self._session = self._open()
        run_session(self._session, "optimizer step", {}, out, [], state=inputs)

    def commit(self) -> None:
        """The values the last run wrote become current (the spare buffers swap in, unless it ran in place);
        the step advances."""
        if not self.in_place:
            self._values.params.swap()
            for st in self.states.values():
                st.swap()
        self._values.advance_step()
