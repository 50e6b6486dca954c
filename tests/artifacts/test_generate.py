"""generate_artifacts: files, plain ONNX, parameter roles, losses, bad input."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx.reference import ReferenceEvaluator

from onnxtrain import blocks
from onnxtrain import conventions as names
from onnxtrain.api import CheckpointState, Module, Optimizer
from onnxtrain.artifacts import LossType, OptimType, generate_artifacts
from onnxtrain.checkpoint import load_checkpoint
from onnxtrain.runtime.backends.reference_ops import PATCHED_OPS
from tests import models

ARTIFACTS = ("training_model.onnx", "eval_model.onnx", "optimizer_model.onnx")


def test_writes_the_four_artifacts_with_prefix(tmp_path):
    paths = generate_artifacts(models.mlp(), loss=LossType.MSELoss, optimizer=OptimType.AdamW,
                               artifact_directory=tmp_path, prefix="user_")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["user_checkpoint", *(f"user_{a}" for a in ARTIFACTS)])
    assert set(paths) == {"training", "eval", "optimizer", "checkpoint"}


@pytest.mark.parametrize("model", ["mlp", "conv_bn", "conv_bn_dropout"])
def test_every_artifact_is_plain_onnx_and_runs_on_both_engines(model, tmp_path):
    forward = {"mlp": models.mlp, "conv_bn": models.conv_bn,
               "conv_bn_dropout": lambda: models.conv_bn(dropout=True)}[model]()
    generate_artifacts(forward, loss=LossType.CrossEntropyLoss, optimizer=blocks.AdamW(max_norm=1.0),
                       artifact_directory=tmp_path)
    data = load_checkpoint(tmp_path / "checkpoint")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 8) if model == "mlp" else (3, 2, 6, 6)).astype(np.float32)
    y = rng.integers(0, 3, 3).astype(np.int64)
    state = {**data.trainable, **data.frozen, **data.buffers}
    for file in ARTIFACTS:
        proto = onnx.load(tmp_path / file)
        onnx.checker.check_model(proto, full_check=True)
        assert {op.domain for op in proto.opset_import} <= {"", "ai.onnx"}, file
        foreign = [n.op_type for n in proto.graph.node if n.domain not in ("", "ai.onnx")]
        assert not foreign, f"{file} uses non-default domains: {foreign}"
        assert proto.ir_version <= 10 and proto.opset_import[0].version >= 17
        copies = [n.output[0] for n in proto.graph.node if n.op_type == "Identity"
                  and n.output[0] in {o.name for o in proto.graph.output}]
        assert not copies, f"{file}: outputs copied through Identity (a pass over memory per run): {copies}"
        feeds = {}
        for i in proto.graph.input:
            if i.name in state:
                feeds[i.name] = state[i.name]
            elif i.name.endswith("_grad.accumulation.buffer"):
                feeds[i.name] = np.zeros_like(data.trainable[i.name[:-len("_grad.accumulation.buffer")]])
            elif i.name == names.LAZY_RESET_GRAD:
                feeds[i.name] = np.array(True)
            elif i.name == names.LEARNING_RATE:
                feeds[i.name] = np.array(1e-3, np.float32)
            elif i.name == names.STEP:
                feeds[i.name] = np.array(1, np.int64)
            elif file == "optimizer_model.onnx":
                feeds[i.name] = rng.standard_normal(i.type.tensor_type.shape.dim[0].dim_value).astype(np.float32)
            else:
                feeds[i.name] = x if i.name == "input" else y
        ort_out = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
        ref_out = ReferenceEvaluator(proto, new_ops=PATCHED_OPS).run(None, feeds)
        if "dropout" in model and file == "training_model.onnx":
            continue  # random masks differ between engines
        for a, b in zip(ort_out, ref_out):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def _run_loss(folder, x, y):
    state = CheckpointState.load_checkpoint(folder / "checkpoint")
    module = Module(folder / "training_model.onnx", state)
    loss = module(x, y)
    return float(loss), state


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("loss", ["mse", "l1", "huber", "bce", "ce", "ce_weighted_ignore", "nll"])
def test_losses_match_torch(loss, reduction, tmp_path):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = np.random.default_rng(0)
    forward = models.mlp(classes=4)
    x = rng.standard_normal((6, 8)).astype(np.float32)
    if loss in ("ce", "ce_weighted_ignore", "nll"):
        y = np.array([0, 3, 1, 2, 3, 1], np.int64)
    else:
        y = rng.standard_normal((6, 4)).astype(np.float32)
        if loss == "bce":
            y = (y > 0).astype(np.float32)
    weight = np.array([0.5, 1.0, 2.0, 1.5], np.float32)
    block, torch_loss = {
        "mse": (blocks.MSELoss(reduction), lambda o, t: F.mse_loss(o, t, reduction=reduction)),
        "l1": (blocks.L1Loss(reduction), lambda o, t: F.l1_loss(o, t, reduction=reduction)),
        "huber": (blocks.HuberLoss(reduction, delta=0.5), lambda o, t: F.huber_loss(o, t, reduction=reduction,
                                                                                    delta=0.5)),
        "bce": (blocks.BCEWithLogitsLoss(reduction=reduction, pos_weight=[2.0, 1.0, 0.5, 1.0]),
                lambda o, t: F.binary_cross_entropy_with_logits(o, t, reduction=reduction,
                                                                pos_weight=torch.tensor([2.0, 1.0, 0.5, 1.0]))),
        "ce": (blocks.CrossEntropyLoss(reduction=reduction), lambda o, t: F.cross_entropy(o, t, reduction=reduction)),
        "ce_weighted_ignore": (blocks.CrossEntropyLoss(weight, reduction=reduction, ignore_index=3),
                               lambda o, t: F.cross_entropy(o, t, torch.from_numpy(weight), reduction=reduction,
                                                            ignore_index=3)),
        "nll": (blocks.NLLLoss(reduction=reduction), lambda o, t: F.nll_loss(o, t, reduction=reduction)),
    }[loss]
    generate_artifacts(forward, loss=block, optimizer=OptimType.SGD, artifact_directory=tmp_path)
    ours, state = _run_loss(tmp_path, x, y)

    params = {n: torch.tensor(state.parameters[n].data, requires_grad=True) for n in state.parameters.keys()}
    out = F.linear(F.relu(F.linear(torch.from_numpy(x), params["fc1.weight"], params["fc1.bias"])),
                   params["fc2.weight"], params["fc2.bias"])
    ref = torch_loss(out, torch.from_numpy(y))
    ref.backward()
    assert ours == pytest.approx(ref.item(), rel=1e-5)
    for n, p in params.items():
        np.testing.assert_allclose(state.parameters[n].grad, p.grad.numpy(), rtol=1e-4, atol=1e-6)


def _sequence_scorer(vocab=5):
    """A token model: (batch, sequence, 3) features -> (batch, sequence, vocab) logits, sequence length dynamic."""
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(2).standard_normal((3, vocab)).astype(np.float32)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence", 3])
    logits = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "sequence", vocab])
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["logits"])], "lm", [x], [logits],
                              [numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("ignore_index", [None, 2])
def test_cross_entropy_over_the_last_axis_matches_torch_on_sequence_logits(ignore_index, tmp_path):
    """A language model's (batch, sequence, vocabulary) logits with (batch, sequence) labels: class_axis=-1, at two
    sequence lengths with the same artifacts; torch: cross_entropy(logits.reshape(-1, V), labels.reshape(-1))."""
    torch = pytest.importorskip("torch")
    generate_artifacts(_sequence_scorer(), loss=blocks.CrossEntropyLoss(class_axis=-1, ignore_index=ignore_index),
                       optimizer=OptimType.SGD, artifact_directory=tmp_path)
    rng = np.random.default_rng(3)
    for length in (4, 7):
        x = rng.standard_normal((2, length, 3)).astype(np.float32)
        y = rng.integers(0, 5, (2, length)).astype(np.int64)
        ours, state = _run_loss(tmp_path, x, y)
        w = torch.tensor(state.parameters["w"].data, requires_grad=True)
        logits = torch.from_numpy(x) @ w
        ref = torch.nn.functional.cross_entropy(logits.reshape(-1, 5), torch.from_numpy(y).reshape(-1),
                                                ignore_index=-100 if ignore_index is None else ignore_index)
        ref.backward()
        assert ours == pytest.approx(ref.item(), rel=1e-5)
        np.testing.assert_allclose(state.parameters["w"].grad, w.grad.numpy(), rtol=1e-4, atol=1e-6)


def test_cross_entropy_on_axis_one_of_sequence_logits_warns(tmp_path, caplog):
    """Axis 1 of run-time size and a fixed last axis: the classes are probably on the last axis; the warning says
    how to read them there. With class_axis=-1 there is no warning."""
    generate_artifacts(_sequence_scorer(), loss=LossType.CrossEntropyLoss, artifact_directory=tmp_path / "a")
    assert "class_axis=-1" in caplog.text
    caplog.clear()
    generate_artifacts(_sequence_scorer(), loss=blocks.CrossEntropyLoss(class_axis=-1),
                       artifact_directory=tmp_path / "b")
    assert "class_axis" not in caplog.text
    with pytest.raises(ValueError, match="class_axis=3"):
        generate_artifacts(_sequence_scorer(), loss=blocks.CrossEntropyLoss(class_axis=3),
                           artifact_directory=tmp_path / "c")
    # exported with a fixed sequence length, (2, 6, 50) logits: axis 1 shorter than the last, the same hint
    static = _sequence_scorer(vocab=50)
    for dim, size in zip(static.graph.input[0].type.tensor_type.shape.dim, (2, 6, 3)):
        dim.dim_value = size
    for dim, size in zip(static.graph.output[0].type.tensor_type.shape.dim, (2, 6, 50)):
        dim.dim_value = size
    caplog.clear()
    generate_artifacts(static, loss=LossType.CrossEntropyLoss, artifact_directory=tmp_path / "d")
    assert "class_axis=-1" in caplog.text


def test_custom_loss_block(tmp_path):
    """A loss composed from blocks in a few lines: 0.5 * MSE + 0.1 * L1."""

    class Mixed(blocks.Block):
        def __init__(self):
            super().__init__()
            self.mse, self.l1 = blocks.MSELoss(), blocks.L1Loss()

        def build(self, output):
            return blocks.Add()(blocks.Mul(0.5)(self.mse(output, "target")), blocks.Mul(0.1)(self.l1(output, "target")))

    generate_artifacts(models.mlp(), loss=Mixed(), optimizer=OptimType.AdamW, artifact_directory=tmp_path)
    rng = np.random.default_rng(1)
    x, t = rng.standard_normal((4, 8)).astype(np.float32), rng.standard_normal((4, 4)).astype(np.float32)
    ours, state = _run_loss(tmp_path, x, t)
    module = Module(tmp_path / "training_model.onnx", state, tmp_path / "eval_model.onnx")
    assert module.input_names() == ["input", "target"]
    h = np.maximum(x @ state.parameters["fc1.weight"].data.T + state.parameters["fc1.bias"].data, 0)
    out = h @ state.parameters["fc2.weight"].data.T + state.parameters["fc2.bias"].data
    expected = 0.5 * np.mean((out - t) ** 2) + 0.1 * np.mean(np.abs(out - t))
    assert ours == pytest.approx(expected, rel=1e-5)


def test_trainable_ops_trains_only_the_last_nodes(tmp_path):
    generate_artifacts(models.mlp(), loss=LossType.CrossEntropyLoss, optimizer=OptimType.SGD,
                       artifact_directory=tmp_path, trainable_ops=1)
    data = load_checkpoint(tmp_path / "checkpoint")
    assert list(data.trainable) == ["fc2.weight", "fc2.bias"]
    assert sorted(data.frozen) == ["fc1.bias", "fc1.weight"]
    generate_artifacts(models.mlp(), loss=LossType.CrossEntropyLoss, optimizer=OptimType.SGD,
                       artifact_directory=tmp_path / "none", trainable_ops=0)
    assert not load_checkpoint(tmp_path / "none" / "checkpoint").trainable


def test_trainable_ops_counts_the_op_that_reads_a_transposed_weight(tmp_path):
    """The forms an exporter gives a Linear over a sequence: ``MatMul(x, Transpose(W)) + b`` (TorchScript without
    constant folding, torch's dynamo exporter without its optimizer), or W stored transposed, which onnxtrain gives
    back torch's name and layout through a Transpose it puts first in the graph. trainable_ops=2 (the MatMul and
    the Add) trains the last Linear's weight and bias in each, and the Transpose nodes are not ops."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w1, w2 = rng.standard_normal((8, 4)).astype(np.float32), rng.standard_normal((3, 8)).astype(np.float32)
    tensors = [numpy_helper.from_array(a, n) for a, n in [(w1, "0.weight"), (np.zeros(8, np.float32), "0.bias"),
                                                            (w2, "2.weight"), (np.zeros(3, np.float32), "2.bias")]]
    nodes = [helper.make_node("Transpose", ["0.weight"], ["w1t"], perm=[1, 0]),
             helper.make_node("MatMul", ["x", "w1t"], ["h0"]), helper.make_node("Add", ["h0", "0.bias"], ["h1"]),
             helper.make_node("Relu", ["h1"], ["h"]),
             helper.make_node("Transpose", ["2.weight"], ["w2t"], perm=[1, 0]),
             helper.make_node("MatMul", ["h", "w2t"], ["y0"]), helper.make_node("Add", ["y0", "2.bias"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", 3])], tensors)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    generate_artifacts(model, loss=LossType.MSELoss, optimizer=OptimType.SGD, artifact_directory=tmp_path,
                       trainable_ops=2)
    data = load_checkpoint(tmp_path / "checkpoint")
    assert sorted(data.trainable) == ["2.bias", "2.weight"] and sorted(data.frozen) == ["0.bias", "0.weight"]
    with pytest.raises(ValueError, match=r"trainable_ops=6 but the model has only 5 ops \(not counting the 2 "
                                         r"nodes that only prepare weights and constants\)"):
        generate_artifacts(model, loss=LossType.MSELoss, artifact_directory=tmp_path / "six", trainable_ops=6)


def test_batchnorm_statistics_become_buffers(tmp_path):
    generate_artifacts(models.conv_bn(), loss=LossType.CrossEntropyLoss, optimizer=OptimType.SGD,
                       artifact_directory=tmp_path)
    data = load_checkpoint(tmp_path / "checkpoint")
    assert sorted(data.buffers) == ["bn.running_mean", "bn.running_var"]
    assert "bn.running_mean" not in data.trainable
    outputs = [o.name for o in onnx.load(tmp_path / "training_model.onnx").graph.output]
    assert names.buffer_output_name("bn.running_mean") in outputs


def test_inference_mode_batchnorm_statistics_are_not_trained(tmp_path):
    """An eval-mode export (BatchNormalization without training_mode): its running statistics are constants,
    never trainable parameters (AdamW would drive a variance negative)."""
    model = models.conv_bn()
    bn = next(n for n in model.graph.node if n.op_type == "BatchNormalization")
    del bn.attribute[:]
    del bn.output[1:]
    generate_artifacts(model, loss=LossType.CrossEntropyLoss, optimizer=OptimType.AdamW, artifact_directory=tmp_path)
    data = load_checkpoint(tmp_path / "checkpoint")
    assert sorted(data.trainable) == ["bn.bias", "bn.weight", "conv.weight", "fc.bias", "fc.weight"]
    assert not data.buffers


def test_nominal_checkpoint_has_no_data_but_loads(tmp_path, rng):
    paths = generate_artifacts(models.mlp(), loss=LossType.CrossEntropyLoss, optimizer=OptimType.AdamW,
                               artifact_directory=tmp_path, nominal_checkpoint=True)
    full = tmp_path / "full"
    generate_artifacts(models.mlp(), loss=LossType.CrossEntropyLoss, optimizer=OptimType.AdamW,
                       artifact_directory=full)
    # Both are written, as the peer does: the full checkpoint, and the nominal one beside it.
    assert paths["nominal_checkpoint"] == str(tmp_path / "nominal_checkpoint")
    assert (tmp_path / "checkpoint").read_bytes() == (full / "checkpoint").read_bytes()
    assert (tmp_path / "nominal_checkpoint").stat().st_size < (full / "checkpoint").stat().st_size / 2
    data = load_checkpoint(tmp_path / "nominal_checkpoint")
    assert data.nominal and set(data.specs) >= {"trainable/fc1.weight"}
    state = CheckpointState.load_checkpoint(tmp_path / "nominal_checkpoint")
    module = Module(tmp_path / "training_model.onnx", state)
    assert module.get_parameters_size() == 212
    module.copy_buffer_to_parameters(Module(full / "training_model.onnx", CheckpointState.load_checkpoint(
        full / "checkpoint")).get_contiguous_parameters(trainable_only=True))
    assert np.isfinite(float(module(rng.standard_normal((2, 8)).astype(np.float32), np.array([0, 1]))))


def test_model_with_external_data_from_a_path(tmp_path, rng):
    model = models.mlp(features=64, hidden=64)
    expected = onnx.numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == "fc1.weight"))
    onnx.save_model(model, tmp_path / "model.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
                    location="model.onnx.data", size_threshold=0)
    assert (tmp_path / "model.onnx.data").stat().st_size > 64 * 64 * 4
    generate_artifacts(tmp_path / "model.onnx", loss=LossType.CrossEntropyLoss, optimizer=OptimType.AdamW,
                       artifact_directory=tmp_path / "out")
    data = load_checkpoint(tmp_path / "out" / "checkpoint")
    np.testing.assert_array_equal(data.trainable["fc1.weight"], expected)



