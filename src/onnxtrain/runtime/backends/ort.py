"""onnxruntime execution with IOBinding: persistent buffers are bound once and the bindings are reused."""

from __future__ import annotations

import ctypes
import sys
from collections import OrderedDict
from collections.abc import Mapping

import numpy as np
import onnx
import onnxruntime as ort

from onnxtrain.runtime.backends import names_providers
from onnxtrain.runtime.backends.base import Session

__all__ = ["OrtSession", "copy_session_options"]

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


# onnxruntime's Python API cannot copy a SessionOptions, and initializers supplied with add_external_initializers
# belong to the options object (every name must then be in the model): a session with its own constants gets a
# copy made of these attributes and of the config entries among _CONFIG_KEYS that are set.
_OPTION_ATTRIBUTES = (
    "enable_cpu_mem_arena", "enable_mem_pattern", "enable_mem_reuse", "enable_profiling", "execution_mode",
    "execution_order", "graph_optimization_level", "inter_op_num_threads", "intra_op_num_threads",
    "log_severity_level", "log_verbosity_level", "logid", "optimized_model_filepath", "profile_file_prefix",
    "use_deterministic_compute")
_CONFIG_KEYS = (  # onnxruntime_session_options_config_keys.h, the keys that apply to the CPU provider
    "session.disable_prepacking", "session.use_env_allocators", "session.load_model_format",
    "session.save_model_format", "session.set_denormal_as_zero", "session.disable_quant_qdq",
    "session.disable_double_qdq_remover", "session.enable_quant_qdq_cleanup",
    "optimization.enable_gelu_approximation", "optimization.disable_specified_optimizers",
    "optimization.enable_cast_chain_elimination", "optimization.minimal_build_optimizations",
    "optimization.constant_folding_max_output_size_in_bytes", "session.disable_aot_function_inlining",
    "session.inter_op.allow_spinning", "session.intra_op.allow_spinning", "session.inter_op.spin_duration_us",
    "session.intra_op.spin_duration_us", "session.inter_op.spin_backoff_max", "session.intra_op.spin_backoff_max",
    "session.force_spinning_stop", "session.use_ort_model_bytes_directly",
    "session.use_ort_model_bytes_for_initializers", "session.qdqisint8allowed", "session.x64quantprecision",
    "session.intra_op_thread_affinities", "session.use_device_allocator_for_initializers",
    "session.strict_shape_type_inference", "session.allow_released_opsets_only",
    "session.node_partition_config_file", "session.dynamic_block_base", "session.disable_cpu_ep_fallback",
    "session.graph_optimizations_loop_level", "session.optimized_model_external_initializers_file_name",
    "session.optimized_model_external_initializers_min_size_in_bytes", "session.enable_saved_runtime_optimizations",
    "session.use_deterministic_compute", "session.debug_layout_transformation", "session.prepack.enable_parallel",
    "session.record_ep_graph_assignment_info", "session.collect_node_memory_stats_to_file",
    "session.qdq_matmulnbits_accuracy_level", "session.enable_dq_matmulnbits_fusion",
    "session.kernel_dispatch_policy", "mlas.enable_gemm_fastmath_arm64_bfloat16", "mlas.disable_kleidiai",
    "mlas.nchwc_depthwise_sliding", "mlas.nchwc_pointwise_conv_max_input_channel_batch", "mlas.qnbit.force_fp32",
    "mlas.use_lut_gemm")


def copy_session_options(options: ort.SessionOptions | None) -> ort.SessionOptions | None:
    """A new SessionOptions with the attributes of ``options`` and its config entries among onnxruntime's
    documented CPU keys; None if ``options`` names execution providers of its own (they cannot be read back).
    Free-dimension overrides, custom-op libraries and initializers added to ``options`` are not carried."""
    copy = ort.SessionOptions()
    if options is None:
        return copy
    if names_providers(options):
        return None
    for name in _OPTION_ATTRIBUTES:
        if hasattr(options, name):
            setattr(copy, name, getattr(options, name))
    for key in _CONFIG_KEYS:
        try:
            value = options.get_session_config_entry(key)
        except RuntimeError:  # not set
            continue
        copy.add_session_config_entry(key, value)
    return copy


def _return_freed_memory() -> None:
    """Give the heap's free pages back to the system (glibc only). Opening a session that folds constants
    allocates and frees several copies of them: on ResNet-18's frozen backbone, 70 MB stayed resident."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None).malloc_trim(0)  # the process's own symbols: glibc's malloc_trim
        except (OSError, AttributeError):  # another C library
            pass


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
                 memory_arena: bool = True, constants: Mapping[str, np.ndarray] | None = None):
        super().__init__(model)
        # Initializers whose data the session takes from these arrays (kept alive as long as the session).
        self._constants = [ort.OrtValue.ortvalue_from_numpy(np.asarray(a, order="C"))
                           for a in (constants or {}).values()]
        if constants:
            session_options = copy_session_options(session_options)
            if session_options is None:
                raise ValueError("constants need SessionOptions without execution providers of their own")
            session_options.add_external_initializers(list(constants), self._constants)
        elif session_options is None:
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
        if constants:
            _return_freed_memory()
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
                io.bind_cpu_input(name, np.asarray(array, order="C"))
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
