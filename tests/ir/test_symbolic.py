import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxtrain import artifacts
from onnxtrain.ir.symbolic import solve_reshapes
from onnxtrain.ir.types import TensorInfo, infer_tensor_info


def _int64(name: str, values) -> onnx.TensorProto:
    """An int64 initializer (shapes, indices, slice bounds)."""
    return numpy_helper.from_array(np.array(values, np.int64), name)


def _attention_heads(heads_target):
    """(b, s, 8) -> queries and keys (-x) split into heads of 2 by Reshapes to ``heads_target`` (computed from
    Shape(x) as transformers exports it), (q @ k^T) @ q over (b, h, s, 2), merged back by a Reshape to (b, s, -1)."""
    inits = [_int64("i01", [0, 1]), _int64("tail", heads_target), _int64("merge_tail", [-1])]
    nodes = [helper.make_node("Shape", ["x"], ["xs"]),
             helper.make_node("Gather", ["xs", "i01"], ["bs"], axis=0),
             helper.make_node("Concat", ["bs", "tail"], ["heads_shape"], axis=0),
             helper.make_node("Reshape", ["x", "heads_shape"], ["heads"]),
             helper.make_node("Neg", ["x"], ["xk"]),   # keys: a second split, with a shape of its own
             helper.make_node("Concat", ["bs", "tail"], ["key_shape"], axis=0),
             helper.make_node("Reshape", ["xk", "key_shape"], ["key_heads"]),
             helper.make_node("Transpose", ["heads"], ["q"], perm=[0, 2, 1, 3]),
             helper.make_node("Transpose", ["key_heads"], ["kt"], perm=[0, 2, 3, 1]),
             helper.make_node("MatMul", ["q", "kt"], ["scores"]),
             helper.make_node("MatMul", ["scores", "q"], ["context"]),
             helper.make_node("Transpose", ["context"], ["back"], perm=[0, 2, 1, 3]),
             helper.make_node("Concat", ["bs", "merge_tail"], ["merged_shape"], axis=0),
             helper.make_node("Reshape", ["back", "merged_shape"], ["y"])]
    graph = helper.make_graph(nodes, "heads", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_heads_split_with_minus_one_gets_its_size_from_the_element_count():
    infos = infer_tensor_info(_attention_heads([-1, 2]))
    assert infos["heads"].shape == ("b", "s", 4, 2)
    assert infos["scores"].shape == ("b", 4, "s", "s")   # both operands have 4 heads: no broadcast to resolve
    assert infos["y"].shape == ("b", "s", 8)             # solved in the second round, from the first's result


def test_onnx_inference_alone_leaves_the_heads_unknown():
    """The case the solving is for: without it the heads' axis is a fresh symbol (the test above can fail)."""
    inferred = onnx.shape_inference.infer_shapes(_attention_heads([-1, 2]), data_prop=True)
    heads = next(v for v in inferred.graph.value_info if v.name == "heads")
    assert not heads.type.tensor_type.shape.dim[2].HasField("dim_value")


@pytest.mark.parametrize("source,target,expected", [
    (("b", "s", 384), ("b", "s", "unk__u", 32), ("b", "s", 12, 32)),
    (("b", 12, "s", 32), ("b", "s", None), ("b", "s", 384)),
    (("b", "s", 384), ("unk__u", "s", 384), ("b", "s", 384)),  # the batch size computed at run time
    (("b", 64, 128), ("unk__u", 64, 4, 32), ("b", 64, 4, 32)),
    (("b", "s", 384), ("unk__u", "s", 192), ("2*b", "s", 192)),  # DeBERTa: batch times heads
    (("2*b", "s", 8), ("unk__u", 2, "s", 8), ("b", 2, "s", 8)),  # and back
    (("b", "c", 384), ("unk__u", 384), ("b*c", 384)),
    (("b", "s", "s"), ("unk__u", "s"), ("b*s", "s")),
    (("unk__1", 64, 128), ("unk__u", 64, 4, 32), None),  # not an input's symbol: may mean another size next round
    (("b", "s", 384), ("b", "unk__u", "unk__v", 32), None),  # two unknowns
    (("b", "s", 384), ("b", "s", "unk__u", 5), None),   # 384 is not a multiple of 5: not solved
    (("b", "s", 384), ("b", "s", "s", "unk__u"), None),  # s is not a factor of 384 b
    (("b", 0, 384), ("b", "unk__u", 3), None),          # empty: any size fits
    (("b", "s", 384), ("b", "s", 384), None),           # nothing unknown
    (("b", 6), ("b", "b"), None),                       # nothing unknown either
])
def test_solve_reshapes_cases(source, target, expected):
    node = helper.make_node("Reshape", ["x", "shape"], ["y"])
    given = sorted({p for d in source if isinstance(d, str) for p in d.split("*")
                    if not p.isdigit() and not p.startswith("unk__")})
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, given)], [])
    infos = {"x": TensorInfo(TensorProto.FLOAT, source), "y": TensorInfo(TensorProto.FLOAT, target)}
    solved = solve_reshapes(graph, infos)
    assert solved == ({} if expected is None else {"y": TensorInfo(TensorProto.FLOAT, expected)})