def test_model_proto_without_its_external_data_names_the_file(tmp_path, monkeypatch):
    onnx.save_model(models.mlp(features=64, hidden=64), tmp_path / "model.onnx", save_as_external_data=True,
                    all_tensors_to_one_file=True, location="weights.bin", size_threshold=0)
    proto = onnx.load(tmp_path / "model.onnx", load_external_data=False)
    monkeypatch.chdir(tmp_path / "..")  # the relative location resolves elsewhere
    with pytest.raises(ValueError, match="external file \\('weights.bin'\\).*pass the model's path"):
        generate_artifacts(proto, loss=LossType.CrossEntropyLoss, artifact_directory=tmp_path / "out")

def test_optimizer_graph_with_gradient_clipping(tmp_path):
    generate_artifacts(models.mlp(), loss=LossType.CrossEntropyLoss, optimizer=blocks.SGD(max_norm=0.5),
                       artifact_directory=tmp_path)
    state = CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    module = Module(tmp_path / "training_model.onnx", state)
    opt = Optimizer(tmp_path / "optimizer_model.onnx", module)
    opt.set_learning_rate(1.0)
    rng = np.random.default_rng(0)
    before = module.get_contiguous_parameters(trainable_only=True).numpy()
    module(rng.standard_normal((4, 8)).astype(np.float32) * 50, np.array([0, 1, 2, 3]))
    g = np.concatenate([p.grad.ravel() for p in state.parameters.values() if p.requires_grad])
    assert np.linalg.norm(g) > 0.5
    opt.step()
    after = module.get_contiguous_parameters(trainable_only=True).numpy()
    np.testing.assert_allclose(np.linalg.norm(before - after), 0.5, rtol=1e-4)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(requires_grad=["nope"]), ValueError, r"requires_grad: 'nope' is not an initializer"),
    (dict(requires_grad=["fc1.weight"], frozen_params=["fc1.weight"]), ValueError,
     r"'fc1.weight' is listed both in requires_grad and in frozen_params"),
    (dict(loss_input_names=["logits"]), ValueError, r"'logits' is not a value of the model"),
    (dict(loss="mse"), TypeError, r"loss must be a LossType or an onnxtrain.blocks.Block"),
    (dict(optimizer="adam"), TypeError, r"optimizer must be an OptimType"),
    (dict(custom_op_library="libx.so"), ValueError, r"custom_op_library is not supported"),
    (dict(requires_grad="fc1.weight"), TypeError, r"must be a list of names"),
])
def test_bad_arguments_name_the_culprit(kwargs, error, message, tmp_path):
    args = dict(loss=LossType.CrossEntropyLoss, optimizer=OptimType.AdamW, artifact_directory=tmp_path)
    args.update(kwargs)
    with pytest.raises(error, match=message):
        generate_artifacts(models.mlp(), **args)


