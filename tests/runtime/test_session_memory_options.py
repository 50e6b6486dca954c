"""onnxtrain's onnxruntime sessions run without a memory pattern and without planned buffer reuse: with static
shapes both keep blocks of the shared arena pinned to one size, which raised a LoRA step's peak on a BERT by
27 MB (docs/lora.md). Both are module-level switches, so that they can be measured again."""

from __future__ import annotations

import onnxruntime as ort

from onnxtrain.runtime.backends import ort as backend
from tests import models


def test_sessions_plan_no_memory_pattern_and_no_buffer_reuse():
    so = ort.SessionOptions()
    assert so.enable_mem_pattern and so.enable_mem_reuse  # onnxruntime's defaults
    session = backend.OrtSession(models.mlp(), so)
    options = session._session.get_session_options()  # the InferenceSession's copy, as it was created
    assert not options.enable_mem_pattern
    assert not options.enable_mem_reuse
