"""onnxruntime's fused contrib ops rewritten as standard ops: the same values as onnxruntime's own kernels, and a
BERT optimized by onnxruntime.transformers trains like the model it was optimized from."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxtrain.artifacts.contrib_ops import CONTRIB, lower_contrib_ops

ORT_VERSION = tuple(int(p) for p in ort.__version__.split(".")[:2])
RNG = np.random.default_rng(0)
X = RNG.standard_normal((2, 3, 8)).astype(np.float32)
SKIP = RNG.standard_normal((2, 3, 8)).astype(np.float32)
VEC = {name: RNG.standard_normal(8).astype(np.float32) for name in ("gamma", "beta", "bias")}
MAT = RNG.standard_normal((8, 8)).astype(np.float32)

# onnxruntime registers these in the default domain (LayerNormalization below opset 17, where ONNX has none)
ORT_DEFAULT_DOMAIN = ("LayerNormalization", "SimplifiedLayerNormalization")

CASES = {
    "Gelu": (["x"], {}, 1),
    "BiasGelu": (["x", "bias"], {}, 1),
    "FastGelu": (["x", "bias"], {}, 1),
    "FastGelu_no_bias": (["x"], {}, 1),
    "QuickGelu": (["x"], {"alpha": 1.5}, 1),
    "LayerNormalization": (["x", "gamma", "beta"], {"epsilon": 1e-5, "axis": -1}, 1),
    "SkipLayerNormalization": (["x", "skip", "gamma", "beta", "bias"], {"epsilon": 1e-5}, 4),
    "SkipLayerNormalization_no_beta": (["x", "skip", "gamma"], {"epsilon": 1e-5}, 1),
    "SimplifiedLayerNormalization": (["x", "gamma"], {"epsilon": 1e-5, "axis": -1}, 1),
    "SkipSimplifiedLayerNormalization": (["x", "skip", "gamma", "", "bias"], {"epsilon": 1e-5}, 1),
    "FusedMatMul": (["x", "w"], {"transB": 1, "alpha": 0.5}, 1),
}


def _model(op_type: str, inputs: list[str], attrs: dict, outputs: int, opset: int) -> onnx.ModelProto:
    if op_type == "SkipSimplifiedLayerNormalization":
        inputs = ["x", "skip", "gamma", "bias"]
    names = [f"y{i}" for i in range(outputs)]
    if op_type == "SkipLayerNormalization" and outputs == 4:
        names = ["y0", "mean", "inv_std", "sum"]
    domain = "" if op_type in ORT_DEFAULT_DOMAIN else CONTRIB
    node = helper.make_node(op_type, inputs, names, domain=domain, **attrs)
    consts = {"gamma": VEC["gamma"], "beta": VEC["beta"], "bias": VEC["bias"], "w": MAT}
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3, 8]) for n in ("x", "skip")
                      if n in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [None, None, None]) for n in names],
        [numpy_helper.from_array(v, k) for k, v in consts.items() if k in inputs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(CONTRIB, 1)],
                             ir_version=8)


def _run(model: onnx.ModelProto) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {"x": X, "skip": SKIP}
    return session.run(None, {i.name: feeds[i.name] for i in session.get_inputs()})


@pytest.mark.parametrize("opset", [14, 17])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_contrib_op_rewritten_computes_what_onnxruntime_computes(case, opset):
    op_type = case.split("_")[0]
    if op_type == "SkipSimplifiedLayerNormalization" and ORT_VERSION < (1, 20):
        pytest.skip("onnxruntime 1.17's SkipSimplifiedLayerNormalization kernel ignores its bias input (the rewrite "
                    "follows the op's definition, which later versions compute)")
    inputs, attrs, outputs = CASES[case]
    model = _model(op_type, inputs, attrs, outputs, opset)
    expected = _run(model)
    weights = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    lowered = onnx.ModelProto()
    lowered.CopyFrom(model)
    if op_type == "LayerNormalization" and opset >= 17:   # the standard op: nothing to rewrite
        assert lower_contrib_ops(lowered, weights) == []
        return
    assert lower_contrib_ops(lowered, weights) == [op_type]
    assert all(n.domain in ("", "ai.onnx") for n in lowered.graph.node)
    del lowered.opset_import[1:]
    onnx.checker.check_model(lowered, full_check=True)
    for got, want in zip(_run(lowered), expected):
        if want is None:   # onnxruntime before 1.18 leaves SkipLayerNormalization's statistics outputs empty
            continue
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


def test_statistics_outputs_of_rms_norm_are_not_guessed():
    """SimplifiedLayerNormalization's inverse standard deviation output, when read, keeps the node as it is."""
    model = _model("SimplifiedLayerNormalization", ["x", "gamma"], {"epsilon": 1e-5}, 2, 17)
    weights = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    assert lower_contrib_ops(model, weights) == []
    assert [n.op_type for n in model.graph.node] == ["SimplifiedLayerNormalization"]