def test_frozen_names_that_are_not_initializers_are_skipped_with_a_warning(tmp_path):
    # Users list torch's named_buffers() there, which exporters make constants; the peer ignores them too.
    with pytest.warns(UserWarning, match=r"frozen_params: 2 names are not initializers.*'fc9.\*', 'pos_ids'"):
        paths = generate_artifacts(models.mlp(), frozen_params=["fc9.*", "pos_ids", "fc1.bias"],
                                   loss=LossType.CrossEntropyLoss, artifact_directory=tmp_path)
    state = CheckpointState.load_checkpoint(paths["checkpoint"])
    assert not state.parameters["fc1.bias"].requires_grad


def test_not_an_onnx_model(tmp_path):
    (tmp_path / "junk.onnx").write_bytes(b"this is not a protobuf at all \x00\xff")
    with pytest.raises(ValueError, match="junk.onnx is not"):
        generate_artifacts(tmp_path / "junk.onnx", loss=LossType.MSELoss, artifact_directory=tmp_path)
    with pytest.raises(FileNotFoundError, match="model file not found"):
        generate_artifacts(tmp_path / "missing.onnx", loss=LossType.MSELoss, artifact_directory=tmp_path)
    with pytest.raises(TypeError, match="model must be an onnx.ModelProto or a path"):
        generate_artifacts(42, loss=LossType.MSELoss, artifact_directory=tmp_path)


