"""The committed .tflite / .circle models and a LiteRT runner."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

DATA = Path(__file__).parent / "data"
MODELS = ["digits_cnn.tflite", "digits_cnn.circle", "digits_cnn_fp16.tflite", "mlp.tflite", "mlp.circle",
          "op_zoo.tflite", "onert_mnist.tflite"]


@pytest.fixture(scope="session")
def model_path(tmp_path_factory):
    """name -> path of a test model (ONERT's MNIST model is committed gzipped: 400 KB of weights)."""
    folder = tmp_path_factory.mktemp("tflite_models")

    def path(name: str) -> Path:
        if (DATA / name).exists():
            return DATA / name
        out = folder / name
        if not out.exists():
            out.write_bytes(gzip.decompress((DATA / f"{name}.gz").read_bytes()))
        return out
    return path


def run_litert(data: bytes, *xs: np.ndarray) -> np.ndarray:
    """Run a flatbuffer with LiteRT's interpreter on ``xs`` (one array per graph input, any batch size).
    LiteRT refuses circle's "CIR0" file identifier; a .circle that uses only TFLite's tables and operators (ours)
    runs with the identifier swapped."""
    interpreter_mod = pytest.importorskip("ai_edge_litert.interpreter")
    data = bytearray(data)
    if bytes(data[4:8]) == b"CIR0":
        data[4:8] = b"TFL3"
    interpreter = interpreter_mod.Interpreter(model_content=bytes(data))
    details = interpreter.get_input_details()
    for d, x in zip(details, xs):
        interpreter.resize_tensor_input(d["index"], list(x.shape))
    interpreter.allocate_tensors()
    for d, x in zip(details, xs):
        interpreter.set_tensor(d["index"], x)
    interpreter.invoke()
    return interpreter.get_tensor(interpreter.get_output_details()[0]["index"])


def example_input(onnx_model, batch: int, seed: int = 0) -> np.ndarray:
    dims = [d.dim_value for d in onnx_model.graph.input[0].type.tensor_type.shape.dim]
    return np.random.default_rng(seed).normal(size=[batch, *dims[1:]]).astype(np.float32)