@pytest.mark.parametrize("attention,fused", [("default", {"SkipLayerNormalization", "BiasGelu"}),
                                              ("eager", {"Attention", "EmbedLayerNormalization",
                                                         "SkipLayerNormalization", "BiasGelu"})])
def test_an_ort_optimized_bert_trains_like_the_model_it_was_optimized_from(attention, fused, tmp_path):
    """onnxruntime.transformers.optimize_model fuses a BERT's LayerNorms and GELUs (SkipLayerNormalization,
    BiasGelu) and, from an eager-attention export, its attention and embeddings (Attention,
    EmbedLayerNormalization): the artifacts of the optimized file give the loss and gradients of the exported one."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxruntime.transformers.optimizer")
    from tests.zoo.vision import import_torchvision

    import_torchvision()   # transformers imports torchvision when it is installed
    transformers = pytest.importorskip("transformers")
    from onnxruntime.transformers import optimizer

    from onnxtrain import artifacts
    from onnxtrain.api import CheckpointState, Module

    torch.manual_seed(0)
    config = transformers.BertConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                                     intermediate_size=64, vocab_size=50, num_labels=3)
    if attention == "eager":   # otherwise the installed transformers' default (scaled_dot_product_attention)
        config._attn_implementation = attention
    model = transformers.BertForSequenceClassification(config).eval()
    with torch.no_grad():   # as trained weights are: no two tensors equal (a fresh model's zero biases are, and the
        for p in model.parameters():   # optimizer stores equal initializers once)
            p.normal_(0.0, 0.2)
    exported = str(tmp_path / "bert.onnx")
    axes = {"batch": 0, "sequence": 1}
    torch.onnx.export(model, (torch.randint(0, 50, (2, 6)), torch.ones(2, 6, dtype=torch.int64)), exported,
                      dynamo=False, opset_version=17, input_names=["input_ids", "attention_mask"],
                      output_names=["logits"], do_constant_folding=False,
                      dynamic_axes={"input_ids": {v: k for k, v in axes.items()},
                                    "attention_mask": {v: k for k, v in axes.items()}, "logits": {0: "batch"}})
    fused_model = optimizer.optimize_model(exported, model_type="bert", num_heads=4, hidden_size=32)
    fused_path = str(tmp_path / "bert_fused.onnx")
    fused_model.save_model_to_file(fused_path)
    assert fused <= {n.op_type for n in onnx.load(fused_path).graph.node if n.domain == CONTRIB}

    rng = np.random.default_rng(1)
    ids = rng.integers(0, 50, (3, 5))
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0]])
    labels = np.array([0, 2, 1], np.int64)
    results = []
    for path, folder in ((exported, tmp_path / "plain"), (fused_path, tmp_path / "fused")):
        artifacts.generate_artifacts(path, requires_grad=None, loss=artifacts.LossType.CrossEntropyLoss,
                                     artifact_directory=folder)
        training = onnx.load(str(folder / "training_model.onnx"))
        assert all(n.domain in ("", "ai.onnx") for n in training.graph.node)
        types = {i.name: helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type) for i in training.graph.input}
        state = CheckpointState.load_checkpoint(folder / "checkpoint")
        loss = float(Module(folder / "training_model.onnx", state)(ids.astype(types["input_ids"]),
                                                                    mask.astype(types["attention_mask"]), labels))
        results.append((loss, {n: state.parameters[n].grad for n in state.parameters.keys()}))
    (plain_loss, plain_grads), (fused_loss, fused_grads) = results
    assert fused_loss == pytest.approx(plain_loss, rel=1e-5)
    # the optimizer folds the weights' transposes into new initializers, and packs Q, K and V into one: match
    # each optimized parameter's gradient with the exported ones' by value (a packed one: the three, side by side)

    def same(a, b):
        return a.shape == b.shape and np.allclose(a, b, rtol=1e-3, atol=1e-5)

    plain = list(plain_grads.values())
    for name, grad in fused_grads.items():
        if name in plain_grads:
            assert same(grad, plain_grads[name]), name
            continue
        parts = np.split(grad, 3, axis=-1) if grad.shape[-1] % 3 == 0 else [grad]
        for part in parts:
            assert any(same(part, g) or same(part.T, g) for g in plain), name


def test_a_fused_op_without_a_rewrite_is_named_with_what_to_do(tmp_path):
    """An output computed by a contrib op onnxtrain does not rewrite (here MultiHeadAttention): the error names it
    and says to train the model as exported, or to optimize it with that fusion off."""
    from onnxtrain import artifacts

    w = numpy_helper.from_array(RNG.standard_normal((8, 24)).astype(np.float32), "qkv_weight")
    nodes = [helper.make_node("MultiHeadAttention", ["x", "x", "x"], ["context"], domain=CONTRIB, num_heads=2),
             helper.make_node("ReduceMean", ["context"], ["logits"], axes=[1], keepdims=0)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 8])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["n", 8])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(CONTRIB, 1)],
                              ir_version=8)
    with pytest.raises(ValueError, match=r"com.microsoft::MultiHeadAttention.*onnxruntime's optimizer.*before the "
                                         r"optimizer"):
        artifacts.generate_artifacts(model, requires_grad=None, loss=artifacts.LossType.CrossEntropyLoss,
                                     artifact_directory=tmp_path)


@pytest.mark.parametrize("activation,params", [("Relu", []), ("LeakyRelu", [0.2]), ("Clip", [-0.5, 0.5]),
                                               ("HardSigmoid", [0.3, 0.4]), ("Sigmoid", []), ("Tanh", [])])
@pytest.mark.parametrize("with_z", [False, True])
def test_a_session_fused_convolution_rewritten_computes_what_onnxruntime_computes(activation, params, with_z):
    """FusedConv, which onnxruntime's extended optimizations write into a saved optimized model."""
    x = RNG.standard_normal((2, 3, 6, 6)).astype(np.float32)
    z = RNG.standard_normal((2, 4, 3, 3)).astype(np.float32)
    inits = [numpy_helper.from_array(RNG.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(RNG.standard_normal(4).astype(np.float32), "b")]
    attrs = {"activation": activation, "strides": [2, 2], "pads": [1, 1, 1, 1], "kernel_shape": [3, 3]}
    if params:
        attrs["activation_params"] = params
    node = helper.make_node("FusedConv", ["x", "w", "b", "z"] if with_z else ["x", "w", "b"], ["y"], domain=CONTRIB,
                            **attrs)
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 6, 6])]
    if with_z:
        inputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, ["n", 4, 3, 3]))
    graph = helper.make_graph([node], "g", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * 4)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(CONTRIB, 1)],
                              ir_version=8)
    feeds = {"x": x, "z": z} if with_z else {"x": x}
    plain = ort.SessionOptions()   # the kernel itself: onnxruntime 1.17's NCHWc rewrite of FusedConv with Z fails
    plain.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    expected = ort.InferenceSession(model.SerializeToString(), plain, providers=["CPUExecutionProvider"]).run(None,
                                                                                                            feeds)
    assert lower_contrib_ops(model, {i.name: numpy_helper.to_array(i) for i in graph.initializer}) == ["FusedConv"]
    del model.opset_import[1:]
    onnx.checker.check_model(model, full_check=True)
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-5, atol=1e-5)