def _complex_cast(model: onnx.ModelProto) -> None:
    """TorchScript's export of Falcon's ALiBi writes a Cast to complex128, a type ONNX ops do not take."""
    graph = model.graph
    relu = next(n for n in graph.node if n.op_type == "Relu")
    relu.input[0], relu_input = "as_complex", relu.input[0]
    graph.node.insert(1, onnx.helper.make_node("Cast", [relu_input], ["complex"], to=onnx.TensorProto.COMPLEX128,
                                               name="to_complex"))
    graph.node.insert(2, onnx.helper.make_node("Cast", ["complex"], ["as_complex"], to=onnx.TensorProto.FLOAT))


def _int_bias(model: onnx.ModelProto) -> None:
    bias = next(i for i in model.graph.initializer if i.name == "fc1.bias")
    bias.CopyFrom(onnx.numpy_helper.from_array(np.ones(bias.dims, np.int64), "fc1.bias"))


def _softmax_axis(model: onnx.ModelProto) -> None:
    model.graph.node.append(onnx.helper.make_node("Softmax", [model.graph.output[0].name], ["probs"], axis=5,
                                                  name="bad_softmax"))
    probs = model.graph.output.add()
    probs.CopyFrom(model.graph.output[0])
    probs.name = "probs"


def _incompatible_add(model: onnx.ModelProto) -> None:
    """TorchScript's export of PatchTST adds a (4, 16) position table to patches laid out (batch, 2, 4, 16) for
    (batch, 4, 2, 16) (its unfold symbolic misplaces the patch axis): sizes no broadcast reconciles. Before, the
    gradient rule of the first node after it failed with "no type information for 'h2'"."""
    graph = model.graph
    relu = next(n for n in graph.node if n.op_type == "Relu")
    relu.input[0], h = "h2", relu.input[0]
    graph.initializer.append(onnx.numpy_helper.from_array(np.ones(17, np.float32), "table"))
    graph.node.insert(1, onnx.helper.make_node("Add", [h, "table"], ["h2"], name="add_table"))