def test_a_transformers_style_attention_trains_without_run_time_reductions(tmp_path):
    """The gradient of the attention product reads the heads' axis as static: no ReduceSum with axes computed at
    run time (a no-op copy of the whole tensor per step before), and the gradient is right at two batch sizes."""
    model = _attention_heads([-1, 2])
    w = np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)
    model.graph.initializer.append(numpy_helper.from_array(w, "w"))
    model.graph.node.insert(0, helper.make_node("MatMul", ["x_in", "w"], ["x"]))
    model.graph.input[0].name = "x_in"
    artifacts.generate_artifacts(model, requires_grad=["w"], loss=artifacts.LossType.MSELoss,
                                 artifact_directory=str(tmp_path))
    training = onnx.load(str(tmp_path / "training_model.onnx"))
    constants = {n.output[0] for n in training.graph.node if n.op_type == "Constant"}
    constants |= {i.name for i in training.graph.initializer}
    dynamic = [n.name for n in training.graph.node if n.op_type == "ReduceSum" and len(n.input) > 1
               and n.input[1] not in constants]
    assert not dynamic

    import onnxruntime as ort

    session = ort.InferenceSession(training.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    rng = np.random.default_rng(1)
    for batch in (2, 3):
        x = rng.standard_normal((batch, 3, 8)).astype(np.float32)
        target = rng.standard_normal((batch, 3, 8)).astype(np.float32)
        feeds = {"x_in": x, "target": target, "w": w, "w_grad.accumulation.buffer": np.zeros_like(w),
                 "lazy_reset_grad": np.array(True)}
        grad = session.run(None, feeds)[names.index("w_grad.accumulation.out")]

        def loss(weights, x=x, target=target, batch=batch):
            h = (x.astype(np.float64) @ weights).reshape(batch, 3, 4, 2).transpose(0, 2, 1, 3)
            y = ((h @ -h.transpose(0, 1, 3, 2)) @ h).transpose(0, 2, 1, 3).reshape(batch, 3, 8)
            return np.mean((y - target) ** 2)

        numeric = np.zeros_like(w, dtype=np.float64)
        for idx in np.ndindex(*w.shape):
            e = np.zeros_like(w, dtype=np.float64)
            e[idx] = 1e-6
            numeric[idx] = (loss(w + e) - loss(w - e)) / 2e-6
        np.testing.assert_allclose(grad, numeric, rtol=2e-3, atol=1e-4)


def _stacked_attention(layers: int):
    """``layers`` residual attention layers over x (b, 3, 8), each splitting its heads with Reshape(-1, 3, 4, 2)
    and merging them with Reshape(-1, 3, 8), as a hand-written torch model does (``t.reshape(-1, seq, heads,
    dim)``): ONNX gives each Reshape's batch axis a fresh symbol."""
    inits = [_int64("split", [-1, 3, 4, 2]), _int64("merge", [-1, 3, 8])]
    rng = np.random.default_rng(0)
    nodes, x = [], "x"
    for k in range(layers):
        inits.append(numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), f"w{k}"))
        p = f"l{k}/"
        nodes += [helper.make_node("MatMul", [x, f"w{k}"], [p + "proj"]),
                  helper.make_node("Reshape", [p + "proj", "split"], [p + "heads"]),
                  helper.make_node("Transpose", [p + "heads"], [p + "q"], perm=[0, 2, 1, 3]),
                  helper.make_node("Transpose", [p + "heads"], [p + "kt"], perm=[0, 2, 3, 1]),
                  helper.make_node("MatMul", [p + "q", p + "kt"], [p + "scores"]),
                  helper.make_node("MatMul", [p + "scores", p + "q"], [p + "context"]),
                  helper.make_node("Transpose", [p + "context"], [p + "back"], perm=[0, 2, 1, 3]),
                  helper.make_node("Reshape", [p + "back", "merge"], [p + "merged"]),
                  helper.make_node("Add", [x, p + "merged"], [p + "out"])]
        x = p + "out"
    graph = helper.make_graph(nodes, "stacked", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 3, 8])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_reshapes_chained_through_layers_are_solved_layer_after_layer(tmp_path):
    """Each layer's split reads a residual Add of its input and the previous merge: solved only once the merge is,
    so the rounds go on until nothing more is solved (four layers: eight rounds), and the training graph has no
    ReduceSum with run-time axes."""
    layers = 4
    model = _stacked_attention(layers)
    infos = infer_tensor_info(model)
    for k in range(layers):
        assert infos[f"l{k}/heads"].shape == ("b", 3, 4, 2)
        assert infos[f"l{k}/out"].shape == ("b", 3, 8)
    artifacts.generate_artifacts(model, requires_grad=[f"w{k}" for k in range(layers)], loss=artifacts.LossType.MSELoss,
                                 artifact_directory=str(tmp_path))
    training = onnx.load(str(tmp_path / "training_model.onnx"))
    assert not [n.name for n in training.graph.node if n.op_type == "NonZero"]


