import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from onnxtrain.artifacts import LossType, generate_artifacts
from onnxtrain.artifacts.passes import RecomputeInBackward
from onnxtrain.artifacts.passes.recompute import SUFFIX, forward_nodes
from tests.artifacts.as_built import as_built

N, D, H = 4, 6, 10


def _mlp(activation: str) -> onnx.ModelProto:
    """x @ W1 -> activation -> @ W2; the erf GELU as torch exports it, or tanh(2 h)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=(D, H)).astype(np.float32), "W1"),
             numpy_helper.from_array(rng.normal(size=(H, 3)).astype(np.float32), "W2"),
             numpy_helper.from_array(np.array(2 ** 0.5, np.float32), "sqrt2"),
             numpy_helper.from_array(np.array(1.0, np.float32), "one"),
             numpy_helper.from_array(np.array(0.5, np.float32), "half")]
    if activation == "gelu":
        act = [helper.make_node("Div", ["h", "sqrt2"], ["u"]), helper.make_node("Erf", ["u"], ["e"]),
               helper.make_node("Add", ["e", "one"], ["t"]), helper.make_node("Mul", ["h", "t"], ["m"]),
               helper.make_node("Mul", ["m", "half"], ["a"])]
    else:  # tanh's backward reads its output, whose chain starts at h, which nothing else keeps
        act = [helper.make_node("Mul", ["h", "half"], ["u"]), helper.make_node("Tanh", ["u"], ["a"])]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W1"], ["h"]), *act, helper.make_node("MatMul", ["a", "W2"], ["y"])],
        "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [N, D])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [N, 3])], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _training_model(tmp_path, activation: str, recompute: bool = False) -> onnx.ModelProto:
    """The generated training model, before generate_artifacts' memory passes, or (``recompute``) with those of
    this module only (GeluBackward would rewrite the GELU's backward first)."""
    with as_built(keep=("ShapesInForward", "RecomputeInBackward")) if recompute else as_built():
        paths = generate_artifacts(_mlp(activation), requires_grad=["W1"], frozen_params=["W2"],
                                   loss=LossType.MSELoss, artifact_directory=tmp_path)
    return onnx.load(paths["training"])


def _run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {k: v for k, v in feeds.items() if k in {i.name for i in model.graph.input}})


def _backward_reads(model: onnx.ModelProto) -> set[str]:
    """The forward values (those the loss depends on) that other nodes read."""
    producer = {o: n for n in model.graph.node for o in n.output}
    forward, stack = set(), [model.graph.output[0].name]
    while stack:
        node = producer.get(stack.pop())
        if node is not None and id(node) not in forward:
            forward.add(id(node))
            stack.extend(node.input)
    made = {o for n in model.graph.node if id(n) in forward for o in n.output}
    return {x for n in model.graph.node if id(n) not in forward for x in n.input if x in made}


def _feeds(model: onnx.ModelProto) -> dict:
    rng = np.random.default_rng(1)
    feeds = {"x": rng.normal(size=(N, D)).astype(np.float32), "target": rng.normal(size=(N, 3)).astype(np.float32),
             "lazy_reset_grad": np.array(True)}
    mlp = {i.name: numpy_helper.to_array(i) for i in _mlp("gelu").graph.initializer}
    for i in model.graph.input:
        if i.name in mlp:
            feeds[i.name] = mlp[i.name]
        elif i.name not in feeds:
            shape = [d.dim_value for d in i.type.tensor_type.shape.dim]
            feeds[i.name] = np.zeros(shape, np.float32)
    return feeds


def test_the_gelu_backward_keeps_only_its_input(tmp_path):
    model = _training_model(tmp_path, "gelu")
    assert {"h", "u", "t"} <= _backward_reads(model)  # Erf reads u, Mul reads h and t
    result = RecomputeInBackward()(model)
    assert result.modified
    assert _backward_reads(result.model) & {"u", "e", "t", "m"} == set()
    assert "h" in _backward_reads(result.model)
    copies = sorted(n.op_type for n in result.model.graph.node if n.name.endswith(SUFFIX))
    assert copies == ["Add", "Div", "Erf"]
    feeds = _feeds(model)
    for got, want in zip(_run(result.model, feeds), _run(model, feeds)):  # loss and the gradient of W1
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_generate_artifacts_recomputes_in_every_training_graph(tmp_path):
    model = _training_model(tmp_path, "gelu", recompute=True)
    assert _backward_reads(model) & {"u", "e", "t", "m"} == set()
    assert sorted(n.op_type for n in model.graph.node if n.name.endswith(SUFFIX)) == ["Add", "Div", "Erf"]


