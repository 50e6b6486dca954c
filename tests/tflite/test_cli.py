"""`onnxtrain import` and `export --format`: user errors end in one line that says what to do."""

from __future__ import annotations

import pytest

from tests.cli.conftest import assert_one_line_error, hide_modules, run_cli

pytest.importorskip("tflite")


def test_cli_errors_are_one_line(model_path, tmp_path):
    bad = tmp_path / "bad.tflite"
    bad.write_bytes(b"\x00" * 32)
    assert_one_line_error(run_cli("import", bad, "-o", tmp_path / "m.onnx"), "not a TensorFlow Lite or circle model")
    assert not (tmp_path / "m.onnx").exists()
    onnx_model = tmp_path / "mlp.onnx"
    assert run_cli("import", model_path("mlp.tflite"), "-o", onnx_model).returncode == 0
    assert_one_line_error(run_cli("generate", onnx_model, "-o", tmp_path / "art", "--loss", "mse",
                                  "--trainable-ops", "1", "--requires-grad", "x"), "requires_grad", "'x'")


def test_import_without_the_schema_package_says_what_to_install(model_path, tmp_path):
    hidden = hide_modules(tmp_path / "hidden", "tflite", "circle_schema")
    proc = run_cli("import", model_path("mlp.tflite"), "-o", tmp_path / "m.onnx", env_path=hidden)
    assert_one_line_error(proc, "needs the `tflite` package", "pip install 'onnxtrain[tflite]'")
    proc = run_cli("import", model_path("mlp.circle"), "-o", tmp_path / "m.onnx", env_path=hidden)
    assert_one_line_error(proc, "needs the `circle-schema` package")


@pytest.mark.parametrize("keep", [3000, 20000])
def test_truncated_file(model_path, tmp_path, keep):
    bad = tmp_path / "cut.tflite"
    bad.write_bytes(model_path("mlp.tflite").read_bytes()[:keep])
    assert_one_line_error(run_cli("import", bad, "-o", tmp_path / "m.onnx"), "is not a valid tflite file: it is "
                          "truncated or corrupt")