def _residual_cnn(float_type=TensorProto.DOUBLE):
    """x (n, 2, h, w), weights as inputs: a 3x3 convolution added to x, a stride-2 block whose 3x3 (SAME_UPPER)
    and 1x1 branches are added, then a MaxPool (3x3, stride 2, pads 1) times an AveragePool (2x2, stride 2, end
    pads 1): every join reads values ONNX inference gives different fresh symbols."""
    conv = dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], **conv),
             helper.make_node("Add", ["a", "x"], ["b"]),
             helper.make_node("Conv", ["b", "w2"], ["c"], strides=[2, 2], kernel_shape=[3, 3], auto_pad="SAME_UPPER"),
             helper.make_node("Conv", ["b", "w3"], ["d"], strides=[2, 2], kernel_shape=[1, 1]),
             helper.make_node("Add", ["c", "d"], ["e"]),
             helper.make_node("MaxPool", ["e"], ["f"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("AveragePool", ["e"], ["g"], kernel_shape=[2, 2], strides=[2, 2], pads=[0, 0, 1, 1]),
             helper.make_node("Mul", ["f", "g"], ["y"])]
    inputs = [helper.make_tensor_value_info("x", float_type, ["n", 2, "h", "w"]),
              helper.make_tensor_value_info("w1", float_type, [2, 2, 3, 3]),
              helper.make_tensor_value_info("w2", float_type, [3, 2, 3, 3]),
              helper.make_tensor_value_info("w3", float_type, [3, 2, 1, 1])]
    graph = helper.make_graph(nodes, "residual", inputs, [helper.make_tensor_value_info("y", float_type, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_convolutions_and_pools_name_their_sizes_after_the_input():
    """floor((h + offset) / stride) names: a residual Add's two sides have one symbol per axis."""
    infos = infer_tensor_info(_residual_cnn())
    assert infos["a"].shape == infos["b"].shape == ("n", 2, "h", "w")
    assert infos["c"].shape == infos["d"].shape == infos["e"].shape == ("n", 3, "floor((h+1)/2)", "floor((w+1)/2)")
    # floor((floor((h + 1) / 2) + 1) / 2) = floor((h + 3) / 4); SAME_UPPER's ceil(h / 2) is floor((h + 1) / 2)
    assert infos["f"].shape == infos["g"].shape == infos["y"].shape == ("n", 3, "floor((h+3)/4)", "floor((w+3)/4)")


def test_onnx_inference_alone_gives_each_convolution_fresh_symbols():
    """The case the naming is for (the test above can fail)."""
    inferred = onnx.shape_inference.infer_shapes(_residual_cnn(), data_prop=True)
    dims = {v.name: [d.dim_param for d in v.type.tensor_type.shape.dim] for v in inferred.graph.value_info}
    assert dims["c"][2] != dims["d"][2]


def _check_named_sizes_at_run_time(model: onnx.ModelProto, values: str, x: np.ndarray, env: dict) -> None:
    """Each of ``values``' inferred sizes, evaluated at ``env`` (the input symbols' values), is its shape when
    onnxruntime runs ``model`` on ``x`` (the other inputs: random, their static shapes)."""
    import onnxruntime as ort

    infos = infer_tensor_info(model)
    del model.graph.output[:]
    model.graph.output.extend(helper.make_tensor_value_info(v, TensorProto.FLOAT, None) for v in values)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feeds = {i.name: rng.standard_normal([d.dim_value or 1 for d in i.type.tensor_type.shape.dim]).astype(np.float32)
             for i in model.graph.input}
    feeds["x"] = x
    for name, value in zip(values, session.run(None, feeds)):
        expected = [d if isinstance(d, int) else eval(d.replace("floor", "int").replace("/", "//"), {}, env)
                    for d in infos[name].shape]
        assert list(value.shape) == expected, name


@pytest.mark.parametrize("size", [(7, 9), (8, 6), (5, 5)])
def test_the_named_sizes_are_the_run_time_sizes(size):
    x = np.random.default_rng(1).standard_normal((1, 2, *size)).astype(np.float32)
    env = {"n": 1, "h": size[0], "w": size[1]}
    _check_named_sizes_at_run_time(_residual_cnn(TensorProto.FLOAT), "abcdefgy", x, env)


def _embeddings():
    """BERT's embeddings as torch's TorchScript exporter writes them: position ids sliced from a (1, 16) buffer to
    the ids' length, token types expanded to the ids' shape through Where(Equal(shape, -1), ones, shape), a
    Range over the batch, and a Reshape to (batch, sequence, -1, 2) whose shape is computed."""
    rng = np.random.default_rng(0)
    inits = [_int64("positions", np.arange(16)[None]), _int64("types", np.zeros((1, 16))), _int64("zero", 0),
             _int64("one", 1), _int64("axis0", [0]), _int64("minus1", [-1]), _int64("two", [2]), _int64("m1", -1),
             numpy_helper.from_array(rng.standard_normal((30, 4)).astype(np.float32), "word"),
             numpy_helper.from_array(rng.standard_normal((16, 4)).astype(np.float32), "position"),
             numpy_helper.from_array(rng.standard_normal((2, 4)).astype(np.float32), "type")]
    n = helper.make_node
    nodes = [n("Shape", ["ids"], ["shape"]),
             n("Gather", ["shape", "zero"], ["b"], axis=0), n("Gather", ["shape", "one"], ["s"], axis=0),
             n("Unsqueeze", ["b", "axis0"], ["b1"]), n("Unsqueeze", ["s", "axis0"], ["s1"]),
             n("Slice", ["positions", "axis0", "s1", "axis0_plus1"], ["position_ids"]),
             n("Concat", ["b1", "s1"], ["bs"], axis=0),
             n("Shape", ["bs"], ["bs_len"]), n("ConstantOfShape", ["bs_len"], ["ones"],
                                               value=numpy_helper.from_array(np.array([1], np.int64))),
             n("Mul", ["ones", "m1"], ["minus_ones"]), n("Equal", ["bs", "minus_ones"], ["is_minus"]),
             n("Where", ["is_minus", "ones", "bs"], ["expand_shape"]),
             n("Slice", ["types", "axis0", "s1", "axis0_plus1"], ["types_s"]),
             n("Expand", ["types_s", "expand_shape"], ["type_ids"]),
             n("Gather", ["word", "ids"], ["w"]), n("Gather", ["position", "position_ids"], ["p"]),
             n("Gather", ["type", "type_ids"], ["t"]), n("Add", ["w", "p"], ["wp"]), n("Add", ["wp", "t"], ["e"]),
             n("Concat", ["b1", "s1", "minus1", "two"], ["heads_shape"], axis=0),
             n("Reshape", ["e", "heads_shape"], ["heads"]),
             n("Range", ["zero", "b", "one"], ["rows"])]
    inits.append(_int64("axis0_plus1", [1]))
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, ["B", "S"])
    outputs = [helper.make_tensor_value_info("heads", TensorProto.FLOAT, None),
               helper.make_tensor_value_info("rows", TensorProto.INT64, None)]
    graph = helper.make_graph(nodes, "embeddings", [ids], outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_shapes_computed_from_the_inputs_shape_are_followed():
    infos = infer_tensor_info(_embeddings())
    assert infos["position_ids"].shape == (1, "S")
    assert infos["type_ids"].shape == ("B", "S")
    assert infos["e"].shape == ("B", "S", 4)
    assert infos["heads"].shape == ("B", "S", 2, 2)
    assert infos["rows"].shape == ("B",)


def test_onnx_inference_alone_loses_the_embeddings_symbols():
    """The case this is for (the test above can fail)."""
    inferred = onnx.shape_inference.infer_shapes(_embeddings(), data_prop=True)
    dims = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in inferred.graph.value_info}
    assert dims["e"][:2] != ["B", "S"]


@pytest.mark.parametrize("batch,sequence", [(2, 5), (3, 16)])
def test_the_followed_shapes_are_the_run_time_shapes(batch, sequence):
    import onnxruntime as ort

    model = _embeddings()
    infos = infer_tensor_info(model)
    names = ["position_ids", "type_ids", "e", "heads", "rows"]
    del model.graph.output[:]
    model.graph.output.extend(helper.make_tensor_value_info(v, infos[v].elem_type, None) for v in names)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ids = np.random.default_rng(0).integers(0, 30, (batch, sequence))
    sizes = {"B": batch, "S": sequence}
    for name, value in zip(names, session.run(None, {"ids": ids})):
        assert list(value.shape) == [sizes.get(d, d) for d in infos[name].shape], name


def test_embeddings_train_without_run_time_reductions(tmp_path):
    model = _embeddings()
    del model.graph.output[1:]
    artifacts.generate_artifacts(model, requires_grad=["word", "position", "type"], loss=artifacts.LossType.MSELoss,
                                 artifact_directory=str(tmp_path))
    training = onnx.load(str(tmp_path / "training_model.onnx"))
    assert not [n.name for n in training.graph.node if n.op_type == "NonZero"]


def _merged_heads():
    """DeBERTa's attention: heads merged into the batch (b, 2, s, 4) -> (2*b, s, 4) for the product, then split
    again, (2*b, s, s) -> (b, 2, s, s); the targets' sequence length read from x's shape. And a Flatten."""
    inits = [_int64("one", [1]), _int64("minus1", [-1]), _int64("two", [2]), _int64("four", [4]),
             _int64("split", [0, 0, 2, 4])]
    n = helper.make_node
    nodes = [n("Shape", ["x"], ["shape"]), n("Slice", ["shape", "one", "two"], ["s"]),
             n("Reshape", ["x", "split"], ["heads"]),
             n("Transpose", ["heads"], ["bhsd"], perm=[0, 2, 1, 3]),
             n("Concat", ["minus1", "s", "four"], ["merge_shape"], axis=0),
             n("Reshape", ["bhsd", "merge_shape"], ["merged"]),
             n("Transpose", ["merged"], ["merged_t"], perm=[0, 2, 1]),
             n("MatMul", ["merged", "merged_t"], ["scores"]),
             n("Concat", ["minus1", "two", "s", "s"], ["split_shape"], axis=0),
             n("Reshape", ["scores", "split_shape"], ["split_scores"]),
             n("Flatten", ["x"], ["flat"], axis=2)]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", 8])
    outputs = [helper.make_tensor_value_info("split_scores", TensorProto.FLOAT, None)]
    graph = helper.make_graph(nodes, "merged", [x], outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_batch_merged_with_the_heads_is_named_as_a_product():
    infos = infer_tensor_info(_merged_heads())
    assert infos["merged"].shape == ("2*b", "s", 4)
    assert infos["scores"].shape == ("2*b", "s", "s")
    assert infos["split_scores"].shape == ("b", 2, "s", "s")
    assert infos["flat"].shape == ("b*s", 8)


@pytest.mark.parametrize("batch,sequence", [(1, 3), (3, 5)])
def test_the_products_are_the_run_time_sizes(batch, sequence):
    import onnxruntime as ort

    model = _merged_heads()
    infos = infer_tensor_info(model)
    names = ["merged", "scores", "split_scores", "flat"]
    del model.graph.output[:]
    model.graph.output.extend(helper.make_tensor_value_info(v, TensorProto.FLOAT, None) for v in names)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((batch, sequence, 8)).astype(np.float32)
    env = {"b": batch, "s": sequence}
    for name, value in zip(names, session.run(None, {"x": x})):
        expected = [d if isinstance(d, int) else int(np.prod([env.get(p) or int(p) for p in d.split("*")]))
                    for d in infos[name].shape]
        assert list(value.shape) == expected, name


def test_tf2onnx_einsum_batch_products_are_followed():
    """tf2onnx lowers a Keras attention's einsum to reshapes whose targets are ReduceProd(Gather(Shape(x), batch
    axes)) and Max(batch sizes of the two operands): (b, 2, 6, 4) -> (2*b, 6, 4) and back."""
    n = helper.make_node
    nodes = [n("Shape", ["x"], ["s"]), n("Gather", ["s", "batch_axes"], ["bd"]),
             n("Max", ["bd", "bd"], ["broadcast"]), n("ReduceProd", ["broadcast"], ["p"], keepdims=1),
             n("Gather", ["s", "rest_axes"], ["rest"]),
             n("Concat", ["p", "rest"], ["flat_shape"], axis=0), n("Reshape", ["x", "flat_shape"], ["flat"]),
             n("Concat", ["broadcast", "rest"], ["back_shape"], axis=0), n("Reshape", ["flat", "back_shape"], ["back"])]
    graph = helper.make_graph(nodes, "einsum", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 2, 6, 4])],
                              [helper.make_tensor_value_info("back", TensorProto.FLOAT, None)],
                              [_int64("batch_axes", [0, 1]), _int64("rest_axes", [2, 3])])
    infos = infer_tensor_info(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8))
    assert infos["flat"].shape == ("2*b", 6, 4)
    assert infos["back"].shape == ("b", 2, 6, 4)


