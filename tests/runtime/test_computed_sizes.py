"""A declared input size computed from other sizes (a causal language model's labels, one token shorter than
its input: ``s27-1`` in torch's dynamo export) is checked before the run, as a plain symbol is."""

from __future__ import annotations

import numpy as np
import pytest

from onnxtrain.errors import InputError
from onnxtrain.runtime.backends.base import TensorMeta
from onnxtrain.runtime.inputs import check_inputs

IDS = TensorMeta("input_ids", np.dtype(np.int64), ("s77", "s27"))


@pytest.mark.parametrize("declared, good, bad", [
    ("s27-1", 7, 8),
    ("s27 - 1", 7, 6),
    ("2*s27", 16, 8),
    ("floor((s27+1)/2)", 4, 5),
    ("((s27//3)) - 1", 1, 2),
    ("max(s27, 10)", 10, 8),
])
def test_a_size_computed_from_another_input_is_checked(declared, good, bad):
    labels = TensorMeta("labels", np.dtype(np.int64), ("s77", declared))
    ids = np.zeros((2, 8), np.int64)
    check_inputs([IDS, labels], [ids, np.zeros((2, good), np.int64)], "training step")
    with pytest.raises(InputError, match=rf"training step: input 'labels' expects .*={good} on axis 1 "
                                         rf"\(s27=8 from the other inputs\), got shape \[2, {bad}\]"):
        check_inputs([IDS, labels], [ids, np.zeros((2, bad), np.int64)], "training step")


@pytest.mark.parametrize("declared", ["s27-1", "Mod(s27, 2)", "unk__3", "batch_size"])
def test_sizes_that_cannot_be_computed_are_left_to_the_engine(declared):
    """A size reading a symbol no input declares alone, or written in a form the checker does not read, is not
    refused (only an equal symbol on two inputs must agree)."""
    other = TensorMeta("x", np.dtype(np.float32), ("batch", declared))
    check_inputs([other], [np.zeros((2, 5), np.float32)], "eval step")
