"""Graph passes in the style of onnx-ir: ``pass_(model) -> PassResult(model, modified)``.

A pass implements :meth:`Pass.call`; calling the pass object runs it and, when it changed the model, checks
its postconditions: the ONNX checker (``full_check=True``) passes and every node and opset import is in the
default domain, so the result still runs on any stock onnxruntime. A pass that cannot do its rewrite raises
:class:`~onnxtrain.errors.PassError`; it never returns ``None`` for "did not apply".
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import onnx

from onnxtrain.errors import OnnxTrainError, PassError
from onnxtrain.ir.files import PROTO_LIMIT

__all__ = ["PassResult", "Pass", "check_default_domain"]

logger = logging.getLogger(__name__)



@dataclass(frozen=True)
class PassResult:
    """What a pass returns: the model (a new object or the one given) and whether it differs from the input."""

    model: onnx.ModelProto
    modified: bool


def check_default_domain(model: onnx.ModelProto, what: str) -> None:
    """PassError unless every opset import and node of ``model`` is in the default (ai.onnx) domain."""
    domains = {op.domain for op in model.opset_import} | {n.domain for n in model.graph.node}
    other = sorted(domains - {"", "ai.onnx"})
    if other:
        raise PassError(f"{what} produced a model with the domains {other}; artifacts use the default domain only")


class Pass:
    """Base class of a pass over a whole model. Subclasses implement :meth:`call` and document the cases
    they handle; ``__call__`` runs it and checks the postconditions."""

    def call(self, model: onnx.ModelProto) -> PassResult:
        """The rewrite itself; raises PassError when the model is not one the pass can rewrite."""
        raise NotImplementedError

    @property
    def name(self) -> str:
        return type(self).__name__

    def __call__(self, model: onnx.ModelProto) -> PassResult:
        try:
            result = self.call(model)
        except OnnxTrainError:
            raise
        except Exception as exc:  # a bug in the pass, or a model it does not expect: name the pass
            raise PassError(f"the {self.name} pass failed: {type(exc).__name__}: {exc}") from exc
        if result.modified:
            self.ensures(result.model)
        return result

    def ensures(self, model: onnx.ModelProto) -> None:
        """The postconditions: the default domain only, and the ONNX checker with ``full_check``."""
        check_default_domain(model, f"the {self.name} pass")
        if model.ByteSize() >= PROTO_LIMIT:
            logger.info("%s: the model is over 2 GB, so the ONNX checker is skipped", self.name)
            return
        try:
            onnx.checker.check_model(model, full_check=True)
        except Exception as exc:  # ValidationError, InferenceError, and decoding errors for damaged strings
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
            raise PassError(f"the {self.name} pass produced an invalid model: {first}") from None