def _positional_convolution(float_type=TensorProto.FLOAT):
    """wav2vec2's feature encoder and positional convolution: x (n, samples) as (n, 1, samples), a stride-5 and a
    stride-2 Conv1d, then a grouped Conv1d padded by half its even kernel (one frame too many), trimmed by
    ``[:, :, :-1]`` and added to its input."""
    nodes = [helper.make_node("Unsqueeze", ["x", "one"], ["x1"]),
             helper.make_node("Conv", ["x1", "w1"], ["a"], kernel_shape=[10], strides=[5]),
             helper.make_node("Conv", ["a", "w2"], ["b"], kernel_shape=[3], strides=[2]),
             helper.make_node("Conv", ["b", "w3"], ["c"], kernel_shape=[4], pads=[2, 2], group=2),
             helper.make_node("Slice", ["c", "zero", "minus_one", "two"], ["d"]),
             helper.make_node("Add", ["b", "d"], ["y"])]
    inputs = [helper.make_tensor_value_info("x", float_type, ["n", "samples"]),
              helper.make_tensor_value_info("w1", float_type, [4, 1, 10]),
              helper.make_tensor_value_info("w2", float_type, [4, 4, 3]),
              helper.make_tensor_value_info("w3", float_type, [4, 2, 4])]
    inits = [_int64("one", [1]), _int64("zero", [0]), _int64("minus_one", [-1]), _int64("two", [2])]
    graph = helper.make_graph(nodes, "positional", inputs, [helper.make_tensor_value_info("y", float_type, None)],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_slice_that_trims_a_named_size_keeps_the_naming():
    """floor((samples-10)/10) + 1 frames from the padded convolution, one dropped: the Add's two sides agree."""
    infos = infer_tensor_info(_positional_convolution())
    assert infos["b"].shape == ("n", 4, "floor((samples-10)/10)")
    assert infos["c"].shape == ("n", 4, "floor(samples/10)")
    assert infos["d"].shape == infos["y"].shape == ("n", 4, "floor((samples-10)/10)")


@pytest.mark.parametrize("samples", [400, 409, 640])
def test_the_trimmed_sizes_are_the_run_time_sizes(samples):
    x = np.random.default_rng(1).standard_normal((2, samples)).astype(np.float32)
    _check_named_sizes_at_run_time(_positional_convolution(), "abcdy", x, {"n": 2, "samples": samples})


def test_the_positional_convolution_trains_without_run_time_reductions(tmp_path):
    model = _positional_convolution()
    weights = {name: np.random.default_rng(1).standard_normal(shape).astype(np.float32)
               for name, shape in (("w1", (4, 1, 10)), ("w2", (4, 4, 3)), ("w3", (4, 2, 4)))}
    kept = [i for i in model.graph.input if i.name not in weights]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    model.graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in weights.items())
    artifacts.generate_artifacts(model, loss=artifacts.LossType.MSELoss, artifact_directory=str(tmp_path))
    training = onnx.load(str(tmp_path / "training_model.onnx"))
    assert not [n.name for n in training.graph.node if n.op_type == "NonZero"]


