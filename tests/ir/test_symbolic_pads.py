"""Sizes through Pads whose pads are computed at run time, Resizes and patch grids (ir/symbolic.py).

torch's F.pad, exported by TorchScript, writes its pads as [0, pad_w, 0, pad_h] reshaped to (-1, 2), its rows
reversed by a Slice with step -1, transposed and flattened (timm pads windows to a multiple of their size this way:
DaViT, Swin-like models). ONNX inference gave every axis of the padded tensor a fresh symbol, the batch included,
and every broadcast after it reduced its gradient at run time (DaViT: 40 NonZero nodes per training graph). A Resize
by constant scales or to sizes read from a shape lost the batch axis the same way (GLPN, segmentation decoders,
EfficientFormerV2: 17), and tokens put back on a grid of h // patch rows lost its spatial sizes (Twins: 8).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxtrain import artifacts
from onnxtrain.autodiff.check import check_gradients
from onnxtrain.ir.types import infer_tensor_info


def _ints(name: str, values) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, np.int64), name)


def _window_padded(float_type=TensorProto.DOUBLE) -> onnx.ModelProto:
    """x (n, 2, h, w) padded at the end of h and w by (h % 3, w % 3) as torch's F.pad symbolic writes it, then a
    3x3 convolution (pads 1) added to the padded tensor: y = Pad(x) + Conv(Pad(x))."""
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Gather", ["shape", "i2"], ["height"], axis=0),
             helper.make_node("Gather", ["shape", "i3"], ["width"], axis=0),
             helper.make_node("Mod", ["height", "three"], ["pad_h"]),
             helper.make_node("Mod", ["width", "three"], ["pad_w"]),
             helper.make_node("Unsqueeze", ["pad_h", "axis0"], ["pad_h1"]),
             helper.make_node("Unsqueeze", ["pad_w", "axis0"], ["pad_w1"]),
             helper.make_node("Concat", ["zero1", "pad_w1", "zero1", "pad_h1", "zeros4"], ["torch_pads"], axis=0),
             helper.make_node("Reshape", ["torch_pads", "pairs"], ["pairs_matrix"]),
             helper.make_node("Slice", ["pairs_matrix", "minus1", "very_negative", "axis0", "minus1"], ["reversed"]),
             helper.make_node("Transpose", ["reversed"], ["by_side"], perm=[1, 0]),
             helper.make_node("Reshape", ["by_side", "minus1"], ["flat_pads"]),
             helper.make_node("Cast", ["flat_pads"], ["pads"], to=TensorProto.INT64),
             helper.make_node("Pad", ["x", "pads"], ["padded"], mode="constant"),
             helper.make_node("Conv", ["padded", "w1"], ["a"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["padded", "a"], ["y"])]
    inits = [_ints("i2", 2), _ints("i3", 3), _ints("three", 3), _ints("axis0", [0]), _ints("zero1", [0]),
             _ints("zeros4", [0, 0, 0, 0]), _ints("pairs", [-1, 2]), _ints("minus1", [-1]),
             _ints("very_negative", [-(2**63) + 1])]
    inputs = [helper.make_tensor_value_info("x", float_type, ["n", 2, "h", "w"]),
              helper.make_tensor_value_info("w1", float_type, [2, 2, 3, 3])]
    graph = helper.make_graph(nodes, "padded", inputs, [helper.make_tensor_value_info("y", float_type, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _run_time_reductions(model: onnx.ModelProto, weight: str, folder) -> list[str]:
    """The NonZero nodes (axes to reduce computed at run time) of the training graph that trains ``weight`` (an
    input of ``model``, made an initializer) with an MSE loss."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    declared = next(i for i in model.graph.input if i.name == weight)
    shape = [d.dim_value for d in declared.type.tensor_type.shape.dim]
    model.graph.input.remove(declared)
    value = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    model.graph.initializer.append(numpy_helper.from_array(value, weight))
    artifacts.generate_artifacts(model, requires_grad=[weight], loss=artifacts.LossType.MSELoss, optimizer=None,
                                 artifact_directory=str(folder))
    training = onnx.load(str(folder / "training_model.onnx"))
    return [n.name or n.output[0] for n in training.graph.node if n.op_type == "NonZero"]


def test_a_tensor_padded_by_run_time_pads_keeps_its_unpadded_axes():
    infos = infer_tensor_info(_window_padded())
    assert infos["pads"].shape == (8,)
    padded = ("n", 2, "padded.shape[2]", "padded.shape[3]")
    assert infos["padded"].shape == infos["a"].shape == infos["y"].shape == padded


