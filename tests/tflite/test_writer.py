"""Writing weights back refuses what does not fit, naming the tensor."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from onnxtrain.tflite import SourceRecord, write_back

pytest.importorskip("tflite")


@pytest.fixture(scope="module")
def record(model_path):
    from onnxtrain.tflite import import_model

    return SourceRecord.from_model(import_model(model_path("mlp.tflite")))


def _weights(record):
    return {n: np.zeros(s.shape, np.float32) for n, s in record.weights.items()}


def test_unchanged_weights_give_the_original_file(record, model_path, tmp_path):
    from onnxtrain.tflite.reader import read_flatbuffer

    flat = read_flatbuffer(model_path("mlp.tflite").read_bytes())
    weights = {n: flat.tensors[[t.name for t in flat.tensors].index(s.tensors[0])].data
               for n, s in record.weights.items()}
    write_back(record, weights, tmp_path / "same.tflite")
    assert (tmp_path / "same.tflite").read_bytes() == model_path("mlp.tflite").read_bytes()


def test_missing_weight(record, tmp_path):
    weights = _weights(record)
    name = next(iter(weights))
    del weights[name]
    with pytest.raises(KeyError, match=f"no tensor '{name}'"):
        write_back(record, weights, tmp_path / "out.tflite")


def test_wrong_shape_and_nan(record, tmp_path):
    weights = _weights(record)
    name = next(iter(weights))
    weights[name] = np.zeros((3, 3), np.float32)
    with pytest.raises(ValueError, match=rf"'{name}' has shape \[3, 3\], the tflite tensor has"):
        write_back(record, weights, tmp_path / "out.tflite")
    weights[name] = np.full(record.weights[name].shape, np.nan, np.float32)
    with pytest.raises(ValueError, match="NaN or infinite"):
        write_back(record, weights, tmp_path / "out.tflite")
    assert not (tmp_path / "out.tflite").exists()


def test_a_model_not_imported_has_no_source():
    model = onnx.helper.make_model(onnx.helper.make_graph([], "g", [], []))
    with pytest.raises(ValueError, match="was not imported from a .tflite or .circle file"):
        SourceRecord.from_model(model)


def test_buffers_stored_after_the_flatbuffer(tmp_path):
    """Models over 2 GB keep buffers after the flatbuffer (Buffer.offset / size): read and written in place."""
    pytest.importorskip("circle_schema")
    from onnxtrain.tflite.importer import convert
    from onnxtrain.tflite.reader import read_flatbuffer
    from tests.tflite.conftest import run_litert
    from tests.tflite.flatbuild import Graph

    rng = np.random.default_rng(0)
    g = Graph()
    weight, bias = rng.normal(size=(4, 6)).astype(np.float32), rng.normal(size=4).astype(np.float32)
    y = g.op("FULLY_CONNECTED", [g.input("x", [1, 6]), g.const("w", weight, outside=True),
                                 g.const("b", bias, outside=True)], "y", [1, 4], "FullyConnectedOptions")
    data = g.build([y])
    flat = read_flatbuffer(data)
    slot = flat.tensors[1].location
    assert slot == (len(data) - bias.nbytes - weight.nbytes, weight.nbytes)  # the last bytes of the file
    assert np.array_equal(flat.tensors[1].data, weight)
    record = SourceRecord.from_model(convert(flat, "outside.tflite"))
    new = {"w": weight * 2, "b": bias + 1}
    write_back(record, new, tmp_path / "out.tflite")
    x = rng.normal(size=(3, 6)).astype(np.float32)
    np.testing.assert_allclose(run_litert((tmp_path / "out.tflite").read_bytes(), x), x @ new["w"].T + new["b"],
                               rtol=1e-5, atol=1e-5)