@pytest.mark.parametrize("declared, expected", [
    ("((s27//10)) - 1", "floor((s27-10)/10)"),   # torch's dynamo exporter (sympy)
    ("(s27//10)", "floor(s27/10)"),
    ("((s27 - 1)//2) + 1", "floor((s27+1)/2)"),
    ("((h + 2)//2)//2", "floor((h+2)/4)"),
    ("1 + h", "h+1"),
    ("s27", "s27"),
    ("floor((s27-10)/10)", "floor((s27-10)/10)"),  # already spelled so
    ("2*s27", "2*s27"),                            # products and the rest: as given
    ("Min(32, s27)", "Min(32, s27)"),
    ("x//2", "x//2"),                              # not an input's symbol
])
def test_exporter_size_expressions_are_spelled_as_the_solvers_spell_them(declared, expected):
    from onnxtrain.ir.symbolic import canonical_name

    assert canonical_name(declared, {"s27", "h"}) == expected


def test_declared_sizes_reach_the_values_computed_from_them():
    """The dynamo exporter declares a causal mask's Expand (its sizes computed at run time) but not the Where
    that reads it: the declaration reaches the Where, whose Add with the scores then has one name per axis."""
    from onnxtrain.ir.types import infer_from_inputs

    nodes = [helper.make_node("Shape", ["scores"], ["shape"]),
             helper.make_node("Gather", ["shape", "last"], ["size"]),
             helper.make_node("Abs", ["size"], ["length"]),  # a size neither ONNX nor the solvers follow
             helper.make_node("Concat", ["one_one", "length", "length"], ["target"], axis=0),
             helper.make_node("Expand", ["allowed", "target"], ["mask"]),
             helper.make_node("Where", ["mask", "zero", "minus_inf"], ["bias"]),
             helper.make_node("Add", ["scores", "bias"], ["y"])]
    inputs = [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["n", 2, "s", "s"])]
    inits = [_int64("last", [3]), _int64("one_one", [1, 1]), numpy_helper.from_array(np.array([[True]]), "allowed"),
             numpy_helper.from_array(np.array(0, np.float32), "zero"),
             numpy_helper.from_array(np.array(-np.inf, np.float32), "minus_inf")]
    mask = helper.make_tensor_value_info("mask", TensorProto.BOOL, [1, 1, "s", "s"])
    graph = helper.make_graph(nodes, "mask", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              inits, value_info=[mask])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    infos, _ = infer_from_inputs(model)
    assert infos["bias"].shape == (1, 1, "s", "s")
    assert infos["y"].shape == ("n", 2, "s", "s")