@pytest.mark.parametrize("as_path", [False, True])
@pytest.mark.parametrize("damage, message", [
    (_incompatible_add, r"\(op_type:Add, node name: add_table\): \[ShapeInferenceError\] Incompatible dimensions"),
    (_complex_cast, r"\(op_type:Cast, node name: to_complex\): output has unsupported type tensor\(complex128\)"),
    (_int_bias, r"has inconsistent type tensor\(int64\)"),
    (_softmax_axis, r"\(op_type:Softmax, node name: bad_softmax\).*'axis' must be in"),
])
def test_a_model_the_onnx_checker_rejects_is_named_as_the_problem(as_path, damage, message, tmp_path):
    # the artifacts' check fails because the model's own does: the model's problem, not a pass's
    from onnxtrain.errors import InvalidModelError

    model = models.mlp()
    damage(model)
    source = model
    if as_path:
        onnx.save(model, tmp_path / "model.onnx")
        source = tmp_path / "model.onnx"
    with pytest.raises(InvalidModelError, match=r"not valid ONNX.*rejects it as given: .*" + message):
        generate_artifacts(source, loss=LossType.CrossEntropyLoss, optimizer=OptimType.AdamW,
                           artifact_directory=tmp_path / "art")
    assert not (tmp_path / "art").exists() or not any((tmp_path / "art").iterdir())


def test_unsupported_op_names_op_node_and_path(tmp_path, monkeypatch):
    from onnxtrain.autodiff import GRADIENT_RULES
    from onnxtrain.errors import UnsupportedOpError

    monkeypatch.delitem(GRADIENT_RULES, "Relu")  # stands for any op without a rule
    model = models.mlp()
    model.graph.node[1].name = "my_relu"
    with pytest.raises(UnsupportedOpError, match=r"'Relu'.*'my_relu'.*fc1\.weight -> Gemm\(h\) -> Relu"):
        generate_artifacts(model, loss=LossType.CrossEntropyLoss, artifact_directory=tmp_path)


