"""Pure-Python execution with onnx.reference.ReferenceEvaluator (slow, dependency-free, exact spec)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator

from onnxtrain.runtime.backends.base import Session
from onnxtrain.runtime.backends.reference_ops import PATCHED_OPS, name_omitted_outputs

__all__ = ["ReferenceSession"]


class ReferenceSession(Session):
    def __init__(self, model: onnx.ModelProto):
        super().__init__(model)
        self._evaluator = ReferenceEvaluator(name_omitted_outputs(model), new_ops=PATCHED_OPS)

    def run(self, feeds: Mapping[str, np.ndarray], out: Mapping[str, np.ndarray], fetch: list[str],
            state: Mapping[str, np.ndarray] | None = None) -> list[np.ndarray]:
        names = [*out, *fetch]
        inputs = {k: v for k, v in {**(state or {}), **feeds}.items() if k in self.input_names}
        results = self._evaluator.run(names, inputs)
        for dest, value in zip(out.values(), results):
            np.copyto(dest, np.asarray(value).reshape(dest.shape))
        return [np.asarray(v) for v in results[len(out):]]
