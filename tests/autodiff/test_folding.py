"""Shapes through constant-computable subgraphs: what exporters compute pads and shapes with is folded
before differentiation, so rules see every size that is computable, with the batch left symbolic."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from onnxtrain.autodiff.engine import _fold
from onnxtrain.autodiff.folding import fold_constants
from onnxtrain.ir.passes import constant_values
from onnxtrain.ir.types import TensorInfo, infer_tensor_info

FLOAT, INT64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64


def _model(nodes, inits=(), x_shape=("batch", 3, 16, 16)) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", FLOAT, None)],
                              initializer=[numpy_helper.from_array(v, k) for k, v in inits])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _refined(model: onnx.ModelProto) -> dict[str, TensorInfo]:
    nodes = list(model.graph.node)
    return _fold(nodes, 17, constant_values(model.graph), infer_tensor_info(model))[1]


def test_pads_from_a_chain_of_constants():
    """TorchScript's F.pad: the pads come out of Constant -> Reshape -> Slice -> Transpose -> Reshape -> Cast."""
    pads = np.array([0, 1, 0, 1, 0, 0, 0, 0], dtype=np.int64)             # torch order: last axis first
    nodes = [
        helper.make_node("Constant", [], ["p"], value=numpy_helper.from_array(pads)),
        helper.make_node("Constant", [], ["s"], value=numpy_helper.from_array(np.array([-1, 2], dtype=np.int64))),
        helper.make_node("Reshape", ["p", "s"], ["p2"]),
        helper.make_node("Constant", [], ["st"], value=numpy_helper.from_array(np.array([-1], dtype=np.int64))),
        helper.make_node("Constant", [], ["en"], value=numpy_helper.from_array(np.array([-(2**63)], dtype=np.int64))),
        helper.make_node("Constant", [], ["ax"], value=numpy_helper.from_array(np.array([0], dtype=np.int64))),
        helper.make_node("Slice", ["p2", "st", "en", "ax", "st"], ["p3"]),
        helper.make_node("Transpose", ["p3"], ["p4"], perm=[1, 0]),
        helper.make_node("Constant", [], ["flat"], value=numpy_helper.from_array(np.array([-1], dtype=np.int64))),
        helper.make_node("Reshape", ["p4", "flat"], ["p5"]),
        helper.make_node("Cast", ["p5"], ["p6"], to=INT64),
        helper.make_node("Pad", ["x", "p6"], ["padded"]),
        helper.make_node("Relu", ["padded"], ["y"]),
    ]
    model = _model(nodes)
    inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    padded = next(v for v in inferred.graph.value_info if v.name == "padded")
    assert [d.dim_value for d in padded.type.tensor_type.shape.dim][2:] != [17, 17]  # ONNX inference alone loses them
    assert _refined(model)["y"].shape == ("batch", 3, 17, 17)


def test_static_entries_of_a_partly_symbolic_shape_fold():
    """timm's TF "same" padding reads the input size at run time: Gather(Shape(x), 2) is 16 here even though
    the batch is symbolic, and the pads computed from it fold."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "two"], ["h"], axis=0),
        helper.make_node("Mod", ["h", "two"], ["odd"]),                   # 0: pad one at the end of H and W
        helper.make_node("Sub", ["one", "odd"], ["extra"]),
        helper.make_node("Unsqueeze", ["extra", "zero"], ["e1"]),
        helper.make_node("Concat", ["zeros6", "e1", "e1"], ["pads"], axis=0),
        helper.make_node("Pad", ["x", "pads"], ["padded"]),
        helper.make_node("Conv", ["padded", "w"], ["y"], strides=[2, 2], kernel_shape=[3, 3]),
    ]
    inits = [("two", np.array(2, dtype=np.int64)), ("one", np.array(1, dtype=np.int64)),
             ("zero", np.array([0], dtype=np.int64)), ("zeros6", np.zeros(6, dtype=np.int64)),
             ("w", np.ones((4, 3, 3, 3), dtype=np.float32))]
    model = _model(nodes, inits)
    infos = infer_tensor_info(model)
    folded = fold_constants(list(model.graph.node), infos, 17, constant_values(model.graph))
    assert int(folded["h"]) == 16
    assert folded["pads"].tolist() == [0, 0, 0, 0, 0, 0, 1, 1]
    assert _refined(model)["y"].shape == ("batch", 4, 8, 8)


def test_a_symbolic_entry_is_not_folded():
    nodes = [helper.make_node("Shape", ["x"], ["shape"]), helper.make_node("Gather", ["shape", "zero"], ["n"], axis=0),
             helper.make_node("Relu", ["x"], ["y"])]
    model = _model(nodes, [("zero", np.array(0, dtype=np.int64))])
    assert "n" not in fold_constants(list(model.graph.node), infer_tensor_info(model), 17, constant_values(model.graph))


def test_torchscript_zero_pad_then_conv_keeps_static_spatial_sizes():
    torch = pytest.importorskip("torch")
    import io

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.pad, self.conv = torch.nn.ZeroPad2d((0, 1, 0, 1)), torch.nn.Conv2d(3, 4, 3, stride=2)

        def forward(self, x):
            return self.conv(self.pad(x))

    buffer = io.BytesIO()
    torch.onnx.export(Net().train(), (torch.randn(2, 3, 16, 16),), buffer, dynamo=False, input_names=["x"],
                      output_names=["y"], dynamic_axes={"x": {0: "b"}, "y": {0: "b"}},
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False, opset_version=17)
    model = onnx.load_from_string(buffer.getvalue())
    conv = next(n for n in model.graph.node if n.op_type == "Conv")
    assert _refined(model)[conv.output[0]].shape == ("b", 4, 8, 8)