def test_onnx_inference_alone_loses_the_padded_tensors_batch():
    """The case the naming is for (the test above can fail)."""
    inferred = onnx.shape_inference.infer_shapes(_window_padded(), data_prop=True)
    dims = {v.name: v.type.tensor_type.shape.dim for v in inferred.graph.value_info}
    assert dims["padded"][0].dim_param != "n"


@pytest.mark.parametrize("size", [(5, 7), (6, 4)])
def test_the_padded_names_are_the_run_time_sizes(size, tmp_path):
    """The padded tensor, the convolution and their sum have the sizes their names say at run time, and the
    gradient graph reduces nothing over axes computed at run time and matches finite differences."""
    import onnxruntime as ort

    model = _window_padded(TensorProto.FLOAT)
    names = ["padded", "a", "y"]
    del model.graph.output[:]
    model.graph.output.extend(helper.make_tensor_value_info(v, TensorProto.FLOAT, None) for v in names)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 2, *size)).astype(np.float32)
    w1 = rng.standard_normal((2, 2, 3, 3)).astype(np.float32)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    shapes = {n: v.shape for n, v in zip(names, session.run(None, {"x": x, "w1": w1}))}
    expected = (2, 2, size[0] + size[0] % 3, size[1] + size[1] % 3)
    assert shapes == {n: expected for n in names}

    assert not _run_time_reductions(_window_padded(TensorProto.FLOAT), "w1", tmp_path)
    model64 = _window_padded()
    inputs = {"x": x.astype(np.float64), "w1": w1.astype(np.float64)}
    report = check_gradients(model64, inputs, ["x", "w1"], max_elements=20)
    assert report.ok, report


def _resized(float_type=TensorProto.DOUBLE) -> onnx.ModelProto:
    """x (n, 2, h, w) times gain (1, 2, 1, 1), resized, and its negative resized, by scales (1, 1, 2, 2) (a Concat
    of [1, 1] and [2, 2]), their product resized back to x's own shape and multiplied by x."""
    nodes = [helper.make_node("Concat", ["ones", "twos"], ["scales"], axis=0),  # as TorchScript writes scales
             helper.make_node("Mul", ["x", "gain"], ["scaled"]),
             helper.make_node("Resize", ["scaled", "", "scales"], ["up"], mode="nearest"),
             helper.make_node("Neg", ["scaled"], ["negated"]),
             helper.make_node("Resize", ["negated", "", "scales"], ["up_negated"], mode="linear"),
             helper.make_node("Mul", ["up", "up_negated"], ["squared"]),
             helper.make_node("Shape", ["x"], ["x_shape"]),
             helper.make_node("Resize", ["squared", "", "", "x_shape"], ["back"], mode="linear"),
             helper.make_node("Mul", ["back", "x"], ["y"])]
    scales = [numpy_helper.from_array(np.array([v, v], np.float32), name) for v, name in ((1, "ones"), (2, "twos"))]
    inputs = [helper.make_tensor_value_info("x", float_type, ["n", 2, "h", "w"]),
              helper.make_tensor_value_info("gain", float_type, [1, 2, 1, 1])]
    graph = helper.make_graph(nodes, "resized", inputs, [helper.make_tensor_value_info("y", float_type, None)],
                              scales)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_resizes_by_scales_and_to_a_shape_name_their_sizes():
    infos = infer_tensor_info(_resized())
    assert infos["up"].shape == infos["up_negated"].shape == infos["squared"].shape == ("n", 2, "2*h", "2*w")
    assert infos["back"].shape == infos["y"].shape == ("n", 2, "h", "w")


def test_onnx_inference_alone_loses_the_resized_batch():
    inferred = onnx.shape_inference.infer_shapes(_resized(), data_prop=True)
    dims = {v.name: v.type.tensor_type.shape.dim for v in inferred.graph.value_info}
    assert dims["up"][0].dim_param != "n"


def test_resized_gradients_reduce_nothing_at_run_time(tmp_path):
    assert not _run_time_reductions(_resized(TensorProto.FLOAT), "gain", tmp_path)
    rng = np.random.default_rng(1)
    inputs = {"x": rng.standard_normal((2, 2, 3, 5)), "gain": rng.standard_normal((1, 2, 1, 1))}
    report = check_gradients(_resized(), inputs, ["x", "gain"], max_elements=20)
    assert report.ok, report


