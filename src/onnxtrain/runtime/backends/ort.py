"""onnxruntime execution with IOBinding: persistent buffers are bound once and the bindings are reused."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping

import numpy as np
import onnx
import onnxruntime as ort

from onnxtrain.runtime.backends.base import Session

__all__ = ["OrtSession"]

_STOP_SPINNING = "session.force_spinning_stop"
_MAX_BINDINGS = 8  # a training loop alternates between two sets of buffers; a few spare for other uses


_SHARED_ARENA: list[ort.OrtMemoryInfo] = []
# How the shared arena grows when no free block fits: 0 (kNextPowerOfTwo) doubles, 1 (kSameAsRequested) adds a
# region of exactly the size asked for. Blocks merge only within a region, so regions of one tensor each left the
# backward's large temporaries (a weight gradient's patches) no free block to fit in: the arena grew past the live
# peak by 100-200 MB. Pages of a large region that nothing touched are not resident. A/B figures in
# docs/memory.md; a module-level switch so that it can be measured again.
ARENA_EXTEND_STRATEGY = 0
# The arena hands out a free block whole unless it is at least twice the request or would waste at least this
# many bytes (onnxruntime's default: 128 MB): a 6 MB tensor took a 10 MB block, and the 4 MB beside it stayed
# unusable until the tensor was freed. Blocks are split from 2 MB of waste on: LoRA on the BERT with a dynamic
# batch 318 -> 309 MB peak RSS (arena in use 118 -> 104 MB), MobileNetV2 384 -> 380 MB, ResNet-18 480.5 ->
# 482 MB, the BERT with a fixed batch unchanged (docs/lora.md).
ARENA_MAX_DEAD_BYTES = 2 << 20


def _use_shared_arena(session_options: ort.SessionOptions) -> None:
    """Register (once per process) a CPU arena in onnxruntime's environment and make the session use it."""
    if not _SHARED_ARENA:
        info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
        # max_mem 0 (no limit), ARENA_EXTEND_STRATEGY, default initial chunk, ARENA_MAX_DEAD_BYTES
        ort.create_and_register_allocator(info, ort.OrtArenaCfg(0, ARENA_EXTEND_STRATEGY, -1, ARENA_MAX_DEAD_BYTES))
        _SHARED_ARENA.append(info)
    session_options.enable_cpu_mem_arena = True
    _set_default(session_options, "session.use_env_allocators", "1")


def _set_default(session_options: ort.SessionOptions, key: str, value: str) -> None:
    """Set a session config entry unless it is already set (the caller's choice, or an earlier session's)."""
    try:
        session_options.get_session_config_entry(key)
    except RuntimeError:  # not set yet
        session_options.add_session_config_entry(key, value)


class _Binding:
    """One IOBinding with every persistent array bound (the arrays are kept alive here)."""

    def __init__(self, session: ort.InferenceSession, state: Mapping[str, np.ndarray],
                 out: Mapping[str, np.ndarray]):
        self.io = session.io_binding()
        self.arrays = [*state.values(), *out.values()]
        for name, array in state.items():
            self.io.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(array))
        for name, array in out.items():
            self.io.bind_ortvalue_output(name, ort.OrtValue.ortvalue_from_numpy(array))
        self.output_order = list(out)  # IOBinding returns outputs in first-bound order


# onnxruntime's memory pattern, off (see OrtSession); a module-level switch so that it can be A/B-measured.
MEMORY_PATTERN = False
# onnxruntime's planned buffer reuse between values of the same static size, off (see OrtSession); A/B switch.
MEMORY_REUSE = False