def test_onnxruntime_does_not_merge_the_copies_back(tmp_path):
    model = RecomputeInBackward()(_training_model(tmp_path, "gelu")).model
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    optimized = onnx.load(str(tmp_path / "optimized.onnx"))
    ops = [n.op_type for n in optimized.graph.node]
    # two erfs: the forward's (fused into one Gelu node once nothing else reads its intermediates) and the copy's
    assert ops.count("Erf") + ops.count("Gelu") == 2, ops


def test_a_copy_waits_for_the_backward_to_reach_it(tmp_path):
    """onnxruntime orders the nodes itself: the copied chain's view reads a shape computed after a value of the
    backward, so the copy cannot run right after the forward (and stay alive through the backward's start)."""
    model = _training_model(tmp_path, "gelu")
    forward = forward_nodes(model.graph.node, model.graph.output[0].name)
    backward = {n.name for k, n in enumerate(model.graph.node) if k not in forward}
    result = RecomputeInBackward()(model).model
    producer = {o: n for n in result.graph.node for o in n.output}
    (view,) = [n for n in result.graph.node if n.name.endswith("/view")]
    ancestors, stack = set(), [view.input[1]]
    while stack:
        node = producer.get(stack.pop())
        if node is not None and node.name not in ancestors:
            ancestors.add(node.name)
            stack.extend(node.input)
    assert ancestors & backward
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(result.SerializeToString(), so, providers=["CPUExecutionProvider"])
    assert "Size" in [n.op_type for n in onnx.load(str(tmp_path / "optimized.onnx")).graph.node]  # not folded


def test_a_chain_from_a_value_nothing_keeps_is_left_alone(tmp_path):
    model = _training_model(tmp_path, "tanh")
    assert "a" in _backward_reads(model) and "h" not in _backward_reads(model)
    result = RecomputeInBackward()(model)
    assert not result.modified and result.model is model


