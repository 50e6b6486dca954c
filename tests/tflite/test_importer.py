"""Import: the ONNX model computes what LiteRT computes, keeps the TFLite names, and refuses what it cannot do."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from onnxtrain.tflite import SourceRecord, import_model
from onnxtrain.tflite.context import UnsupportedModelError
from onnxtrain.tflite.importer import convert
from onnxtrain.tflite.reader import read_flatbuffer
from tests.tflite.conftest import MODELS, example_input, run_litert

pytest.importorskip("tflite")
pytest.importorskip("circle_schema")


@pytest.mark.parametrize("name", MODELS)
def test_import_matches_litert(model_path, name):
    path = model_path(name)
    model = import_model(path)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for batch in (1, 5):  # the dynamic batch of the converter's shape_signature is kept
        x = example_input(model, batch)
        ours = session.run(None, {model.graph.input[0].name: x})[0]
        ref = run_litert(path.read_bytes(), x)
        np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["digits_cnn.tflite", "mlp.circle"])
def test_initializers_are_the_tflite_tensors(model_path, name):
    """Every float constant is an initializer named and shaped as its TFLite tensor, with its values."""
    flat = read_flatbuffer(model_path(name).read_bytes())
    model = import_model(model_path(name))
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    weights = [t for t in flat.tensors if t.is_float and t.data is not None]
    assert weights
    for t in weights:
        np.testing.assert_array_equal(inits[t.name], t.data)
    record = SourceRecord.from_model(model)
    assert sorted(record.weights) == sorted(t.name for t in weights)
    assert record.format == name.rsplit(".", 1)[1]


def test_nhwc_needs_no_transpose_per_op(model_path):
    """digits_cnn: 4 convolutions, 2 poolings, pad, add, concat, mean in NCHW; Transposes only at the graph input,
    before the flatten, and on the 4 convolution weights (kept in TFLite's OHWI layout)."""
    model = import_model(model_path("digits_cnn.tflite"))
    transposes = [n for n in model.graph.node if n.op_type == "Transpose"]
    inits = {i.name for i in model.graph.initializer}
    on_weights = [n for n in transposes if n.input[0] in inits]
    assert len(on_weights) == 4
    assert len(transposes) - len(on_weights) == 2


def test_unsupported_operator_is_named(model_path):
    flat = read_flatbuffer(model_path("mlp.tflite").read_bytes())
    flat.operators[2].code = "SQUARE"
    with pytest.raises(UnsupportedModelError, match=r"cannot import: SQUARE \(supported: .*CONV_2D"):
        convert(flat, "mlp.tflite")


def test_an_unsupported_operator_is_named_before_an_integer_input(model_path):
    """A Keras text model: its int32 token input goes with a GATHER, which is what blocks the import."""
    import dataclasses

    flat = read_flatbuffer(model_path("mlp.tflite").read_bytes())
    flat.operators[0].code = "GATHER"
    first = flat.inputs[0]
    flat.tensors[first] = dataclasses.replace(flat.tensors[first], type_code=2)   # INT32
    with pytest.raises(UnsupportedModelError, match=r"cannot import: GATHER"):
        convert(flat, "text.tflite")


def test_quantized_model_is_refused_with_tensor_names(model_path):
    flat = read_flatbuffer(model_path("mlp.tflite").read_bytes())
    flat.tensors[3].quantized = True
    name = flat.tensors[3].name
    with pytest.raises(UnsupportedModelError, match=rf"quantized \(1 quantized tensors: '{name}'\).*only float"):
        convert(flat, "mlp.tflite")


def test_not_a_flatbuffer(tmp_path):
    path = tmp_path / "model.tflite"
    path.write_bytes(b"\x00" * 16)
    with pytest.raises(ValueError, match="not a TensorFlow Lite or circle model: its file identifier"):
        import_model(path)


def test_float16_weights_are_float32_initializers(model_path):
    """LiteRT's float16 quantization: each weight is stored as float16 and read through a DEQUANTIZE; the import
    trains it as a float32 initializer named as the float16 tensor, recorded to be written back as float16."""
    flat = read_flatbuffer(model_path("digits_cnn_fp16.tflite").read_bytes())
    model = import_model(model_path("digits_cnn_fp16.tflite"))
    halves = [t for t in flat.tensors if t.type_code == 1 and t.data is not None]
    assert len(halves) == 12
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    for t in halves:
        assert inits[t.name].dtype == np.float32
        np.testing.assert_array_equal(inits[t.name], t.data.astype(np.float32))
    assert {s.dtype for s in SourceRecord.from_model(model).weights.values()} == {"float16"}
    assert "DEQUANTIZE" in {op.code for op in flat.operators}
    assert not [n for n in model.graph.node if n.op_type == "DequantizeLinear" or set(n.input) & set(inits)
                and n.op_type == "Cast"]


def test_shared_buffers_and_duplicate_names():
    """Tensors sharing a buffer share one initializer (trained once, written once); a repeated tensor name gets
    the tensor index."""
    from tests.tflite.conftest import run_litert
    from tests.tflite.flatbuild import Graph

    rng = np.random.default_rng(0)
    g = Graph()
    x = g.input("x", [1, 4])
    h = g.op("FULLY_CONNECTED", [x, g.const("w", rng.normal(size=(4, 4)).astype(np.float32)), None], "h", [1, 4],
             "FullyConnectedOptions")
    y = g.op("FULLY_CONNECTED", [h, g.const("w2", np.zeros((4, 4), np.float32)), None], "y", [1, 4],
             "FullyConnectedOptions")
    z = g.op("ADD", [y, g.const("w", rng.normal(size=4).astype(np.float32))], "z", [1, 4], "AddOptions")
    g.tensors[3].buffer = g.tensors[1].buffer  # "w2" reads the buffer of the first "w"
    data = g.build([z])
    model = convert(read_flatbuffer(data), "shared")
    record = SourceRecord.from_model(model)
    assert sorted(record.weights) == ["w", "w#5"]
    assert record.weights["w"].tensors == ["w", "w2"]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    xs = rng.normal(size=(3, 4)).astype(np.float32)
    np.testing.assert_allclose(session.run(None, {"x": xs})[0], run_litert(data, xs), rtol=1e-5, atol=1e-5)
