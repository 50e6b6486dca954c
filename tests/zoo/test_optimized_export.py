"""torch.onnx.export with its defaults (the dynamo exporter and its graph optimizer, optimize=True): the
optimizer stores a Linear's weight transposed under a made-up name, merges equal tensors and drops zero biases;
the artifacts still train torch's parameters under torch's names, with torch's gradients
(artifacts/torch_names.py). Models without BatchNorm (the optimizer folds an eval-mode BatchNorm into its
convolution, which no name can undo: tests/artifacts/test_torch_names.py)."""

from __future__ import annotations

import pytest

from onnxtrain import artifacts
from tests.zoo.expected_failures import EXPECTED_FAILURES
from tests.zoo.harness import check_gradients

EXPORTER = "dynamo-optimized"
MODELS = ("bert", "distilbert", "roberta", "gpt2", "llama", "albert", "deberta_v2", "vit", "t5_encoder", "qwen2",
          "mobilebert")
# The optimizer computes a constant from a parameter where the model reads it through constant indices: the
# parameter is gone, and a requires_grad list naming it gets an error that says where it went.
FOLDED = {"whisper": "model.encoder.embed_positions.weight",            # the positions of its fixed length
          "swin": "layers.0.blocks.0.attn.relative_position_bias_table",  # gathered by a constant index table
          "convnext_atto": "stages.0.blocks.0.gamma",                     # reshaped to (C, 1, 1)
          "poolformer": "stages.0.blocks.0.norm1.weight"}                 # a GroupNorm's scale, reshaped


def _params():
    for name in MODELS:
        for check in ("base", "batch"):
            marks = [pytest.mark.slow]
            reason = EXPECTED_FAILURES.get((name, "dynamo", check)) or EXPECTED_FAILURES.get((name, "dynamo"))
            if reason:   # as with optimize=False
                marks.append(pytest.mark.xfail(reason=reason, strict=True))
            yield pytest.param(name, check, marks=marks, id=f"{name}-{check}")


@pytest.mark.parametrize("name,check", _params())
def test_gradients_of_the_optimized_export_match_torch(zoo_run, name, check):
    check_gradients(zoo_run(name, EXPORTER), check)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FOLDED))
def test_a_parameter_folded_into_a_constant_is_named_in_the_error(zoo_run, name, tmp_path):
    run = zoo_run(name, EXPORTER)
    names = [n for n, _ in run.model.named_parameters()]
    assert FOLDED[name] in names
    with pytest.raises(ValueError, match=rf"'{FOLDED[name]}' is not an initializer of the model: torch.onnx.export's "
                                         r"graph optimizer .* folded it into the constant .*optimize=False"):
        artifacts.generate_artifacts(str(run.onnx_path), requires_grad=names, artifact_directory=tmp_path,
                                     loss=artifacts.LossType.CrossEntropyLoss)
