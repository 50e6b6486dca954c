"""generate_artifacts' argument mistakes: a clear error before anything is written, and no folder left behind
(each case failed before: a TypeError from a comparison inside, a loss of 0 that trains nothing, an empty
artifact folder)."""

from __future__ import annotations

import pytest

from onnxtrain.artifacts import LossType, OptimType, generate_artifacts
from tests import models


@pytest.mark.parametrize("value", ["2", None, 2.0, True])
def test_trainable_ops_must_be_an_int(tmp_path, value):
    with pytest.raises(TypeError, match=r"trainable_ops must be an int \(-1: every parameter, 0: none, N: the "
                                        r"parameters of the last N ops\), got"):
        generate_artifacts(models.mlp(), loss=LossType.CrossEntropyLoss, artifact_directory=tmp_path / "out",
                           trainable_ops=value)
    assert not (tmp_path / "out").exists()


def test_cross_entropy_over_one_class_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"CrossEntropyLoss reads 'output' float32\[batch, 1\], scores of one class: "
                                         r".* use LossType.MSELoss"):
        generate_artifacts(models.mlp(classes=1), loss=LossType.CrossEntropyLoss, optimizer=OptimType.AdamW,
                           artifact_directory=tmp_path / "out")
    assert not (tmp_path / "out").exists()
    generate_artifacts(models.mlp(classes=2), loss=LossType.CrossEntropyLoss, artifact_directory=tmp_path / "two")


def test_a_failed_generation_leaves_no_folder(tmp_path):
    target = tmp_path / "new" / "nested" / "artifacts"
    with pytest.raises(ValueError, match=r"requires_grad: 'fc.weight' is not an initializer"):
        generate_artifacts(models.mlp(), requires_grad=["fc.weight"], loss=LossType.CrossEntropyLoss,
                           artifact_directory=target)
    assert not (tmp_path / "new").exists()
    # a folder that existed before stays, with what it held
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError):
        generate_artifacts(models.mlp(), requires_grad=["fc.weight"], loss=LossType.CrossEntropyLoss,
                           artifact_directory=tmp_path / "kept")
    assert [p.name for p in (tmp_path / "kept").iterdir()] == ["notes.txt"]
