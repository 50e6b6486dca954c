"""runtime.export.write_model: the inference model's file, written from the weights' own memory."""

from __future__ import annotations

import tracemalloc

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from onnxtrain.runtime.export import write_model

RNG = np.random.default_rng(0)


def _model() -> onnx.ModelProto:
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 512])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 1024])],
                              initializer=[numpy_helper.from_array(np.array([1, 2], np.int64), "kept")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_the_file_is_the_model_onnx_would_serialize_with_the_weights_in_order(tmp_path):
    weights = {"W": RNG.normal(size=(512, 1024)).astype(np.float32), "b": RNG.normal(size=1024).astype(np.float32),
               "half": RNG.normal(size=(40, 70)).astype(np.float16), "mask": RNG.random((64, 80)) > 0.5,
               "ids": np.arange(3000, dtype=np.int64).reshape(30, 100), "scalar": np.array(2.5, np.float32),
               "empty": np.zeros((0, 4), np.float32),
               "big_endian": RNG.normal(size=(40, 40)).astype(">f4")}
    write_model(_model(), weights, tmp_path / "m.onnx")
    expected = _model()
    expected.graph.initializer.extend(numpy_helper.from_array(a.astype(a.dtype.newbyteorder("<")), n)
                                      for n, a in weights.items())
    assert onnx.load(tmp_path / "m.onnx") == expected
    got = {t.name: numpy_helper.to_array(t) for t in onnx.load(tmp_path / "m.onnx").graph.initializer}
    for name, array in weights.items():
        np.testing.assert_array_equal(got[name], array)
    x = RNG.normal(size=(3, 512)).astype(np.float32)
    (y,) = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(y, x @ weights["W"] + weights["b"], rtol=1e-4, atol=1e-4)


def test_writing_holds_no_copy_of_the_weights(tmp_path):
    """Serializing the model with its weights inside held them twice more (GPT-2's 475 MB export peaked 2.5 GB
    above the process); now the pieces are written from the arrays."""
    weights = {"W": RNG.normal(size=(4096, 1024)).astype(np.float32), "b": np.zeros(1024, np.float32)}
    tracemalloc.start()
    write_model(_model(), weights, tmp_path / "m.onnx")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < weights["W"].nbytes / 8, f"{peak / 2**20:.1f} MB traced while writing 16 MB of weights"
    assert (tmp_path / "m.onnx").stat().st_size > weights["W"].nbytes
