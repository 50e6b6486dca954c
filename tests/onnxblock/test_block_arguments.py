"""A block called with inputs its ``build`` does not take is a TypeError naming the block, the inputs it was given
and its build signature (the peer's raises Python's bare ``build() missing 1 required positional argument``)."""

from __future__ import annotations

import pytest

import onnxtrain.onnxblock as onnxblock
from tests import models


class _Training(onnxblock.TrainingBlock):
    def __init__(self):
        super().__init__()
        self.loss = onnxblock.loss.CrossEntropyLoss()

    def build(self, output_name):
        return self.loss(output_name)


class _TwoInputs(onnxblock.Block):
    def build(self, a, b):
        return onnxblock.blocks.Add()(a, b)


def test_library_user_and_training_blocks_name_their_inputs():
    with onnxblock.base(models.mlp()):
        with pytest.raises(TypeError, match=r"^Add was called with 3 input\(s\) \['output', 'output', 'output'\], "
                                            r"which its build\(a: 'str'.*too many positional arguments$"):
            onnxblock.blocks.Add()("output", "output", "output")
        with pytest.raises(TypeError, match=r"_TwoInputs was called with 1 input\(s\) \['output'\].*missing a "
                                            r"required argument: 'b' \(a custom loss given to generate_artifacts"):
            _TwoInputs()("output")
        with pytest.raises(TypeError, match=r"_Training was called with 2 input\(s\) \['output', 'extra'\], which "
                                            r"its build\(output_name\) does not take: too many positional arguments$"):
            _Training()("output", "extra")
        assert _TwoInputs()("output", "output")  # the right inputs build