def test_the_source_models_declared_sizes_are_respelled_on_loading():
    """torch's dynamo exporter declares its own expressions (``((s27//10)) - 1``) for sizes the solvers name
    otherwise; after loading, one size has one name in the declarations too, and the rest is left as it was."""
    from onnxtrain.artifacts.source import load_source_model

    conv = _positional_convolution()
    declared = {"a": ["n", 4, "((samples//5)) - 1"], "b": ["n", 4, "((samples//10)) - 1"], "y": ["n", 4, "Max(1, q)"]}
    conv.graph.value_info.extend(helper.make_tensor_value_info(k, TensorProto.FLOAT, v) for k, v in declared.items()
                                 if k != "y")
    conv.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", TensorProto.FLOAT, declared["y"]))
    model = load_source_model(conv).model
    spelled = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
               for v in [*model.graph.value_info, *model.graph.output]}
    assert spelled == {"a": ["n", 4, "floor((samples-5)/5)"], "b": ["n", 4, "floor((samples-10)/10)"],
                       "y": ["n", 4, "Max(1, q)"]}
    assert infer_tensor_info(model)["b"].shape == ("n", 4, "floor((samples-10)/10)")


def test_a_derived_size_wins_over_another_name_declared_for_it(tmp_path):
    """The dynamo exporter declares BERT's position ids sliced to the sequence as ``Min(32, s)`` (the table's
    length or the sequence's); the slice is ``s`` or the Add with the word embeddings would fail, so the derived
    name is used, declared values computed from it included, and the gradient does not reduce at run time."""
    from onnxtrain.ir.types import infer_from_inputs

    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Shape", ["ids"], ["length"], start=1, end=2),
             helper.make_node("Slice", ["position_ids", "zero", "length", "one"], ["positions"]),
             helper.make_node("Gather", ["position_table", "positions"], ["position_embeddings"]),
             helper.make_node("Gather", ["word_table", "ids"], ["word_embeddings"]),
             helper.make_node("Add", ["word_embeddings", "position_embeddings"], ["y"])]
    inits = [_int64("position_ids", [list(range(32))]), _int64("zero", [0]), _int64("one", [1]),
             numpy_helper.from_array(rng.standard_normal((32, 4)).astype(np.float32), "position_table"),
             numpy_helper.from_array(rng.standard_normal((10, 4)).astype(np.float32), "word_table")]
    declared = [helper.make_tensor_value_info("positions", TensorProto.INT64, [1, "Min(32, s)"]),
                helper.make_tensor_value_info("position_embeddings", TensorProto.FLOAT, [1, "Min(32, s)", 4])]
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, ["n", "s"])
    graph = helper.make_graph(nodes, "embeddings", [ids], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              inits, value_info=declared)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    infos, corrected = infer_from_inputs(model)
    assert infos["position_embeddings"].shape == (1, "s", 4) and "position_embeddings" in corrected
    artifacts.generate_artifacts(model, loss=artifacts.LossType.MSELoss, artifact_directory=str(tmp_path))
    training = onnx.load(str(tmp_path / "training_model.onnx"))
    assert not [n.name for n in training.graph.node if n.op_type == "NonZero"]


