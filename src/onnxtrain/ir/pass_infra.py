"""Graph passes in the style of onnx-ir: ``pass_(model) -> PassResult(model, modified)``.

A pass implements :meth:`Pass.call`; calling the pass object runs it and, when it changed the model, checks
its postconditions: the ONNX checker (``full_check=True``) passes and every node and opset import is in the
default domain, so the result still runs on any stock onnxruntime. A pass that cannot do its rewrite raises
:class:`~onnxtrain.errors.PassError`; it never returns ``None`` for "did not apply".

:class:`PassManager` runs several passes and checks those postconditions once, on the last result: the full ONNX
check runs shape inference over the whole model, which on a large training graph costs as much as a pass.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import onnx

from onnxtrain.errors import OnnxTrainError, PassError, first_line
from onnxtrain.ir.files import PROTO_LIMIT
from onnxtrain.ir.passes import shared_node_indices

__all__ = ["PassResult", "Pass", "PassManager", "check_default_domain"]

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
        result = self.run(model)
        if result.modified:
            self.ensures(result.model)
        return result

    def run(self, model: onnx.ModelProto) -> PassResult:
        """:meth:`call`, with any failure reported as a PassError naming the pass; the postconditions are left
        to the caller (:class:`PassManager` checks them once for several passes)."""
        try:
            return self.call(model)
        except OnnxTrainError:
            raise
        except Exception as exc:  # a bug in the pass, or a model it does not expect: name the pass
            raise PassError(f"the {self.name} pass failed: {type(exc).__name__}: {exc}") from exc

    def ensures(self, model: onnx.ModelProto) -> None:
        """The postconditions: the default domain only, and the ONNX checker with ``full_check``."""
        check_default_domain(model, f"the {self.name} pass")
        if model.ByteSize() >= PROTO_LIMIT:
            logger.info("%s: the model is over 2 GB, so the ONNX checker is skipped", self.name)
            return
        try:
            onnx.checker.check_model(model, full_check=True)
        except Exception as exc:  # ValidationError, InferenceError, and decoding errors for damaged strings
            raise PassError(f"the {self.name} pass produced an invalid model: {first_line(exc)}") from None


class PassManager:
    """Run ``passes`` in order, each on the previous one's result, and check the postconditions once, on the
    final model (as a pass's own ``__call__`` would have checked its result). A pass with postconditions of its
    own (an overridden :meth:`Pass.ensures`) is also checked on its own result.

    When the final check fails, the results of the earlier passes are checked in order, so that the PassError
    names the first pass that produced an invalid model, as checking after every pass would.
    """

    def __init__(self, passes: Sequence[Pass]):
        self.passes = list(passes)

    def __call__(self, model: onnx.ModelProto) -> PassResult:
        produced: list[tuple[Pass, onnx.ModelProto]] = []
        with shared_node_indices():  # a pass that changes nothing leaves its index to the next one
            for pass_ in self.passes:
                result = pass_.run(model)
                if result.modified:
                    produced.append((pass_, result.model))
                    model = result.model
                    if type(pass_).ensures is not Pass.ensures:
                        pass_.ensures(model)
        if not produced:
            return PassResult(model, False)
        last, final = produced[-1]
        try:
            Pass.ensures(last, final)
        except PassError:
            for pass_, result_model in produced[:-1]:
                Pass.ensures(pass_, result_model)
            raise
        return PassResult(final, True)
