"""Running a session: a failure inside the engine becomes one readable ExecutionError."""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np

from onnxtrain.conventions import CLASS_LOSSES
from onnxtrain.errors import ExecutionError, NonFiniteError, OnnxTrainError
from onnxtrain.runtime.size_limits import exceeded

__all__ = ["run_session"]

_NODE = re.compile(r"running (\w+) node(?:\. Name:'([^']*)')?")
# onnxruntime's checks of the feeds against the graph's declared inputs, before any node runs
_SHAPE_MESSAGE = re.compile(r"invalid dimensions|Invalid rank|Unexpected input data type", re.IGNORECASE)
# the ops where a class label (or another index) out of range fails; elsewhere that hint would mislead
_INDEX_READERS = CLASS_LOSSES | {"OneHot", "Gather", "GatherElements", "GatherND", "ScatterElements", "ScatterND"}
# onnxruntime's arena, or the C++ allocator under it, out of memory
_OUT_OF_MEMORY = re.compile(r"Failed to allocate memory|bad_alloc", re.IGNORECASE)
_REQUESTED = re.compile(r"requested buffer of size (\d+)")
_MEMORY_HINT = ("out of memory: try a smaller batch or sequence; when training, Optimizer(..., "
                "update_in_backward=True) holds no gradient vector (one copy of the trained parameters less), and "
                "freezing layers (frozen_params, trainable_ops=N) or LoRA trains fewer; docs/memory.md")


def _engine_message(exc: BaseException) -> str:
    """What the engine said, on one line, without onnxruntime's status prefix and source locations."""
    text = " ".join(str(exc).split())
    text = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", text)
    if "Status Message:" in text:
        text = text.split("Status Message:", 1)[1].strip()
        text = re.sub(r"^\S+\.(cc|h|cpp):\d+ (.*?\] )?", "", text)
    return text[:300] or type(exc).__name__


def run_session(session, what: str, *args, **kwargs) -> list[np.ndarray]:
    """``session.run(...)``; a failure inside the engine becomes an ExecutionError naming ``what`` and the node."""
    try:
        return session.run(*args, **kwargs)
    except OnnxTrainError:
        raise
    except Exception as exc:  # onnxruntime and onnx.reference raise their own types
        node = _NODE.search(str(exc))
        where = f" in a {node.group(1)} node" if node else ""
        where += f" ({node.group(2)!r})" if node and node.group(2) else ""
        index = node.group(1) in _INDEX_READERS if node else not _SHAPE_MESSAGE.search(str(exc))
        failed = f"the {what} failed{where}: {_engine_message(exc)}"
        feeds = args[0] if args and isinstance(args[0], Mapping) else {}
        nonfinite = _first_nonfinite(feeds)
        if nonfinite:
            # a kernel may stop on NaN where the loss would have shown it (MaxUnpool in onnxruntime 1.17-1.23)
            raise NonFiniteError(f"{failed}; input {nonfinite}: check the inputs for NaN/inf") from None
        too_long = exceeded(session.size_limits(), feeds) if hasattr(session, "size_limits") else ""
        if too_long:
            raise ExecutionError(f"{failed} ({too_long})") from None
        if _OUT_OF_MEMORY.search(str(exc)):
            size = _REQUESTED.search(str(exc))
            said = (f"onnxruntime could not allocate {int(size.group(1)) / 2**20:,.0f} MiB" if size
                    else _engine_message(exc))
            raise ExecutionError(f"the {what} failed{where}: {said} ({_MEMORY_HINT})") from None
        hint = ("check the inputs' shapes and values" if not index
                else "check the input values, e.g. token ids must be below the embedding's vocabulary size"
                if node and node.group(1) == "Gather"
                else "check the input values, e.g. class labels must be below the number of classes")
        raise ExecutionError(f"{failed} ({hint})") from None


def _first_nonfinite(feeds: Mapping[str, np.ndarray]) -> str:
    """'x' holds nan at index [0, 0, 1, 2]: the first floating-point feed with a NaN or infinity, or ''."""
    for name, array in feeds.items():
        if isinstance(array, np.ndarray) and array.dtype.kind == "f" and array.size and not np.isfinite(array).all():
            where = np.unravel_index(int(np.argmax(~np.isfinite(array))), array.shape)
            return f"{name!r} holds {array[where]} at index {list(map(int, where))}"
    return ""