def _attention(head: int) -> onnx.ModelProto:
    """softmax(q k^T) v over [B, S, head] projections of x: with only Wq trained, the backward needs k and v
    (dq = dS k) and the probabilities, not q."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=(D, head)).astype(np.float32), w) for w in ("Wq", "Wk", "Wv")]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "Wq"], ["q"]), helper.make_node("MatMul", ["x", "Wk"], ["k"]),
         helper.make_node("MatMul", ["x", "Wv"], ["v"]), helper.make_node("Transpose", ["k"], ["kT"], perm=[0, 2, 1]),
         helper.make_node("MatMul", ["q", "kT"], ["scores"]), helper.make_node("Softmax", ["scores"], ["p"], axis=-1),
         helper.make_node("MatMul", ["p", "v"], ["y"])],
        "attention", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [N, 5, D])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [N, 5, head])], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_the_probabilities_are_recomputed_from_a_smaller_query_the_backward_did_not_keep(tmp_path):
    for head, recomputed in ((2, True), (5, False)):  # sequence 5: q (5 x head) is smaller than p (5 x 5) or not
        with as_built():
            paths = generate_artifacts(_attention(head), requires_grad=["Wq"], frozen_params=["Wk", "Wv"],
                                       loss=LossType.MSELoss, artifact_directory=tmp_path / str(head))
        model = onnx.load(paths["training"])
        assert {"p", "kT", "v"} <= _backward_reads(model) and "q" not in _backward_reads(model)
        result = RecomputeInBackward()(model)
        assert result.modified == recomputed
        if not recomputed:
            continue
        assert "p" not in _backward_reads(result.model) and {"q", "kT"} <= _backward_reads(result.model)
        rng = np.random.default_rng(1)
        feeds = {"x": rng.normal(size=(N, 5, D)).astype(np.float32), "lazy_reset_grad": np.array(True),
                 "target": rng.normal(size=(N, 5, head)).astype(np.float32),
                 **{i.name: numpy_helper.to_array(i) for i in _attention(head).graph.initializer}}
        for i in model.graph.input:
            if i.name not in feeds:  # the gradient buffer
                feeds[i.name] = np.zeros([d.dim_value for d in i.type.tensor_type.shape.dim], np.float32)
        for got, want in zip(_run(result.model, feeds), _run(model, feeds)):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_a_cnn_is_left_alone_without_shape_inference_or_decoding_constants(tmp_path, monkeypatch):
    """A CNN has nothing this pass recomputes (ReLU masks, Conv and BatchNormalization inputs): the pass returns
    the model itself, having inferred no shapes and decoded no constant."""
    from tests.artifacts.test_backward_order import _cnn

    with as_built():
        paths = generate_artifacts(_cnn(), requires_grad=["W1", "W2", "W3", "Wc"], frozen_params=[],
                                   loss=LossType.CrossEntropyLoss, artifact_directory=tmp_path)
    model = onnx.load(paths["training"])

    def refuse(*args, **kwargs):
        raise AssertionError("the pass inferred shapes or decoded tensors on a graph it leaves alone")

    monkeypatch.setattr("onnxtrain.artifacts.passes.recompute.infer_tensor_info", refuse)
    monkeypatch.setattr(numpy_helper, "to_array", refuse)
    result = RecomputeInBackward()(model)
    assert not result.modified and result.model is model


def test_one_element_constants_are_found_from_their_dimensions():
    from onnxtrain.artifacts.passes.recompute import _one_element_constants
    from onnxtrain.ir.passes import constant_values

    nodes = [helper.make_node("Constant", [], ["c_scalar"], value=numpy_helper.from_array(np.array(2.0, np.float32))),
             helper.make_node("Constant", [], ["c_vector"], value=numpy_helper.from_array(np.ones(3, np.float32))),
             helper.make_node("Constant", [], ["c_int"], value_int=3),
             helper.make_node("Constant", [], ["c_ints1"], value_ints=[4]),
             helper.make_node("Constant", [], ["c_ints2"], value_ints=[4, 5]),
             helper.make_node("Constant", [], ["c_floats1"], value_floats=[0.5]),
             helper.make_node("Constant", [], ["c_string"], value_string="s")]
    inits = [numpy_helper.from_array(np.array([1.0], np.float32), "i_one"),
             numpy_helper.from_array(np.zeros((2, 2), np.float32), "i_four")]
    graph = helper.make_graph(nodes, "g", [], [], initializer=inits)
    expected = {k for k, v in constant_values(graph).items() if v.size == 1}
    assert _one_element_constants(graph) == expected == {"c_scalar", "c_int", "c_ints1", "c_floats1", "i_one"}


def test_the_forward_infos_given_spare_the_shape_inference_and_change_nothing(tmp_path, monkeypatch):
    """generate_artifacts gives the pass the types and shapes it inferred for the forward: the rewrite is the same
    as with the pass's own shape inference of the whole graph, which it then does not run."""
    from onnxtrain.ir.types import infer_tensor_info

    model = _training_model(tmp_path, "gelu")
    expected = RecomputeInBackward()(model)
    assert expected.modified
    forward = forward_nodes(model.graph.node, model.graph.output[0].name)
    made = {o for k, n in enumerate(model.graph.node) if k in forward for o in n.output}
    inputs = {i.name for i in model.graph.input}
    infos = {k: v for k, v in infer_tensor_info(model).items() if k in made or k in inputs}

    def refuse(*args, **kwargs):
        raise AssertionError("the pass inferred the shapes of the whole graph")

    monkeypatch.setattr("onnxtrain.artifacts.passes.recompute.infer_tensor_info", refuse)
    result = RecomputeInBackward(infos=infos)(model)
    assert result.model.SerializeToString() == expected.model.SerializeToString()