class OrtSession(Session):
    """One InferenceSession; each distinct set of persistent arrays gets an IOBinding, built once."""

    def __init__(self, model: onnx.ModelProto, session_options: ort.SessionOptions | None = None,
                 memory_arena: bool = True):
        super().__init__(model)
        if session_options is None:
            session_options = ort.SessionOptions()
        if memory_arena:
            # All of onnxtrain's sessions (train, optimizer, eval) share one arena (see ARENA_EXTEND_STRATEGY for
            # how it grows): no page faults on fresh memory every step, and no per-session arenas each rounding
            # up on its own (figures in BENCHMARKS.md, design history).
            _use_shared_arena(session_options)
            # No memory pattern: with one, the second run allocates the whole plan as one block while the first
            # run's blocks stay in the arena, fragmented: 3 copies of the parameters more on a 22.6M-parameter
            # BERT (docs/memory.md). The arena makes the allocations it saves cheap anyway.
            session_options.enable_mem_pattern = MEMORY_PATTERN
            # No planned reuse either: with static shapes the planner hands a value the buffer of an earlier
            # value of the same size, which pins that block in the arena, so that other sizes cannot use it and
            # the arena grows (a step's peak is the backward's start, where every kept activation is alive;
            # figures in docs/lora.md). The arena hands out freed blocks anyway, at no measurable cost.
            session_options.enable_mem_reuse = MEMORY_REUSE
        else:
            session_options.enable_cpu_mem_arena = False
        # A Module runs several sessions one after the other (train, optimizer, eval). Idle intra-op threads
        # that keep spinning after their session's run compete for the cores with the next session's, but
        # threads that sleep between ops pay a wake-up per parallel op (figures in BENCHMARKS.md, design
        # history). Unless the caller chose otherwise, threads spin during a run and stop when it returns.
        _set_default(session_options, _STOP_SPINNING, "1")
        self._session = ort.InferenceSession(model.SerializeToString(), sess_options=session_options,
                                             providers=["CPUExecutionProvider"])
        # A failing run is raised again as an onnxtrain error that carries onnxruntime's message and node
        # (runtime/engine_errors.py): onnxruntime's own log line for it would only print the message twice.
        self._run_options = ort.RunOptions()
        self._run_options.log_severity_level = 4
        self._bindings: OrderedDict[tuple, _Binding] = OrderedDict()
        self._string_inputs = any(m.dtype == object for m in self.inputs)  # IOBindings cannot bind them

    def run(self, feeds: Mapping[str, np.ndarray], out: Mapping[str, np.ndarray], fetch: list[str],
            state: Mapping[str, np.ndarray] | None = None) -> list[np.ndarray]:
        state = state or {}
        if self._string_inputs and any(np.asarray(a).dtype == object for a in feeds.values()):
            return self._run_unbound(feeds, out, fetch, {k: v for k, v in state.items() if k in self.input_names})
        # The key is the identity of every persistent array given, used by the model or not: a training step
        # passes the same objects every time, so the lookup needs no filtering (a miss filters once).
        key = (*map(id, state.values()), *map(id, out.values()), *out)
        binding = self._bindings.get(key)
        if binding is None:
            used = {k: v for k, v in state.items() if k in self.input_names}
            binding = self._bindings[key] = _Binding(self._session, used, out)
            if len(self._bindings) > _MAX_BINDINGS:
                self._bindings.popitem(last=False)
        else:
            self._bindings.move_to_end(key)
        io = binding.io
        for name, array in feeds.items():
            if name in self.input_names:
                # bind_cpu_input binds the array's memory (and keeps a reference to it) without building a
                # Python OrtValue: a few microseconds per feed less, on every step of a small model.
                io.bind_cpu_input(name, np.ascontiguousarray(array))
        # Fetched outputs are re-bound on every run: after a run the binding holds the OrtValues it allocated,
        # which would be reused as pre-allocated outputs next time (failing when the batch size changes) and
        # returned again as views, so an array returned by one run would be overwritten by the next.
        for name in fetch:
            io.bind_output(name, "cpu")
            if name not in binding.output_order:
                binding.output_order.append(name)
        self._session.run_with_iobinding(io, self._run_options)
        if not fetch:
            return []
        by_name = dict(zip(binding.output_order, io.get_outputs()))
        return [by_name[n].numpy() for n in fetch]

    def _run_unbound(self, feeds: Mapping[str, np.ndarray], out: Mapping[str, np.ndarray], fetch: list[str],
                     state: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """IOBindings cannot bind string tensors: run with plain feeds and copy the outputs into ``out``."""
        feeds = {k: v for k, v in feeds.items() if k in self.input_names}
        results = self._session.run([*out, *fetch], {**state, **feeds}, self._run_options)
        for target, value in zip(out.values(), results):
            target[...] = value
        return results[len(out):]
