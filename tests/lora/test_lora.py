"""LoRA on a small hand-built model: injection, plain ONNX, merge, PEFT files, training, federated spec.

The comparison with torch + PEFT on a transformers BERT is in test_peft_bert.py.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxtrain.api import CheckpointState, Module, Optimizer
from onnxtrain.artifacts import LoRA, LossType, OptimType, generate_artifacts
from onnxtrain.lora import LoRAMeta, lora_meta, save_peft_adapter

RNG = np.random.default_rng(0)
WEIGHTS = {"W1": RNG.normal(size=(6, 5)), "W2": RNG.normal(size=(4, 5)), "b2": RNG.normal(size=4),
           "W3": RNG.normal(size=(3, 4, 1, 1)), "b3": RNG.normal(size=3), "axes": np.array([2, 3])}


def _model(trans_a: int = 0) -> onnx.ModelProto:
    """x -> MatMul(W1) -> Gemm(W2^T, b2, alpha=0.5, transA) -> Relu -> 1x1 Conv(W3, b3) -> y (N x 3)."""
    x_shape = [5, 2] if trans_a else [2, 5]
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h1"], name="mm") if not trans_a else
        helper.make_node("Identity", ["x"], ["h1"], name="id"),
        helper.make_node("Gemm", ["h1", "W2", "b2"], ["h2"], name="gemm", alpha=0.5, transA=trans_a, transB=1),
        helper.make_node("Relu", ["h2"], ["h3"]),
        helper.make_node("Unsqueeze", ["h3", "axes"], ["h4"]),
        helper.make_node("Conv", ["h4", "W3", "b3"], ["h5"], name="conv"),
        helper.make_node("Flatten", ["h5"], ["y"]),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6] if not trans_a else x_shape)]
    inits = [numpy_helper.from_array(v.astype(np.float32) if v.dtype.kind == "f" else v, k)
             for k, v in WEIGHTS.items() if trans_a == 0 or k != "W1"]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
                              initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_merged_export_over_the_protobuf_limit_replaces_its_weights_file(tmp_path, monkeypatch):
    """Over 2 GB the merged model's weights go to PATH.data once; a second export replaces them (onnx.save_model
    appended a second copy, and the merge always wrote over the unmerged export's file)."""
    import os

    from onnxtrain.runtime import export

    model = _model()
    _, module, state = _generate(tmp_path, model, LoRA(rank=3, alpha=5, targets=["W*"]))
    _randomize_b(state)
    module.export_model_for_inferencing(tmp_path / "small.onnx", ["y"], merge_adapters=True)
    monkeypatch.setattr(export, "PROTO_LIMIT", (64 << 20) + 16)
    monkeypatch.setattr(export, "EXTERNAL_MIN_SIZE", 4)   # this model's weights are tiny
    big = tmp_path / "big.onnx"
    for _ in range(2):
        module.export_model_for_inferencing(big, ["y"], merge_adapters=True)
    outside = [i for i in onnx.load(str(big), load_external_data=False).graph.initializer if i.external_data]
    assert outside and os.path.getsize(str(big) + ".data") == sum(
        onnx.numpy_helper.to_array(i, base_dir=str(tmp_path)).nbytes for i in outside)
    x = RNG.normal(size=(2, 6)).astype(np.float32)
    np.testing.assert_array_equal(_run(str(big), x), _run(str(tmp_path / "small.onnx"), x))