def test_model_with_if_trains_the_branch_taken(tmp_path):
    """Parameters read only inside If branches get gradients from the branch that ran."""
    from onnx import TensorProto, helper

    def branch(name, weight):
        return helper.make_graph([helper.make_node("MatMul", ["input", weight], [f"{name}_out"])], name, [],
                                 [helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, None)])

    rng = np.random.default_rng(0)
    weights = {"w_then": rng.standard_normal((3, 2)).astype(np.float32),
               "w_else": rng.standard_normal((3, 2)).astype(np.float32)}
    graph = helper.make_graph(
        [helper.make_node("If", ["flag"], ["output"], then_branch=branch("then", "w_then"),
                          else_branch=branch("else", "w_else"))], "if_model",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3]),
         helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 2])],
        initializer=[onnx.numpy_helper.from_array(v, k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    generate_artifacts(model, loss=LossType.MSELoss, optimizer=OptimType.SGD, artifact_directory=tmp_path)
    for device in ("cpu", "reference"):
        state = CheckpointState.load_checkpoint(tmp_path / "checkpoint")
        module = Module(tmp_path / "training_model.onnx", state, device=device)
        x, t = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((4, 2)).astype(np.float32)
        module(x, np.array(True), t)
        expected = 2 * x.T @ (x @ weights["w_then"] - t) / t.size
        np.testing.assert_allclose(state.parameters["w_then"].grad, expected, rtol=1e-4, atol=1e-6)
        np.testing.assert_array_equal(state.parameters["w_else"].grad, 0)


def test_ort_format_files_load_in_a_stock_session(tmp_path):
    generate_artifacts(models.mlp(), loss=LossType.CrossEntropyLoss, optimizer=OptimType.AdamW,
                       artifact_directory=tmp_path, ort_format=True)
    for name in ARTIFACTS:
        ort_file = tmp_path / name.replace(".onnx", ".ort")
        assert ort_file.stat().st_size > 0
        session = ort.InferenceSession(str(ort_file), providers=["CPUExecutionProvider"])
        assert [i.name for i in session.get_inputs()] == [i.name for i in onnx.load(tmp_path / name).graph.input]


def _conv_relu_pool(seed=0):
    from onnx import TensorProto, numpy_helper

    rng = np.random.default_rng(seed)
    weights = {"conv.weight": rng.standard_normal((3, 1, 3, 3)).astype(np.float32),
               "conv.bias": rng.standard_normal(3).astype(np.float32) * 0.1,
               "fc.weight": rng.standard_normal((4, 27)).astype(np.float32) * 0.3}
    nodes = [onnx.helper.make_node("Conv", ["input", "conv.weight", "conv.bias"], ["c"], pads=[1, 1, 1, 1]),
             onnx.helper.make_node("Relu", ["c"], ["r"]),
             onnx.helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             onnx.helper.make_node("Flatten", ["p"], ["f"]),
             onnx.helper.make_node("Gemm", ["f", "fc.weight"], ["output"], transB=1)]
    graph = onnx.helper.make_graph(
        nodes, "crp", [onnx.helper.make_tensor_value_info("input", TensorProto.FLOAT, ["n", 1, 6, 6])],
        [onnx.helper.make_tensor_value_info("output", TensorProto.FLOAT, ["n", 4])],
        initializer=[numpy_helper.from_array(v, k) for k, v in weights.items()])
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])