def _rotate_half(divisor: int = 2) -> onnx.ModelProto:
    """transformers' rotate_half as the TorchScript exporter traces it: x (b, s, 8) split at
    ``Shape(x)[-1] / divisor`` (an integer Div read from the shape), the halves swapped, the second negated, then
    scaled by a per-channel weight and added to x scaled by another (RoPE's q cos + rotate_half(q) sin)."""
    inits = [_int64("last", [-1]), _int64("zero", [0]), _int64("big", [2 ** 62]), _int64("axis", [-1]),
             _int64("divisor", divisor), numpy_helper.from_array(np.linspace(0.5, 1.5, 8, dtype=np.float32), "cos"),
             numpy_helper.from_array(np.linspace(-1, 1, 8, dtype=np.float32), "sin")]
    nodes = [helper.make_node("Shape", ["x"], ["xs"]),
             helper.make_node("Gather", ["xs", "last"], ["width"], axis=0),
             helper.make_node("Squeeze", ["width"], ["width_scalar"]),
             helper.make_node("Div", ["width_scalar", "divisor"], ["half_scalar"]),
             helper.make_node("Unsqueeze", ["half_scalar", "zero"], ["half"]),
             helper.make_node("Slice", ["x", "zero", "half", "axis"], ["x1"]),
             helper.make_node("Slice", ["x", "half", "big", "axis"], ["x2"]),
             helper.make_node("Neg", ["x2"], ["minus_x2"]),
             helper.make_node("Concat", ["minus_x2", "x1"], ["rotated"], axis=-1),
             helper.make_node("Mul", ["x", "cos"], ["a"]),
             helper.make_node("Mul", ["rotated", "sin"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["y"])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", 8])
    graph = helper.make_graph(nodes, "rotate_half", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_slice_at_half_the_width_read_from_the_shape_is_named(tmp_path):
    """Before: ONNX data propagation stops at the integer Div, so both halves (and the rotated tensor) had unknown
    sizes and the sin weight's gradient summed over axes found at run time (NonZero; every TorchScript export of a
    LLaMA-style model had 14-20 such reductions)."""
    model = _rotate_half()
    infos = infer_tensor_info(model)
    assert infos["x1"].shape == ("b", "s", 4) and infos["x2"].shape == ("b", "s", 4)
    assert infos["rotated"].shape == ("b", "s", 8)
    artifacts.generate_artifacts(model, requires_grad=["cos", "sin"], loss=artifacts.LossType.MSELoss,
                                 artifact_directory=str(tmp_path))
    training = onnx.load(str(tmp_path / "training_model.onnx"))
    assert not [n.name for n in training.graph.node if n.op_type == "NonZero"]


@pytest.mark.parametrize("left,right,expected", [(8, 2, 4), (7, 2, 3), (-7, 2, -3), (7, -2, -3), (5, 0, None)])
def test_integer_division_truncates_toward_zero_as_onnx_div(left, right, expected):
    from onnxtrain.ir.symbolic import _integer_division

    assert _integer_division(left, right) == expected


def _tiled_pairs() -> onnx.ModelProto:
    """x (b, s, 4) tiled by constant repeats (1, 1, 2) to (b, s, 8) and added to v = u * w, u (b, s, 8) (GPT-J's
    rotary sin and cos repeated over pairs, as the TorchScript exporter writes repeat_interleave)."""
    inits = [_int64("repeats", [1, 1, 2]), numpy_helper.from_array(np.linspace(0.5, 1.5, 8, dtype=np.float32), "w")]
    nodes = [helper.make_node("Tile", ["x", "repeats"], ["tiled"]),
             helper.make_node("Mul", ["u", "w"], ["v"]),
             helper.make_node("Add", ["tiled", "v"], ["y"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", 4]),
              helper.make_tensor_value_info("u", TensorProto.FLOAT, ["b", "s", 8])]
    graph = helper.make_graph(nodes, "tiled", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_tile_by_constant_repeats_keeps_the_symbols_it_repeats_once(tmp_path):
    """Before: ONNX inference gave the tiled tensor fresh symbols for 'b' and 's' (repeated once), and the weight's
    gradient summed over axes found at run time (GPT-J and CodeGen TorchScript exports: 18 such reductions)."""
    model = _tiled_pairs()
    assert infer_tensor_info(model)["tiled"].shape == ("b", "s", 8)
    artifacts.generate_artifacts(model, requires_grad=["w"], loss=artifacts.LossType.MSELoss,
                                 artifact_directory=str(tmp_path))
    training = onnx.load(str(tmp_path / "training_model.onnx"))
    assert not [n.name for n in training.graph.node if n.op_type == "NonZero"]


def _heads_by_batch_times_heads() -> onnx.ModelProto:
    """nn.MultiheadAttention as the TorchScript exporter writes it: x (s, b, 8) reshaped to (s, b * 2, 8 / 2), both
    computed from scalars gathered from the shape, scaled by a per-channel weight, reshaped back to (s, b, 8) and
    added to x."""
    inits = [_int64("i0", 0), _int64("i1", 1), _int64("i2", 2), _int64("heads", 2), _int64("zero", [0]),
             _int64("width", [8]), numpy_helper.from_array(np.linspace(0.5, 1.5, 4, dtype=np.float32), "w")]
    nodes = [helper.make_node("Shape", ["x"], ["xs"]),
             *[helper.make_node("Gather", ["xs", f"i{k}"], [f"d{k}"], axis=0) for k in range(3)],
             helper.make_node("Mul", ["d1", "heads"], ["bh"]),
             helper.make_node("Div", ["d2", "heads"], ["head_dim"]),
             *[helper.make_node("Unsqueeze", [v, "zero"], [v + "_1"]) for v in ("d0", "d1", "bh", "head_dim")],
             helper.make_node("Concat", ["d0_1", "bh_1", "head_dim_1"], ["split_shape"], axis=0),
             helper.make_node("Reshape", ["x", "split_shape"], ["split"]),
             helper.make_node("Mul", ["split", "w"], ["scaled"]),
             helper.make_node("Concat", ["d0_1", "d1_1", "width"], ["merge_shape"], axis=0),
             helper.make_node("Reshape", ["scaled", "merge_shape"], ["merged"]),
             helper.make_node("Add", ["merged", "x"], ["y"])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["s", "b", 8])
    graph = helper.make_graph(nodes, "heads", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_batch_times_heads_read_from_the_shape_is_named(tmp_path):
    """Before: Mul(batch, 2) was followed only for two known ints and Div not at all, so the split had fresh
    symbols and the weight's gradient summed over axes found at run time (nn.MultiheadAttention, TorchScript)."""
    model = _heads_by_batch_times_heads()
    infos = infer_tensor_info(model)
    assert infos["split"].shape == ("s", "2*b", 4)
    assert infos["merged"].shape == ("s", "b", 8)
    artifacts.generate_artifacts(model, requires_grad=["w"], loss=artifacts.LossType.MSELoss,
                                 artifact_directory=str(tmp_path))
    training = onnx.load(str(tmp_path / "training_model.onnx"))
    assert not [n.name for n in training.graph.node if n.op_type == "NonZero"]