def test_a_fused_gemm_rewritten_computes_what_onnxruntime_computes():
    a = RNG.standard_normal((5, 4)).astype(np.float32)
    inits = [numpy_helper.from_array(RNG.standard_normal((3, 4)).astype(np.float32), "w"),
             numpy_helper.from_array(RNG.standard_normal(3).astype(np.float32), "c")]
    node = helper.make_node("FusedGemm", ["a", "w", "c"], ["y"], domain=CONTRIB, transB=1, alpha=0.5, beta=2.0,
                            activation="LeakyRelu", activation_alpha=0.1)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["n", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, None])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(CONTRIB, 1)],
                              ir_version=8)
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"a": a})
    assert lower_contrib_ops(model, {i.name: numpy_helper.to_array(i) for i in graph.initializer}) == ["FusedGemm"]
    del model.opset_import[1:]
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"a": a})
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-5, atol=1e-5)


def test_a_cnn_saved_by_an_optimizing_session_trains_like_the_exported_one(tmp_path):
    """A model saved with SessionOptions.optimized_model_filepath (extended optimizations: FusedConv) gives the
    loss and gradients of the model it came from."""
    torch = pytest.importorskip("torch")
    from onnxtrain import artifacts
    from onnxtrain.api import CheckpointState, Module

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                              torch.nn.Conv2d(8, 8, 3, stride=2), torch.nn.ReLU6(), torch.nn.Flatten(),
                              torch.nn.Linear(8 * 3 * 3, 4)).eval()
    exported = str(tmp_path / "cnn.onnx")
    torch.onnx.export(net, (torch.randn(1, 3, 8, 8),), exported, dynamo=False, input_names=["x"],
                      output_names=["y"], dynamic_axes={"x": {0: "n"}})
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(tmp_path / "cnn_fused.onnx")
    ort.InferenceSession(exported, options, providers=["CPUExecutionProvider"])
    assert "FusedConv" in {n.op_type for n in onnx.load(options.optimized_model_filepath).graph.node}

    x = np.random.default_rng(2).standard_normal((3, 3, 8, 8)).astype(np.float32)
    labels = np.array([0, 3, 1], np.int64)
    results = []
    for path, folder in ((exported, tmp_path / "plain"), (options.optimized_model_filepath, tmp_path / "fused")):
        artifacts.generate_artifacts(path, requires_grad=None, loss=artifacts.LossType.CrossEntropyLoss,
                                     artifact_directory=folder)
        state = CheckpointState.load_checkpoint(folder / "checkpoint")
        loss = float(Module(folder / "training_model.onnx", state)(x, labels))
        results.append((loss, {n: state.parameters[n].grad for n in state.parameters.keys()}))
    (plain_loss, plain_grads), (fused_loss, fused_grads) = results
    assert fused_loss == pytest.approx(plain_loss, rel=1e-5)
    assert len(plain_grads) == len(fused_grads)
    for name, grad in fused_grads.items():   # by value: onnxruntime 1.17 names the folded weights its own way
        assert any(g.shape == grad.shape and np.allclose(grad, g, rtol=1e-4, atol=1e-6)
                   for g in plain_grads.values()), name


