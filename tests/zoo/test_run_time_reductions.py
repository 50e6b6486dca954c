"""Exports whose sizes the solvers of ir/symbolic.py name completely: their training graphs reduce no gradient
over axes computed at run time (Shape, Equal, NonZero, ReduceSum). Each case below had such reductions before its
fix, and a regression in the naming brings them back without changing a single gradient, which the zoo's other
checks could not see. The ResNet-18 and BERT TorchScript exports run by default (the zoo's quick ones), the rest with
``-m slow``."""

from __future__ import annotations

import onnx
import pytest

CASES = [
    ("resnet18", "torchscript-train", False),  # convolutions over a dynamic height and width: 16 before
    ("bert", "torchscript-eval", False),       # position ids sliced to the sequence read from a shape: 4 before
    ("bert", "dynamo", True),                  # the exporter's declared Min(32, s27) and sympy sizes: 13 before
    ("gpt2", "dynamo", True),                  # a declared causal mask's Expand read by an undeclared Where
    ("wav2vec2", "torchscript-eval", True),    # the positional convolution trimmed by [:, :, :-1]: 10 before
    ("wav2vec2", "dynamo", True),              # ((s27//10)) - 1 declared for floor((s27-10)/10): 29 before
    ("segformer", "dynamo", True),             # 14 before
    ("deberta_v2", "torchscript-eval", True),  # batch times heads as a product name: 14 before
    ("davit", "torchscript-train", True),      # windows padded by F.pad with pads computed at run time: 40 before
    ("coat", "torchscript-train", True),       # the same F.pad pattern: 16 before
    ("efficientformerv2", "torchscript-train", True),  # Resize by scales written as Concat([1, 1], [2, 2]): 17 before
    ("twins_svt", "torchscript-train", True),  # tokens back on a grid of (height // 4) rows: 8 before
]


@pytest.mark.parametrize("name,exporter", [pytest.param(n, e, marks=[pytest.mark.slow] if slow else [],
                                                        id=f"{n}-{e}") for n, e, slow in CASES])
def test_no_gradient_reduces_over_axes_computed_at_run_time(zoo_run, name, exporter):
    run = zoo_run(name, exporter)
    run.require_artifacts()
    training = onnx.load(str(run.artifacts / "training_model.onnx"))
    reductions = [n.name for n in training.graph.node if n.op_type == "NonZero"]
    assert not reductions, f"{len(reductions)} run-time reductions, e.g. {reductions[:3]}"