def test_relu_then_maxpool_trains_as_maxpool_then_relu(tmp_path):
    """The training graph pools before the Relu (same values, same gradients, a quarter of the Relu work);
    asking for the Relu's output keeps the original order, and both give the same step."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 1, 6, 6)).astype(np.float32)
    x[0, 0, :3, :3] = -1.0                      # a window whose maximum is negative: no gradient either way
    y = rng.integers(0, 4, 5).astype(np.int64)
    grads, losses = {}, {}
    for swap, extra in ((True, None), (False, ["r"])):
        folder = tmp_path / str(swap)
        generate_artifacts(_conv_relu_pool(), loss=LossType.CrossEntropyLoss, optimizer=OptimType.SGD,
                           artifact_directory=folder, additional_output_names=extra)
        ops = [n.op_type for n in onnx.load(folder / "training_model.onnx").graph.node]
        pool = ops.index("MaxPool")
        assert (ops[pool + 1] == "Relu") is swap and ("Relu" in ops[:pool]) is not swap
        state = CheckpointState.load_checkpoint(folder / "checkpoint")
        module = Module(folder / "training_model.onnx", state)
        out = module(x, y)
        losses[swap] = float(out if swap else out[0])
        grads[swap] = {n: p.grad for n, p in state.parameters.items()}
    assert losses[True] == pytest.approx(losses[False], rel=1e-6)
    for name in grads[True]:
        np.testing.assert_allclose(grads[True][name], grads[False][name], rtol=1e-5, atol=1e-6, err_msg=name)


def _at_opset(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    model.opset_import[0].version = opset
    onnx.checker.check_model(model, full_check=True)
    return model


def test_loss_none_trains_a_model_whose_output_is_the_loss_and_optimizer_none_skips_a_stage(tmp_path, rng):
    import onnxtrain.onnxblock as onnxblock

    class WithLoss(onnxblock.ForwardBlock):
        def __init__(self):
            super().__init__()
            self.loss = onnxblock.loss.MSELoss()

        def build(self, output_name):
            return self.loss(output_name)

    block = WithLoss()
    with onnxblock.base(models.mlp()):
        block("output")
    paths = generate_artifacts(block.to_model_proto(), loss=None, optimizer=None, artifact_directory=tmp_path)
    assert "optimizer" not in paths and not (tmp_path / "optimizer_model.onnx").exists()
    x, t = rng.standard_normal((3, 8)).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32)
    module = Module(tmp_path / "training_model.onnx", CheckpointState.load_checkpoint(tmp_path / "checkpoint"))
    y = ort.InferenceSession(models.mlp().SerializeToString()).run(None, {"input": x})[0]
    np.testing.assert_allclose(module(x, t), np.mean((y - t) ** 2), rtol=1e-5)


def test_models_from_opset_13_keep_their_opset(tmp_path):
    generate_artifacts(_at_opset(models.mlp(), 14), loss=LossType.CrossEntropyLoss, optimizer=OptimType.AdamW,
                       artifact_directory=tmp_path)
    for file in ARTIFACTS:
        assert [(o.domain, o.version) for o in onnx.load(tmp_path / file).opset_import] == [("", 14)], file


def _embedding(opset: int) -> onnx.ModelProto:
    """Gather rows of a table: the gradient adds rows up (ScatterElements reduction="add", opset 16)."""
    table = np.arange(12, dtype=np.float32).reshape(6, 2)
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Gather", ["table", "ids"], ["output"])], "embedding",
        [onnx.helper.make_tensor_value_info("ids", onnx.TensorProto.INT64, ["n"])],
        [onnx.helper.make_tensor_value_info("output", onnx.TensorProto.FLOAT, ["n", 2])],
        initializer=[onnx.numpy_helper.from_array(table, "table")])
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)])


def test_a_model_is_converted_to_opset_17_only_when_its_gradient_needs_it(tmp_path, caplog):
    with caplog.at_level("WARNING", logger="onnxtrain.artifacts.generate"):
        generate_artifacts(_embedding(14), loss=LossType.MSELoss, artifact_directory=tmp_path)
    assert onnx.load(tmp_path / "training_model.onnx").opset_import[0].version == 17
    assert "converting the model to opset 17" in caplog.text and "opset 16" in caplog.text
    assert "convert the model" not in caplog.text   # the error's advice: done here already
    state = CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    Module(tmp_path / "training_model.onnx", state)(np.array([1, 1, 4]), np.zeros((3, 2), np.float32))
    grad = state.parameters["table"].grad
    np.testing.assert_allclose(grad[1], 2 * 2 * np.array([2.0, 3.0]) / 6)  # row 1 is gathered twice


def test_eval_dropout_keeps_its_training_mode_slot_empty(tmp_path):
    generate_artifacts(models.conv_bn(dropout=True), loss=LossType.CrossEntropyLoss, artifact_directory=tmp_path)
    (dropout,) = [n for n in onnx.load(tmp_path / "eval_model.onnx").graph.node if n.op_type == "Dropout"]
    assert len(dropout.input) == 3 and dropout.input[2] == "" and len(dropout.output) == 1


def test_each_artifact_gets_one_full_onnx_check(tmp_path, monkeypatch):
    """The full check (shape inference over the whole graph) is a large part of generating a big model: the
    training and eval graphs' passes share it with the final check, and every artifact gets it."""
    full = []
    real = onnx.checker.check_model

    structural = []

    def check_model(model, full_check=False, **kwargs):
        proto = model if isinstance(model, onnx.ModelProto) else onnx.load_from_string(model)
        (full if full_check else structural).append(proto.graph.name)
        return real(model, full_check=full_check, **kwargs)

    monkeypatch.setattr(onnx.checker, "check_model", check_model)
    generate_artifacts(models.conv_bn(), loss=LossType.CrossEntropyLoss, optimizer=OptimType.AdamW,
                       artifact_directory=tmp_path)
    assert full.count("training") == 1 and full.count("eval") == 1 and "optimizer" in full
    # nothing changed after the passes' full checks: no second, structural one
    assert "training" not in structural and "eval" not in structural


