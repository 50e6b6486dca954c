"""generate_artifacts without its memory passes (GeluBackward, ShapesInForward, RecomputeInBackward,
BackwardOrder), for the tests of those passes: they start from the training graph as the autodiff built it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from unittest import mock

import onnx

from onnxtrain.ir.pass_infra import Pass, PassResult

PASSES = ("GeluBackward", "ShapesInForward", "RecomputeInBackward", "BackwardOrder")


class _Identity(Pass):
    def __init__(self, *args, **kwargs):  # whatever the pass it stands for is given
        pass

    def call(self, model: onnx.ModelProto) -> PassResult:
        return PassResult(model, False)


@contextlib.contextmanager
def as_built(keep: tuple[str, ...] = ()) -> Iterator[None]:
    """Within this block generate_artifacts skips its memory passes, but those named in ``keep``."""
    with contextlib.ExitStack() as stack:
        for name in PASSES:
            if name not in keep:
                stack.enter_context(mock.patch(f"onnxtrain.artifacts.generate.{name}", _Identity))
        yield
