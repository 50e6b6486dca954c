"""onnxruntime execution with IOBinding: persistent buffers are wrapped once and bound without copies."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
import onnxruntime as ort

from onnxtrain.runtime.backends.base import Session

__all__ = ["OrtSession"]


class OrtSession(Session):
    """One InferenceSession plus one IOBinding that is only re-bound where an array changed."""

    def __init__(self, model: onnx.ModelProto, session_options: ort.SessionOptions | None = None):
        super().__init__(model)
        self._session = ort.InferenceSession(model.SerializeToString(), sess_options=session_options,
                                             providers=["CPUExecutionProvider"])
        self._binding = self._session.io_binding()
        self._bound: dict[str, np.ndarray] = {}      # name -> array currently bound (kept alive here)
        self._fetched: list[str] | None = None
        self._output_order: list[str] = []            # IOBinding returns outputs in first-bound order

    def _bind_input(self, name: str, array: np.ndarray) -> None:
        if self._bound.get(name) is array:
            return
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)
        self._binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(array))
        self._bound[name] = array

    def _bind_output(self, name: str, array: np.ndarray) -> None:
        key = "\0out:" + name
        if self._bound.get(key) is array:
            return
        self._binding.bind_ortvalue_output(name, ort.OrtValue.ortvalue_from_numpy(array))
        self._bound[key] = array
        if name not in self._output_order:
            self._output_order.append(name)

    def run(self, feeds: Mapping[str, np.ndarray], out: Mapping[str, np.ndarray],
            fetch: list[str]) -> list[np.ndarray]:
        for name, array in feeds.items():
            if name in self.input_names:
                self._bind_input(name, array)
        for name, array in out.items():
            self._bind_output(name, array)
        # Re-bind fetched outputs on every run: after a run the binding holds the OrtValues it allocated, which
        # would be reused as pre-allocated outputs next time (failing when the batch size changes) and returned
        # again as views, so an array returned by one run would be overwritten by the next.
        for name in fetch:
            self._binding.bind_output(name, "cpu")
            if name not in self._output_order:
                self._output_order.append(name)
        self._fetched = list(fetch)
        self._session.run_with_iobinding(self._binding)
        if not fetch:
            return []
        by_name = dict(zip(self._output_order, self._binding.get_outputs()))
        return [by_name[n].numpy() for n in fetch]