def test_a_failed_generation_leaves_the_earlier_artifacts_untouched(tmp_path, monkeypatch):
    generate_artifacts(models.mlp(), loss=LossType.MSELoss, optimizer=OptimType.AdamW, artifact_directory=tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def broken(*args, **kwargs):
        raise RuntimeError("optimizer graph failed")

    monkeypatch.setattr("onnxtrain.artifacts.generate.build_optimizer_model", broken)
    with pytest.raises(RuntimeError, match="optimizer graph failed"):
        generate_artifacts(models.conv_bn(), loss=LossType.CrossEntropyLoss, optimizer=OptimType.AdamW,
                           artifact_directory=tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


@pytest.mark.parametrize("enabled", [True, False])
def test_the_garbage_collector_is_left_as_it_was(enabled, tmp_path, monkeypatch):
    """generate_artifacts pauses the cyclic garbage collector while it builds the graphs, and restores it, also
    when the generation fails."""
    import gc

    seen = []

    def broken(*args, **kwargs):
        seen.append(gc.isenabled())
        raise RuntimeError("optimizer graph failed")

    (gc.enable if enabled else gc.disable)()
    try:
        generate_artifacts(models.mlp(), loss=LossType.MSELoss, optimizer=OptimType.AdamW, artifact_directory=tmp_path)
        assert gc.isenabled() == enabled
        monkeypatch.setattr("onnxtrain.artifacts.generate.build_optimizer_model", broken)
        with pytest.raises(RuntimeError, match="optimizer graph failed"):
            generate_artifacts(models.mlp(), loss=LossType.MSELoss, optimizer=OptimType.AdamW,
                               artifact_directory=tmp_path)
        assert seen == [False] and gc.isenabled() == enabled
    finally:
        gc.enable()


@pytest.mark.parametrize(("opset", "source_ir", "expected_ir"), [(17, onnx.IR_VERSION, 8), (18, 10, 8), (13, 7, 8),
                                                                 (19, onnx.IR_VERSION, 9), (21, 10, 10)])
def test_artifacts_declare_the_lowest_ir_version_their_opset_allows(tmp_path, opset, source_ir, expected_ir):
    if opset > onnx.defs.onnx_opset_version():
        pytest.skip(f"onnx {onnx.__version__} does not know opset {opset}")
    # onnx.helper writes its newest IR version (14 with onnx 1.23); onnxruntime 1.17 reads IR 9 at most, so
    # artifacts that kept it would not load in an onnxruntime that runs the source model's opset
    forward = models.mlp()
    forward.opset_import[0].version = opset
    forward.ir_version = source_ir
    generate_artifacts(forward, loss=LossType.MSELoss, optimizer=OptimType.AdamW, artifact_directory=tmp_path)
    for file in ARTIFACTS:
        proto = onnx.load(tmp_path / file)
        assert proto.ir_version == expected_ir, file
        onnx.checker.check_model(proto, full_check=True)


def test_an_optimizer_with_nothing_to_train_is_reported(tmp_path, caplog):
    """requires_grad=[] or trainable_ops=0 with an optimizer asked for: the artifacts are written (they still
    evaluate), and a warning names what selected no parameter."""
    from tests import models as tiny

    cases = {"none": {"requires_grad": []}, "zero_ops": {"trainable_ops": 0}, "last_op": {"trainable_ops": 1}}
    for folder, selection in cases.items():
        caplog.clear()
        generate_artifacts(tiny.conv_bn(), loss=LossType.CrossEntropyLoss, optimizer=OptimType.AdamW,
                           artifact_directory=tmp_path / folder, **selection)
        warned = [r.getMessage() for r in caplog.records if "no parameter trains" in r.getMessage()]
        if folder == "last_op":  # the Gemm's weight and bias train
            assert not warned
        else:
            assert len(warned) == 1 and ("requires_grad=[]" in warned[0] if folder == "none"
                                         else "trainable_ops=0" in warned[0]), warned
        assert (tmp_path / folder / "optimizer_model.onnx").exists()


def test_an_artifact_directory_that_is_a_file_is_named(tmp_path):
    taken = tmp_path / "artifacts"
    taken.write_text("a user's file")
    with pytest.raises(NotADirectoryError, match="artifact_directory .*artifacts' is a file, not a folder"):
        generate_artifacts(models.mlp(), loss=LossType.CrossEntropyLoss, artifact_directory=taken)
    assert taken.read_text() == "a user's file"


def test_a_loss_that_is_not_one_number_is_refused_at_generation(tmp_path):
    """loss=None takes the model's output as the loss: one of shape [batch, classes] used to generate and fail
    at the first step with onnxruntime's "Invalid rank for output"; a loss block without a reduction likewise."""
    with pytest.raises(ValueError, match=r"loss=None takes the model's output 'output' as the loss, but it has "
                                         r"shape \['batch', 4\], not one number"):
        generate_artifacts(models.mlp(), loss=None, optimizer=OptimType.SGD, artifact_directory=tmp_path)
    with pytest.raises(ValueError, match=r"the loss block MSELoss gives a loss of shape \['batch', 4\], not one "
                                         r"number"):
        generate_artifacts(models.mlp(), loss=blocks.MSELoss(reduction="none"), optimizer=OptimType.SGD,
                           artifact_directory=tmp_path)
    assert not any(tmp_path.iterdir())
    # one number kept in a [1, 1] tensor is a loss
    model = models.mlp()
    model.graph.node.append(onnx.helper.make_node("ReduceMean", [model.graph.output[0].name], ["mean"], keepdims=1))
    model.graph.output[0].CopyFrom(onnx.helper.make_tensor_value_info("mean", onnx.TensorProto.FLOAT, [1, 1]))
    generate_artifacts(model, loss=None, optimizer=OptimType.SGD, artifact_directory=tmp_path)
    state = CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    assert np.isfinite(Module(tmp_path / "training_model.onnx", state)(np.ones((3, 8), np.float32)))


@pytest.mark.parametrize(("loss", "recorded"), [
    (LossType.BCEWithLogitsLoss, "BCEWithLogitsLoss"),
    (blocks.CrossEntropyLoss(reduction="sum"), "CrossEntropyLoss"),
    (type("Scaled", (blocks.MSELoss,), {})(), ""),     # a subclass may compute another loss
])
def test_the_built_in_loss_is_recorded_for_tools(tmp_path, loss, recorded):
    """The command line picks its default metric by it (binary accuracy for BCE-with-logits)."""
    generate_artifacts(models.mlp(), loss=loss, artifact_directory=tmp_path)
    for kind in ("training", "eval"):
        meta = names.TrainingMeta.from_model(onnx.load(tmp_path / f"{kind}_model.onnx"))
        assert meta.loss_type == recorded