def _patch_grid(float_type=TensorProto.DOUBLE) -> onnx.ModelProto:
    """x (n, 2, h, w): a 4x4 patch convolution of stride 4, its tokens (n, tokens, 2) put back on a grid by a Reshape
    to (n, 2, h // 4, w // 4) computed from x's shape (timm's position convolutions), a 3x3 convolution of the grid
    added to it."""
    nodes = [helper.make_node("Conv", ["x", "w_patch"], ["patches"], kernel_shape=[4, 4], strides=[4, 4]),
             helper.make_node("Reshape", ["patches", "flat_shape"], ["flat"]),
             helper.make_node("Transpose", ["flat"], ["tokens"], perm=[0, 2, 1]),
             helper.make_node("Transpose", ["tokens"], ["channels_first"], perm=[0, 2, 1]),
             helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Gather", ["shape", "i0"], ["batch"], axis=0),
             helper.make_node("Gather", ["shape", "i2"], ["height"], axis=0),
             helper.make_node("Gather", ["shape", "i3"], ["width"], axis=0),
             helper.make_node("Div", ["height", "four"], ["rows"]),
             helper.make_node("Div", ["width", "four"], ["cols"]),
             *[helper.make_node("Unsqueeze", [v, "axis0"], [f"{v}1"]) for v in ("batch", "rows", "cols")],
             helper.make_node("Concat", ["batch1", "two", "rows1", "cols1"], ["grid_shape"], axis=0),
             helper.make_node("Reshape", ["channels_first", "grid_shape"], ["grid"]),
             helper.make_node("Conv", ["grid", "w_grid"], ["mixed"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["grid", "mixed"], ["y"])]
    inits = [_ints("i0", 0), _ints("i2", 2), _ints("i3", 3), _ints("four", 4), _ints("axis0", [0]), _ints("two", [2]),
             _ints("flat_shape", [0, 0, -1])]
    inputs = [helper.make_tensor_value_info("x", float_type, ["n", 2, "h", "w"]),
              helper.make_tensor_value_info("w_patch", float_type, [2, 2, 4, 4]),
              helper.make_tensor_value_info("w_grid", float_type, [2, 2, 3, 3])]
    graph = helper.make_graph(nodes, "grid", inputs, [helper.make_tensor_value_info("y", float_type, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_grid_of_patches_sized_by_a_division_of_the_input_size_meets_the_convolution_under_one_name():
    """h // 4 (an integer Div of the input's height) is named as the stride-4 convolution names its output."""
    infos = infer_tensor_info(_patch_grid())
    assert infos["patches"].shape == infos["grid"].shape == infos["y"].shape == ("n", 2, "floor(h/4)", "floor(w/4)")


@pytest.mark.parametrize("size", [(8, 12), (9, 15)])
def test_the_patch_grid_trains_without_run_time_reductions(size, tmp_path):
    assert not _run_time_reductions(_patch_grid(TensorProto.FLOAT), "w_grid", tmp_path)
    rng = np.random.default_rng(3)
    inputs = {"x": rng.standard_normal((2, 2, *size)), "w_patch": rng.standard_normal((2, 2, 4, 4)),
              "w_grid": rng.standard_normal((2, 2, 3, 3))}
    report = check_gradients(_patch_grid(), inputs, ["x", "w_grid"], max_elements=20)
    assert report.ok, report


def _resized_twice(rows: str, cols: str) -> onnx.ModelProto:
    """x (n, 2, rows, cols), sizes spelled as torch.export spells them, resized by scales (1, 1, 4, 4), then by
    (1, 1, 2, 2)."""
    nodes = [helper.make_node("Resize", ["x", "", "fours"], ["up"], mode="linear"),
             helper.make_node("Resize", ["up", "", "twos"], ["up2"], mode="nearest")]
    scales = [numpy_helper.from_array(np.array(v, np.float32), name)
              for v, name in (([1, 1, 4, 4], "fours"), ([1, 1, 2, 2], "twos"))]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 2, rows, cols])]
    graph = helper.make_graph(nodes, "resized_twice", inputs,
                              [helper.make_tensor_value_info("up2", TensorProto.FLOAT, None)], scales)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_size_spelled_as_a_sum_is_scaled_whole():
    """torch.export names sizes by expressions: segmentation-models-pytorch's FPN resizes a map of
    ``8*(((h - 1)//32)) + 8`` rows by 4 to its logits. Read as a product, the name became ``32*(((h - 1)//32)) + 8``,
    and the labels of a CrossEntropyLoss, declared with it, were refused at every size (40 rows at 64 px)."""
    from onnxtrain.runtime.inputs import _evaluate, _size_expression

    def size(name: str, h: int, w: int) -> int:
        return _evaluate(_size_expression(name), {"h": h, "w": w})

    rows, cols = "8*(((h - 1)//32)) + 8", "w-1"
    infos = infer_tensor_info(_resized_twice(rows, cols))
    for h, w in ((64, 5), (96, 9), (100, 2)):
        for value, scale in (("up", 4), ("up2", 8)):
            assert [size(d, h, w) for d in infos[value].shape[2:]] == [scale * size(rows, h, w),
                                                                       scale * size(cols, h, w)]