def test_a_merged_export_copies_only_the_adapted_weights(tmp_path):
    """The merge works on the runtime's arrays before writing: a 16 MB frozen weight without an adapter costs the
    merged export no more than the plain one (it used to reload the written file and copy every weight: 23.5 GB
    peak for a 3.1 GB model)."""
    import tracemalloc

    big = np.random.default_rng(2).normal(size=(1024, 4096)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "Wbig"], ["h"]), helper.make_node("MatMul", ["h", "W2"], ["y"])]
    small = RNG.normal(size=(4096, 4)).astype(np.float32)
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 1024])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
                              initializer=[numpy_helper.from_array(big, "Wbig"), numpy_helper.from_array(small, "W2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    _, module, state = _generate(tmp_path, model, LoRA(rank=2, alpha=4, targets=["W2"]))
    _randomize_b(state)

    def peak(**kwargs) -> int:
        tracemalloc.start()
        module.export_model_for_inferencing(tmp_path / "out.onnx", ["y"], **kwargs)
        result = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return result

    plain, merged = peak(), peak(merge_adapters=True)
    assert merged < plain + (1 << 20), (plain, merged)   # the 64 KB W2 in float64 and its product, not Wbig
    assert merged < big.nbytes / 4   # and no copy of Wbig on the way to the file (runtime.export.write_model)
    assert [i.name for i in onnx.load(tmp_path / "out.onnx").graph.initializer] == ["Wbig", "W2"]

def _generate(tmp_path, model, lora, **kwargs) -> tuple[dict, Module, CheckpointState]:
    paths = generate_artifacts(model, loss=LossType.MSELoss, optimizer=OptimType.AdamW, artifact_directory=tmp_path,
                               additional_output_names=["y"], lora=lora, **kwargs)
    state = CheckpointState.load_checkpoint(paths["checkpoint"])
    return paths, Module(paths["training"], state, paths["eval"]), state


def _run(model: onnx.ModelProto | str, x: np.ndarray) -> np.ndarray:
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(["y"], {"x": x})[0]


def _randomize_b(state: CheckpointState) -> None:
    rng = np.random.default_rng(1)
    for name, p in state.parameters:
        if name.endswith("lora_B.weight"):
            state.parameters[name] = rng.normal(size=p.data.shape).astype(np.float32)


def test_adapters_are_plain_onnx_and_start_as_the_base_model(tmp_path):
    paths, module, state = _generate(tmp_path, _model(), LoRA(rank=2, alpha=4, targets=["W1", "gemm", "W3"]))
    assert [n for n, p in state.parameters if p.requires_grad] == [
        "W1.lora_A.weight", "W1.lora_B.weight", "W2.lora_A.weight", "W2.lora_B.weight", "W3.lora_A.weight",
        "W3.lora_B.weight"]
    shapes = {n: p.data.shape for n, p in state.parameters}
    assert shapes["W1.lora_A.weight"] == (2, 6) and shapes["W1.lora_B.weight"] == (5, 2)   # rank x in, out x rank
    assert shapes["W2.lora_A.weight"] == (2, 5) and shapes["W2.lora_B.weight"] == (4, 2)
    assert shapes["W3.lora_A.weight"] == (2, 4, 1, 1) and shapes["W3.lora_B.weight"] == (3, 2, 1, 1)
    a = state.parameters["W1.lora_A.weight"].data
    assert 0 < np.abs(a).max() <= 1 / np.sqrt(6) and not state.parameters["W1.lora_B.weight"].data.any()
    for kind in ("training", "eval", "optimizer"):
        proto = onnx.load(paths[kind])
        onnx.checker.check_model(proto, full_check=True)
        assert {n.domain for n in proto.graph.node} <= {""}
    meta = lora_meta(paths["eval"])
    assert (meta.rank, meta.alpha, meta.scale, meta.modules) == (2, 4.0, 2.0, ["W1", "W2", "W3"])
    x = RNG.normal(size=(2, 6)).astype(np.float32)
    module.eval()
    out = module(x, np.zeros((2, 3), np.float32))
    np.testing.assert_allclose(out[1], _run(_model(), x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("trans_a", [0, 1])
def test_merge_gives_the_unmerged_outputs(tmp_path, trans_a):
    model = _model(trans_a)
    targets = ["W2", "W3"] if trans_a else ["W*"]
    _, module, state = _generate(tmp_path, model, LoRA(rank=3, alpha=5, targets=targets))
    _randomize_b(state)
    module.export_model_for_inferencing(tmp_path / "unmerged.onnx", ["y"])
    module.export_model_for_inferencing(tmp_path / "merged.onnx", ["y"], merge_adapters=True)
    x = RNG.normal(size=(5, 2) if trans_a else (2, 6)).astype(np.float32)
    unmerged, merged, base = _run(str(tmp_path / "unmerged.onnx"), x), _run(str(tmp_path / "merged.onnx"), x), \
        _run(model, x)
    assert np.abs(unmerged - base).max() > 1e-2  # the adapters do something
    np.testing.assert_allclose(merged, unmerged, rtol=1e-5, atol=1e-5)
    merged_proto, unmerged_proto = onnx.load(tmp_path / "merged.onnx"), onnx.load(tmp_path / "unmerged.onnx")
    onnx.checker.check_model(merged_proto, full_check=True)
    assert [n.op_type for n in merged_proto.graph.node] == [n.op_type for n in model.graph.node]
    assert not [i.name for i in merged_proto.graph.initializer if "lora" in i.name]
    assert sum("/lora/" in n.name for n in unmerged_proto.graph.node) > 0


def test_only_adapters_and_head_train_and_the_loss_falls(tmp_path):
    _, module, state = _generate(tmp_path, _model(), LoRA(rank=2, alpha=4, targets=["W1", "W2"]),
                                 requires_grad=["b3"])
    assert sorted(n for n, p in state.parameters if p.requires_grad) == [
        "W1.lora_A.weight", "W1.lora_B.weight", "W2.lora_A.weight", "W2.lora_B.weight", "b3"]
    frozen_before = {n: p.data.copy() for n, p in state.parameters if not p.requires_grad}
    optimizer = Optimizer(str(tmp_path / "optimizer_model.onnx"), module)
    optimizer.set_learning_rate(0.02)
    rng = np.random.default_rng(2)
    x = rng.normal(size=(2, 6)).astype(np.float32)
    target = _run(_model(), x) + rng.normal(size=(2, 3)).astype(np.float32)
    module.train()
    losses = []
    for _ in range(60):
        losses.append(float(module(x, target)[0]))
        optimizer.step()
        module.lazy_reset_grad()
    assert losses[-1] < 0.2 * losses[0], losses[::10]
    for n, v in frozen_before.items():
        np.testing.assert_array_equal(state.parameters[n].data, v)


def test_dropout_trains_and_is_off_in_eval(tmp_path):
    paths, module, state = _generate(tmp_path, _model(), LoRA(rank=2, alpha=4, targets=["W1"], dropout=0.5))
    assert "Dropout" in {n.op_type for n in onnx.load(paths["training"]).graph.node}
    _randomize_b(state)
    x = RNG.normal(size=(2, 6)).astype(np.float32)
    module.train()  # the adapter's input dropout is on: runs differ (no optimizer attached, nothing changes)
    runs = [module(x, np.zeros((2, 3), np.float32))[1] for _ in range(3)]
    assert max(np.abs(r - runs[0]).max() for r in runs[1:]) > 1e-4  # equal masks thrice: p = 2^-24
    module.eval()
    first = module(x, np.zeros((2, 3), np.float32))[1]
    np.testing.assert_array_equal(first, module(x, np.zeros((2, 3), np.float32))[1])
    module.export_model_for_inferencing(tmp_path / "merged.onnx", ["y"], merge_adapters=True)
    np.testing.assert_allclose(_run(str(tmp_path / "merged.onnx"), x), first, rtol=1e-5, atol=1e-5)


def test_peft_files_round_trip_without_torch(tmp_path):
    paths, module, state = _generate(tmp_path / "a", _model(), LoRA(rank=2, alpha=4, targets=["W1", "W3"]),
                                     requires_grad=["b3"])
    _randomize_b(state)
    written = save_peft_adapter(state, paths["training"], tmp_path / "peft")
    config = json.load(open(written["config"]))
    assert (config["r"], config["lora_alpha"], config["target_modules"], config["modules_to_save"]) == \
        (2, 4.0, ["W1", "W3"], None)  # b3 has no torch module name: not saved, with a warning
    lora = LoRA.from_peft(tmp_path / "peft")
    assert (lora.rank, lora.alpha, list(lora.targets)) == (2, 4.0, ["W1", "W3"])
    _, again, _ = _generate(tmp_path / "b", _model(), lora)
    x = RNG.normal(size=(2, 6)).astype(np.float32)
    module.export_model_for_inferencing(tmp_path / "a.onnx", ["y"])
    again.export_model_for_inferencing(tmp_path / "b.onnx", ["y"])
    np.testing.assert_allclose(_run(str(tmp_path / "b.onnx"), x), _run(str(tmp_path / "a.onnx"), x), rtol=1e-6)


def test_peft_files_hold_every_module_peft_wraps_and_read_fan_in_fan_out(tmp_path):
    """PEFT wraps every module whose path ends with a modules_to_save entry: a trained 'classifier' takes
    DistilBERT's 'pre_classifier' too, whose tensors must then be in the file (from_pretrained raised KeyError
    without them); they go in unchanged. PEFT's own GPT-2 adapters say fan_in_fan_out, which reading accepts."""
    from safetensors.numpy import load_file

    from onnxtrain.lora.peft import PEFT_PREFIX, write_peft_adapter

    meta = LoRAMeta.from_model(onnx.load(_generate(tmp_path / "a", _model(), LoRA(rank=2, targets=["W1"]))[0]
                                         ["training"]))
    a, b = np.ones((2, 6), np.float32), np.zeros((5, 2), np.float32)
    head = {"classifier.weight": np.full((3, 4), 2.0, np.float32)}
    base = {**head, "pre_classifier.weight": np.full((4, 4), 3.0, np.float32),
            "pre_classifier.bias": np.zeros(4, np.float32), "encoder.weight": np.ones((4, 4), np.float32)}
    written = write_peft_adapter(meta, {"W1.lora_A.weight": a, "W1.lora_B.weight": b}, tmp_path / "peft",
                                 extra=head, base=base)
    tensors = load_file(written["weights"])
    assert json.load(open(written["config"]))["modules_to_save"] == ["classifier"]
    assert {k.removeprefix(PEFT_PREFIX) for k in tensors} == {
        "W1.lora_A.weight", "W1.lora_B.weight", "classifier.weight", "pre_classifier.weight", "pre_classifier.bias"}
    np.testing.assert_array_equal(tensors[PEFT_PREFIX + "pre_classifier.weight"], base["pre_classifier.weight"])
    config = json.load(open(written["config"]))
    config["fan_in_fan_out"] = True
    json.dump(config, open(written["config"], "w"))
    assert LoRA.from_peft(tmp_path / "peft").rank == 2


def test_federated_exchange_carries_only_the_adapters(tmp_path):
    from onnxtrain.federated.spec import ParamSpec

    paths, _, state = _generate(tmp_path, _model(), LoRA(rank=2, alpha=4, targets=["W1", "W2"]))
    spec = ParamSpec.from_state(state)
    assert set(spec.names) == {"W1.lora_A.weight", "W1.lora_B.weight", "W2.lora_A.weight", "W2.lora_B.weight"}
    assert sum(v.nbytes for v in spec.values(state).values()) == 4 * (2 * 6 + 5 * 2 + 2 * 5 + 4 * 2)


def test_mistakes_are_explained(tmp_path):
    with pytest.raises(ValueError, match="'nothing' matches no MatMul / Gemm / 1x1 Conv weight"):
        _generate(tmp_path, _model(), LoRA(targets=["nothing"]))
    with pytest.raises(ValueError, match="carries a LoRA adapter and stays frozen"):
        _generate(tmp_path, _model(), LoRA(targets=["W1"]), requires_grad=["W*"])
    with pytest.raises(ValueError, match=r"'W' matches no .* regular expression .* help: targets=\['W'\]"):
        _generate(tmp_path, _model(), LoRA(targets="W"))   # a string is PEFT's regular expression, as a whole
    with pytest.raises(ValueError, match="no LoRA adapters"):
        paths = generate_artifacts(_model(), loss=LossType.MSELoss, artifact_directory=tmp_path / "plain")
        lora_meta(paths["eval"])
    assert LoRAMeta.from_model(_model()) is None


@pytest.mark.parametrize("targets", [["mm1"], ["W"]])
def test_merge_of_a_weight_read_by_two_nodes(tmp_path, targets):
    """["mm1"]: one reader adapted, the other keeps W (a merged copy for mm1); ["W"]: both readers carry the
    same adapter (one module), W is replaced in place."""
    w = numpy_helper.from_array(RNG.normal(size=(6, 6)).astype(np.float32), "W")
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm1"),
             helper.make_node("MatMul", ["h", "W"], ["y"], name="mm2")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 6])], initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    _, module, state = _generate(tmp_path, model, LoRA(rank=2, alpha=2, targets=targets))
    assert [n for n, p in state.parameters if p.requires_grad] == ["W.lora_A.weight", "W.lora_B.weight"]
    _randomize_b(state)
    module.export_model_for_inferencing(tmp_path / "unmerged.onnx", ["y"])
    module.export_model_for_inferencing(tmp_path / "merged.onnx", ["y"], merge_adapters=True)
    x = RNG.normal(size=(2, 6)).astype(np.float32)
    np.testing.assert_allclose(_run(str(tmp_path / "merged.onnx"), x), _run(str(tmp_path / "unmerged.onnx"), x),
                               rtol=1e-5, atol=1e-5)
    merged = onnx.load(tmp_path / "merged.onnx")
    assert len(merged.graph.initializer) == (2 if targets == ["mm1"] else 1)
    assert [n.input[1] for n in merged.graph.node] == (["W/merged/W", "W"] if targets == ["mm1"] else ["W", "W"])


def test_command_line_refuses_adapter_exports_without_adapters(tmp_path):
    from tests.cli.conftest import assert_one_line_error, run_cli

    generate_artifacts(_model(), loss=LossType.MSELoss, artifact_directory=tmp_path)
    for extra in (["--adapter", "-o", tmp_path / "adapter"], ["--merge-adapters", "-o", tmp_path / "m.onnx"]):
        assert_one_line_error(run_cli("export", tmp_path, *extra), "the model has no LoRA adapters")
    assert not (tmp_path / "m.onnx").exists()


def test_batchnorm_buffers_still_update_beside_adapters(tmp_path):
    from tests.models import conv_bn

    paths = generate_artifacts(conv_bn(), loss=LossType.MSELoss, optimizer=OptimType.AdamW, artifact_directory=tmp_path,
                               lora=LoRA(rank=2, alpha=2, targets=["fc.weight"]))
    state = CheckpointState.load_checkpoint(paths["checkpoint"])
    module = Module(paths["training"], state, paths["eval"])
    assert [n for n, p in state.parameters if p.requires_grad] == ["fc.lora_A.weight", "fc.lora_B.weight"]
    assert sorted(state.buffers) == ["bn.running_mean", "bn.running_var"]
    assert "conv.weight" in dict(state.parameters.items())  # frozen, in the checkpoint (freeze_base)
    before = state.buffers["bn.running_mean"].copy()
    optimizer = Optimizer(paths["optimizer"], module)
    module.train()
    x = RNG.normal(size=(4, 2, 6, 6)).astype(np.float32)
    module(x, np.zeros((4, 3), np.float32))
    optimizer.step()
    assert not np.allclose(state.buffers["bn.running_mean"], before)


@pytest.mark.parametrize("shared", [False, True])
def test_a_weight_read_through_a_transpose_gets_an_adapter_and_merges(tmp_path, shared):
    """``MatMul(x, Transpose(W))``, W stored (out, in) as torch's Linear: how the TorchScript exporter writes a
    Linear on a 3-D input, and the default dynamo export once its parameters are restored (torch_names.py).
    ``shared``: another node reads W too, so the merge writes a copy and that node keeps the base weight."""
    w = RNG.normal(size=(5, 6)).astype(np.float32)
    nodes = [helper.make_node("Transpose", ["enc.weight"], ["wt"], perm=[1, 0]),
             helper.make_node("MatMul", ["x", "wt"], ["h" if shared else "y"], name="/enc/MatMul")]
    if shared:   # y = x W^T + sum(W): a merge in place would change the sum
        nodes += [helper.make_node("ReduceSum", ["enc.weight"], ["s"], keepdims=0),
                  helper.make_node("Add", ["h", "s"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 5])],
                              initializer=[numpy_helper.from_array(w, "enc.weight")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    _, module, state = _generate(tmp_path, model, LoRA(rank=2, alpha=2, targets=["enc"]))
    shapes = {n: p.data.shape for n, p in state.parameters if p.requires_grad}
    assert shapes == {"enc.lora_A.weight": (2, 6), "enc.lora_B.weight": (5, 2)}
    _randomize_b(state)
    module.export_model_for_inferencing(tmp_path / "unmerged.onnx", ["y"])
    module.export_model_for_inferencing(tmp_path / "merged.onnx", ["y"], merge_adapters=True)
    x = RNG.normal(size=(2, 3, 6)).astype(np.float32)
    unmerged, merged = _run(str(tmp_path / "unmerged.onnx"), x), _run(str(tmp_path / "merged.onnx"), x)
    assert np.abs(unmerged - _run(model, x)).max() > 1e-2
    np.testing.assert_allclose(merged, unmerged, rtol=1e-5, atol=1e-5)
    proto = onnx.load(tmp_path / "merged.onnx")
    assert not [n for n in proto.graph.node if "lora" in n.name]
    assert len(proto.graph.initializer) == 1 + shared   # the merged weight (and the base one the sum reads)