def _contrib_model(nodes, inputs, outputs, inits, opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(CONTRIB, 1)],
                             ir_version=8)


def _lowered_matches(model, feeds, expected_ops, rtol=1e-5, atol=1e-5):
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    weights = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    assert lower_contrib_ops(model, weights) == expected_ops
    del model.opset_import[1:]
    onnx.checker.check_model(model, full_check=True)
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, w in zip(got, expected):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


@pytest.mark.parametrize("mask", [None, "lengths", "raw"])
@pytest.mark.parametrize("unidirectional", [0, 1])
def test_bert_attention_rewritten_computes_what_onnxruntime_computes(mask, unidirectional):
    batch, seq, hidden, heads = 2, 5, 8, 2
    x = RNG.standard_normal((batch, seq, hidden)).astype(np.float32)
    inits = [numpy_helper.from_array(RNG.standard_normal((hidden, 3 * hidden)).astype(np.float32), "qkv_w"),
             numpy_helper.from_array(RNG.standard_normal(3 * hidden).astype(np.float32), "qkv_b")]
    feeds = {"x": x}
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", hidden])]
    node_inputs = ["x", "qkv_w", "qkv_b"]
    if mask == "lengths":
        feeds["m"] = np.array([3, 5], np.int32)
        inputs.append(helper.make_tensor_value_info("m", TensorProto.INT32, ["b"]))
        node_inputs.append("m")
    elif mask == "raw":
        feeds["m"] = np.array([[1, 1, 0, 1, 0], [1, 1, 1, 1, 1]], np.int32)
        inputs.append(helper.make_tensor_value_info("m", TensorProto.INT32, ["b", "s"]))
        node_inputs.append("m")
    node = helper.make_node("Attention", node_inputs, ["y"], domain=CONTRIB, num_heads=heads,
                            unidirectional=unidirectional)
    model = _contrib_model([node], inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * 3)], inits)
    _lowered_matches(model, feeds, ["Attention"])


@pytest.mark.parametrize("segments", [False, True])
def test_embed_layer_norm_rewritten_computes_what_onnxruntime_computes(segments):
    batch, seq, hidden = 2, 5, 8
    feeds = {"ids": RNG.integers(0, 20, (batch, seq)).astype(np.int32),
             "mask": np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], np.int32)}
    inits = [numpy_helper.from_array(RNG.standard_normal((20, hidden)).astype(np.float32), "word"),
             numpy_helper.from_array(RNG.standard_normal((16, hidden)).astype(np.float32), "position"),
             numpy_helper.from_array(RNG.standard_normal((2, hidden)).astype(np.float32), "segment"),
             numpy_helper.from_array(RNG.standard_normal(hidden).astype(np.float32), "gamma"),
             numpy_helper.from_array(RNG.standard_normal(hidden).astype(np.float32), "beta")]
    inputs = [helper.make_tensor_value_info("ids", TensorProto.INT32, ["b", "s"]),
              helper.make_tensor_value_info("mask", TensorProto.INT32, ["b", "s"])]
    if segments:
        feeds["seg"] = RNG.integers(0, 2, (batch, seq)).astype(np.int32)
        inputs.append(helper.make_tensor_value_info("seg", TensorProto.INT32, ["b", "s"]))
    node = helper.make_node("EmbedLayerNormalization",
                            ["ids", "seg" if segments else "", "word", "position", "segment" if segments else "",
                             "gamma", "beta", "mask"], ["y", "mask_index"], domain=CONTRIB, epsilon=1e-5)
    model = _contrib_model([node], inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * 3),
                                            helper.make_tensor_value_info("mask_index", TensorProto.INT32, [None])],
                           inits)
    _lowered_matches(model, feeds, ["EmbedLayerNormalization"])
