"""StagedFiles (ir/files.py): a set of files written on a background thread, renamed together on commit, and
never half-replaced."""

from __future__ import annotations

import os

import pytest

from onnxtrain.ir.files import StagedFiles


def test_commit_replaces_every_file(tmp_path):
    (tmp_path / "a").write_bytes(b"old")
    with StagedFiles() as files:
        files.stage(tmp_path / "a", b"new a")
        files.stage(tmp_path / "b", lambda: [b"new ", b"b"])
        assert (tmp_path / "a").read_bytes() == b"old"  # staged, not yet renamed
        files.commit()
    assert (tmp_path / "a").read_bytes() == b"new a" and (tmp_path / "b").read_bytes() == b"new b"
    assert sorted(os.listdir(tmp_path)) == ["a", "b"]


def test_an_error_before_commit_leaves_every_target_untouched(tmp_path):
    (tmp_path / "a").write_bytes(b"old")
    with pytest.raises(RuntimeError, match="graph building failed"), StagedFiles() as files:
        files.stage(tmp_path / "a", b"new a")
        files.stage(tmp_path / "b", b"new b", wait=True)
        raise RuntimeError("graph building failed")
    assert os.listdir(tmp_path) == ["a"] and (tmp_path / "a").read_bytes() == b"old"


def test_a_file_that_cannot_be_computed_fails_the_commit_and_renames_nothing(tmp_path):
    def broken():
        raise ValueError("bad checkpoint data")

    with pytest.raises(ValueError, match="bad checkpoint data"), StagedFiles() as files:
        files.stage(tmp_path / "a", b"new a")
        files.stage(tmp_path / "b", broken)
        files.commit()
    assert os.listdir(tmp_path) == []


def test_discard_removes_the_staged_files(tmp_path):
    with StagedFiles() as files:
        files.stage(tmp_path / "a", b"new a")
        files.discard()
        files.stage(tmp_path / "b", b"new b")
        files.commit()
    assert os.listdir(tmp_path) == ["b"]