def test_the_gelu_output_the_next_weight_gradient_reads_is_recomputed_from_the_gelu_input(tmp_path):
    """With W2 trained, dW2 = a^T dy reads the GELU's output a = (h * (1 + erf(h / sqrt 2))) * 0.5: a join of h
    (kept anyway: GeluBackward's derivative reads it) and a chain from h, recomputed through one view of h that both
    copies read."""
    with as_built(keep=("GeluBackward",)):
        paths = generate_artifacts(_mlp("gelu"), requires_grad=["W1", "W2"], loss=LossType.MSELoss,
                                   artifact_directory=tmp_path)
    model = onnx.load(paths["training"])
    assert {"a", "h"} <= _backward_reads(model)
    result = RecomputeInBackward()(model)
    assert result.modified
    assert _backward_reads(result.model) & {"u", "e", "t", "m", "a"} == set() and "h" in _backward_reads(model)
    copies = [n for n in result.model.graph.node if n.name.endswith(SUFFIX)]
    assert sorted(n.op_type for n in copies) == ["Add", "Div", "Erf", "Mul", "Mul"]
    views = {n.output[0] for n in result.model.graph.node if n.name.endswith("/view")}
    (div,) = [n for n in copies if n.op_type == "Div"]
    (first_mul,) = [n for n in copies if n.op_type == "Mul" and div.input[0] in n.input]
    assert div.input[0] in views   # the same view of h: onnxruntime can fuse the copy as it fuses the forward
    feeds = _feeds(model)
    for got, want in zip(_run(result.model, feeds), _run(model, feeds)):  # loss and both gradients
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(result.model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    optimized = [n.op_type for n in onnx.load(str(tmp_path / "optimized.onnx")).graph.node]
    assert optimized.count("Gelu") == 2, optimized   # the forward's and the copy's


def test_a_join_does_not_recompute_a_matrix_product(tmp_path):
    """MSE's Sub(y, target) after an attention output y = p v (p and v kept): recomputing it would recompute the
    product, so the pass keeps it (the probabilities are not recomputed either when q is as large as p)."""
    with as_built():
        paths = generate_artifacts(_attention(5), requires_grad=["Wq"], frozen_params=["Wk", "Wv"],
                                   loss=LossType.MSELoss, artifact_directory=tmp_path)
    result = RecomputeInBackward()(onnx.load(paths["training"]))
    assert not result.modified


def _normalized(trained: list[str], dropout: float | None = None) -> onnx.ModelProto:
    """h = x @ W1; n = LayerNorm(h + x) (scale g, bias b); y = n @ W2: W2's gradient n^T dy reads the
    normalization's output, W1's reads its input (through the normalization's backward). With ``dropout``, y
    reads n through a training-mode Dropout of that constant ratio (output ``d``)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=(D, D)).astype(np.float32), "W1"),
             numpy_helper.from_array(rng.normal(size=(D, 3)).astype(np.float32), "W2"),
             numpy_helper.from_array(rng.uniform(0.5, 1.5, D).astype(np.float32), "g"),
             numpy_helper.from_array(rng.normal(size=D).astype(np.float32), "b")]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W1"], ["h"]), helper.make_node("Add", ["h", "x"], ["s"]),
         helper.make_node("LayerNormalization", ["s", "g", "b"], ["n"], axis=-1, epsilon=1e-5),
         *([] if dropout is None else [
             helper.make_node("Constant", [], ["ratio"], value=numpy_helper.from_array(np.array(dropout, np.float32))),
             helper.make_node("Constant", [], ["training"], value=numpy_helper.from_array(np.array(True))),
             helper.make_node("Dropout", ["n", "ratio", "training"], ["d", "mask"])]),
         helper.make_node("MatMul", ["n" if dropout is None else "d", "W2"], ["y"])],
        "normalized", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [N, 5, D])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [N, 5, 3])], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _normalized_feeds(model: onnx.ModelProto) -> dict:
    rng = np.random.default_rng(1)
    feeds = {"x": rng.normal(size=(N, 5, D)).astype(np.float32), "lazy_reset_grad": np.array(True),
             "target": rng.normal(size=(N, 5, 3)).astype(np.float32),
             **{i.name: numpy_helper.to_array(i) for i in _normalized([]).graph.initializer}}
    for i in model.graph.input:
        if i.name not in feeds:  # the gradient buffers
            feeds[i.name] = np.zeros([d.dim_value for d in i.type.tensor_type.shape.dim], np.float32)
    return feeds


def test_a_layer_normalization_output_is_recomputed_from_the_input_its_backward_keeps(tmp_path):
    with as_built():
        paths = generate_artifacts(_normalized([]), requires_grad=["W1", "W2", "g", "b"], loss=LossType.MSELoss,
                                   artifact_directory=tmp_path)
    model = onnx.load(paths["training"])
    assert {"n", "s"} <= _backward_reads(model)
    result = RecomputeInBackward()(model)
    assert result.modified
    assert "n" not in _backward_reads(result.model) and "s" in _backward_reads(result.model)
    (copy,) = [n for n in result.model.graph.node if n.name.endswith(SUFFIX)]
    assert copy.op_type == "LayerNormalization" and len(copy.output) == 1   # not its mean and deviation again
    assert copy.input[1:] == ["g", "b"]
    feeds = _normalized_feeds(model)
    for got, want in zip(_run(result.model, feeds), _run(model, feeds)):  # loss and the four gradients
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_a_layer_normalization_whose_input_nothing_keeps_is_left_alone(tmp_path):
    """Only W2 trained: nothing differentiates through the normalization, so its input is not kept and
    recomputing its output would keep that input instead."""
    with as_built():
        paths = generate_artifacts(_normalized([]), requires_grad=["W2"], frozen_params=["W1", "g", "b"],
                                   loss=LossType.MSELoss, artifact_directory=tmp_path)
    model = onnx.load(paths["training"])
    assert "n" in _backward_reads(model) and "s" not in _backward_reads(model)
    assert not RecomputeInBackward()(model).modified


def test_a_dropout_of_ratio_zero_after_the_normalization_is_recomputed_with_it(tmp_path):
    """transformers' embeddings: LayerNorm -> Dropout(p=0) -> the projections, whose weight gradients read the
    dropout's output; with a ratio above 0 the dropout is random and stays kept."""
    for ratio, recomputed in ((0.0, True), (0.1, False)):
        with as_built():
            paths = generate_artifacts(_normalized([], dropout=ratio), requires_grad=["W1", "W2", "g", "b"],
                                       loss=LossType.MSELoss, artifact_directory=tmp_path / str(ratio))
        model = onnx.load(paths["training"])
        assert {"d", "s"} <= _backward_reads(model)
        result = RecomputeInBackward()(model)
        assert ("d" not in _backward_reads(result.model)) == recomputed
        if recomputed:
            copies = sorted(n.op_type for n in result.model.graph.node if n.name.endswith(SUFFIX))
            assert copies == ["Dropout", "LayerNormalization"]
            feeds = _normalized_feeds(model)
            for got, want in zip(_run(result.model, feeds), _run(model, feeds)):
                np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


S, HEADS, HEAD = 6, 2, 2  # sequence longer than a head: the probabilities (S x S) are recomputed from q and k


def _multi_head_attention() -> onnx.ModelProto:
    """x -> q, k, v projections split into heads as the exporters write it (Reshape, Transpose), softmax(q k^T) v,
    heads merged back (Transpose, Reshape), then the output projection Wo, whose weight gradient reads the merged
    context."""
    rng = np.random.default_rng(0)
    width = HEADS * HEAD
    inits = [numpy_helper.from_array(rng.normal(size=(D, width)).astype(np.float32), w) for w in ("Wq", "Wk", "Wv")]
    inits += [numpy_helper.from_array(rng.normal(size=(width, 3)).astype(np.float32), "Wo"),
              numpy_helper.from_array(np.array([0, 0, HEADS, HEAD], np.int64), "heads"),
              numpy_helper.from_array(np.array([0, 0, width], np.int64), "merged")]
    nodes = []
    for name in ("q", "k", "v"):
        nodes += [helper.make_node("MatMul", ["x", "W" + name], [name]),
                  helper.make_node("Reshape", [name, "heads"], [name + "_split"]),
                  helper.make_node("Transpose", [name + "_split"], [name + "_heads"],
                                   perm=[0, 2, 3, 1] if name == "k" else [0, 2, 1, 3])]
    nodes += [helper.make_node("MatMul", ["q_heads", "k_heads"], ["scores"]),
              helper.make_node("Softmax", ["scores"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "v_heads"], ["context"]),
              helper.make_node("Transpose", ["context"], ["context_t"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["context_t", "merged"], ["c"]),
              helper.make_node("MatMul", ["c", "Wo"], ["y"])]
    graph = helper.make_graph(nodes, "mha", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [N, S, D])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [N, S, 3])], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_the_attention_context_is_recomputed_from_the_recomputed_probabilities(tmp_path):
    """The output projection's weight gradient reads the context p v; the backward recomputes it with one MatMul of
    the probabilities it recomputes anyway and the value heads, copied from the projection v (which onnxruntime's
    transpose optimizer makes the backward's other readers read), not kept from the forward."""
    with as_built():
        paths = generate_artifacts(_multi_head_attention(), requires_grad=["Wq", "Wk", "Wv", "Wo"],
                                   loss=LossType.MSELoss, artifact_directory=tmp_path)
    model = onnx.load(paths["training"])
    assert {"p", "c", "v_heads"} <= _backward_reads(model)
    result = RecomputeInBackward()(model)
    reads = _backward_reads(result.model)
    assert not {"p", "c", "context", "context_t", "v_heads"} & reads and "v" in reads
    copies = [n.op_type for n in result.model.graph.node if n.name.endswith(SUFFIX)]
    assert copies.count("MatMul") == 2 and copies.count("Softmax") == 1   # q k^T and p v, one softmax
    rng = np.random.default_rng(1)
    feeds = {"x": rng.normal(size=(N, S, D)).astype(np.float32), "lazy_reset_grad": np.array(True),
             "target": rng.normal(size=(N, S, 3)).astype(np.float32),
             **{i.name: numpy_helper.to_array(i) for i in _multi_head_attention().graph.initializer}}
    for i in model.graph.input:
        if i.name not in feeds:  # the gradient buffers
            feeds[i.name] = np.zeros([d.dim_value for d in i.type.tensor_type.shape.dim], np.float32)
    for got, want in zip(_run(result.model, feeds), _run(model, feeds)):  # the loss and four gradients
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
