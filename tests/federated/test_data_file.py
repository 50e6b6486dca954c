"""The ClientApp reads a device's data file through onnxtrain.data."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("flwr")

from onnxtrain.data.dataset import DatasetError  # noqa: E402
from onnxtrain.federated.client import _load_npz  # noqa: E402


def test_validation_arrays_are_used_when_present(tmp_path):
    x, y = np.ones((4, 2), np.float32), np.arange(4)
    np.savez(tmp_path / "a.npz", x=x, y=y)
    np.savez(tmp_path / "b.npz", x=x, y=y, x_val=x[:1] * 2, y_val=y[:1])
    xa, ya, xva, yva = _load_npz(str(tmp_path / "a.npz"))
    assert xva is not None and np.array_equal(xva, x) and np.array_equal(yva, y)
    *_, xvb, yvb = _load_npz(str(tmp_path / "b.npz"))
    assert xvb.shape == (1, 2) and float(xvb[0, 0]) == 2.0 and yvb.tolist() == [0]


def test_a_file_without_labels_names_what_is_missing(tmp_path):
    np.savez(tmp_path / "c.npz", x=np.ones((2, 2)))
    with pytest.raises(DatasetError, match="no array 'y'"):
        _load_npz(str(tmp_path / "c.npz"))
    np.savez(tmp_path / "d.npz", x=np.ones((2, 2)), y=np.arange(3))
    with pytest.raises(DatasetError, match="x has 2 examples but y has 3"):
        _load_npz(str(tmp_path / "d.npz"))
