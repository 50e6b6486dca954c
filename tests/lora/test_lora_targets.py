"""LoRA targets as PEFT users write them, module paths of torch's exports, and the PEFT files' checks.

Hand-built models named as torch's TorchScript exporter names them (no torch needed); the same cases on real
transformers exports are in test_peft_models.py.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxtrain.artifacts import LoRA, LossType, generate_artifacts
from onnxtrain.errors import LoRAError
from onnxtrain.lora import lora_meta, write_peft_adapter
from onnxtrain.lora.peft import fan_in_fan_out

RNG = np.random.default_rng(0)


def _opt_like():
    """OPT's TorchScript export: node names leave out the ``model`` module (``/decoder/layers.0/...``) while the
    parameters keep it (``model.decoder.layers.0.fc1.weight``); a Linear on a 3-D input is a MatMul with a folded
    ``onnx::MatMul_N`` weight; the head writes the output through a Reshape."""
    weights = {"model.decoder.embed_tokens.weight": RNG.normal(size=(10, 4)),
               "onnx::MatMul_1": RNG.normal(size=(4, 4)),
               "model.decoder.layers.0.fc1.weight": RNG.normal(size=(4, 4)),
               "model.decoder.layers.0.fc1.bias": RNG.normal(size=4),
               "model.decoder.final_layer_norm.weight": np.ones(4), "model.decoder.final_layer_norm.bias": np.zeros(4),
               "onnx::MatMul_2": RNG.normal(size=(4, 5))}
    nodes = [
        helper.make_node("Gather", ["model.decoder.embed_tokens.weight", "ids"], ["e"],
                         name="/decoder/embed_tokens/Gather"),
        helper.make_node("MatMul", ["e", "onnx::MatMul_1"], ["q"], name="/decoder/layers.0/self_attn/q_proj/MatMul"),
        helper.make_node("Gemm", ["q", "model.decoder.layers.0.fc1.weight", "model.decoder.layers.0.fc1.bias"],
                         ["h"], name="/decoder/layers.0/fc1/Gemm", transB=1),
        helper.make_node("LayerNormalization", ["h", "model.decoder.final_layer_norm.weight",
                                                "model.decoder.final_layer_norm.bias"], ["n"],
                         name="/decoder/final_layer_norm/LayerNormalization", axis=-1),
        helper.make_node("MatMul", ["n", "onnx::MatMul_2"], ["logits_2d"], name="/lm_head/MatMul"),
        helper.make_node("Identity", ["logits_2d"], ["logits"], name="/Identity"),
    ]
    graph = helper.make_graph(nodes, "opt", [helper.make_tensor_value_info("ids", TensorProto.INT64, [3])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [3, 5])],
                              initializer=[numpy_helper.from_array(v.astype(np.float32), k)
                                           for k, v in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _modules(tmp_path, lora, model=None) -> list[str]:
    paths = generate_artifacts(model or _opt_like(), loss=LossType.MSELoss, artifact_directory=tmp_path, lora=lora)
    return lora_meta(paths["training"]).modules


def test_module_paths_get_the_module_torch_left_out_of_the_node_names(tmp_path):
    """OPT's q_proj was 'decoder.layers.0.self_attn.q_proj': PEFT's adapters (model.decoder...) matched nothing,
    and ours would not load into PEFT."""
    assert _modules(tmp_path, LoRA(rank=2, targets=["q_proj", "fc1", "lm_head"])) == [
        "model.decoder.layers.0.self_attn.q_proj", "model.decoder.layers.0.fc1", "lm_head"]


@pytest.mark.parametrize(("targets", "expected"), [
    ("all-linear", ["model.decoder.layers.0.self_attn.q_proj", "model.decoder.layers.0.fc1"]),   # not the head
    (["ALL-LINEAR"], ["model.decoder.layers.0.self_attn.q_proj", "model.decoder.layers.0.fc1"]),  # --lora-targets
    (r"model\.decoder\.layers\.\d+\.(self_attn\.q_proj|fc1)", ["model.decoder.layers.0.self_attn.q_proj",
                                                              "model.decoder.layers.0.fc1"]),
    (r".*_proj", ["model.decoder.layers.0.self_attn.q_proj"]),
])
def test_a_string_target_is_peft_s_regular_expression_or_all_linear(tmp_path, targets, expected):
    paths = generate_artifacts(_opt_like(), loss=LossType.MSELoss, artifact_directory=tmp_path,
                               lora=LoRA(rank=2, targets=targets))
    meta = lora_meta(paths["training"])
    assert meta.modules == expected
    assert meta.targets == ([targets] if isinstance(targets, str) else ["all-linear"])  # not a list of characters


def test_targets_that_name_no_linear_layer_say_what_they_name(tmp_path):
    with pytest.raises(LoRAError, match=r"it names 'model.decoder.embed_tokens.weight', a Gather's input 0 in node "
                                        r"'/decoder/embed_tokens/Gather'; LoRA adapts linear layers only"):
        _modules(tmp_path, LoRA(targets=["embed_tokens"]))
    with pytest.raises(LoRAError, match="it names 'model.decoder.final_layer_norm.weight', a LayerNormalization's"):
        _modules(tmp_path, LoRA(targets=["final_layer_norm"]))
    with pytest.raises(LoRAError, match=r"'nothing' matches no .* targets match weight names, module paths"):
        _modules(tmp_path, LoRA(targets=["nothing"]))
    with pytest.raises(LoRAError, match=r"help: a regular expression goes as one string, targets='\.\*_proj'"):
        _modules(tmp_path, LoRA(targets=[".*_proj"]))
    with pytest.raises(LoRAError, match=r"a single string is a regular expression .* help: targets=\['q_proj'\] "
                                        r"matches module paths ending in .q_proj"):
        _modules(tmp_path, LoRA(targets="q_proj"))
    with pytest.raises(ValueError, match=r"LoRA targets '\(q': a single string is a regular expression"):
        LoRA(targets="(q")
    for alpha in ("8", float("nan"), None):
        with pytest.raises(ValueError, match="LoRA alpha must be a finite number"):
            LoRA(alpha=alpha)


def _conv1d_like():
    """GPT-2's Conv1D: a Gemm reading its (in, out) weight under the torch name (transB=0)."""
    w = numpy_helper.from_array(RNG.normal(size=(4, 6)).astype(np.float32), "h.0.attn.c_attn.weight")
    graph = helper.make_graph([helper.make_node("Gemm", ["x", w.name], ["y"], name="/h.0/attn/c_attn/Gemm")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 6])], initializer=[w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_the_adapter_config_says_fan_in_fan_out_for_conv1d_weights(tmp_path):
    """PEFT sets fan_in_fan_out for GPT-2's Conv1D; our file said False (PEFT then warned and corrected it)."""
    def written(model, targets, folder):
        paths = generate_artifacts(model, loss=LossType.MSELoss, artifact_directory=tmp_path / folder,
                                   lora=LoRA(rank=2, targets=targets))
        meta = lora_meta(paths["training"])
        values = {n: np.zeros(1) for a in meta.adapters for n in (a.A, a.B)}
        config = json.load(open(write_peft_adapter(meta, values, tmp_path / folder / "peft")["config"]))
        return meta, config["fan_in_fan_out"]

    meta, flag = written(_conv1d_like(), ["c_attn"], "gpt2")
    assert flag and fan_in_fan_out(meta) and meta.modules == ["h.0.attn.c_attn"]
    meta, flag = written(_opt_like(), "all-linear", "opt")   # a folded MatMul weight and a Gemm with transB=1
    assert not flag and len(meta.adapters) == 2
    with pytest.raises(LoRAError, match="task_type 'causal' is not one of PEFT's: SEQ_CLS, "):
        write_peft_adapter(meta, {}, tmp_path / "bad", task_type="causal")
    assert not (tmp_path / "bad").exists()


def _peft_folder(tmp_path, r=2, a_shape=(2, 4), name="model.decoder.layers.0.self_attn.q_proj") -> str:
    from safetensors.numpy import save_file

    folder = tmp_path / "peft"
    folder.mkdir(parents=True, exist_ok=True)
    json.dump({"peft_type": "LORA", "r": r, "lora_alpha": 4, "target_modules": ["q_proj"]},
              open(folder / "adapter_config.json", "w"))
    save_file({f"base_model.model.{name}.lora_A.weight": RNG.normal(size=a_shape).astype(np.float32),
               f"base_model.model.{name}.lora_B.weight": RNG.normal(size=(4, a_shape[0])).astype(np.float32)},
              str(folder / "adapter_model.safetensors"))
    return str(folder)


def test_an_adapter_of_another_rank_or_model_is_refused(tmp_path):
    ok = _peft_folder(tmp_path / "ok")
    assert _modules(tmp_path / "a", LoRA.from_peft(ok)) == ["model.decoder.layers.0.self_attn.q_proj"]
    with pytest.raises(LoRAError, match=r"adapter_config.json says r=3, but .*lora_A.weight' in "
                                        r"adapter_model.safetensors has rank 2"):
        LoRA.from_peft(_peft_folder(tmp_path / "r", r=3))
    # A as (in, rank) instead of (rank, in), the same size: it was silently reshaped into the adapter
    name = "model.decoder.layers.0.self_attn.q_proj"
    initial = {f"{name}.lora_A.weight": np.ones((4, 2)), f"{name}.lora_B.weight": np.ones((4, 2))}
    with pytest.raises(LoRAError, match=r"has shape \(4, 2\), the model needs \(2, 4\) \(rank 2\)"):
        _modules(tmp_path / "b", LoRA(rank=2, targets=["q_proj"], initial=initial))
    with pytest.raises(LoRAError, match=r"has shape \(2, 6\), the model needs \(2, 4\)"):   # another model's width
        _modules(tmp_path / "c", LoRA.from_peft(_peft_folder(tmp_path / "w", a_shape=(2, 6))))
    with pytest.raises(LoRAError, match=r"LoRA target 'model.layers.0.q' matches no MatMul"):
        _modules(tmp_path / "d", LoRA.from_peft(_peft_folder(tmp_path / "m", name="model.layers.0.q")))


def test_folders_that_are_not_peft_adapters_are_named(tmp_path):
    with pytest.raises(LoRAError, match="nope: not a folder"):
        LoRA.from_peft(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(LoRAError, match="empty: no adapter_config.json: not a PEFT adapter folder"):
        LoRA.from_peft(tmp_path / "empty")
    named = _peft_folder(tmp_path / "outer" / "mine")   # save_pretrained of an adapter named "mine"... /peft
    with pytest.raises(LoRAError, match=r"its subfolders \['peft'\] hold adapters"):
        LoRA.from_peft(tmp_path / "outer" / "mine")
    (tmp_path / "outer" / "mine" / "peft" / "adapter_model.safetensors").rename(
        tmp_path / "outer" / "mine" / "peft" / "adapter_model.bin")
    with pytest.raises(LoRAError, match=r"no adapter_model.safetensors \(it holds adapter_model.bin.*"
                                        r"safe_serialization=True"):
        LoRA.from_peft(named)
    json.dump({"peft_type": "LORA"}, open(tmp_path / "empty" / "adapter_config.json", "w"))
    with pytest.raises(LoRAError, match="not a LoRA adapter config"):
        LoRA.from_peft(tmp_path / "empty")


def test_modules_to_save_train_and_go_back_into_the_adapter_file(tmp_path):
    """A PEFT adapter's modules_to_save became the model's values but stayed frozen, so the adapter saved after
    training left them out and PEFT loaded the base model's head instead."""
    from safetensors.numpy import load_file, save_file

    from onnxtrain.api import CheckpointState
    from onnxtrain.lora import save_peft_adapter

    folder = _peft_folder(tmp_path)
    head = {"model.decoder.layers.0.fc1.weight": np.full((4, 4), 0.5, np.float32),
            "model.decoder.layers.0.fc1.bias": np.full(4, 0.25, np.float32)}
    save_file({**load_file(f"{folder}/adapter_model.safetensors"),
               **{f"base_model.model.{k.replace('fc1.', 'fc1.modules_to_save.default.')}": v for k, v in head.items()}},
              f"{folder}/adapter_model.safetensors")
    lora = LoRA.from_peft(folder)
    assert lora.modules_to_save == ["model.decoder.layers.0.fc1"]
    paths = generate_artifacts(_opt_like(), loss=LossType.MSELoss, artifact_directory=tmp_path / "art", lora=lora)
    state = CheckpointState.load_checkpoint(paths["checkpoint"])
    assert sorted(n for n, p in state.parameters if p.requires_grad and "lora" not in n) == sorted(head)
    np.testing.assert_array_equal(state.parameters["model.decoder.layers.0.fc1.weight"].data, head[
        "model.decoder.layers.0.fc1.weight"])
    written = save_peft_adapter(state, paths["training"], tmp_path / "ours")
    assert json.load(open(written["config"]))["modules_to_save"] == ["model.decoder.layers.0.fc1"]
    assert {f"base_model.model.{k}" for k in head} <= set(load_file(written["weights"]))
    # frozen_params keeps one frozen; LoRA(modules_to_save=None) all of them
    paths = generate_artifacts(_opt_like(), loss=LossType.MSELoss, artifact_directory=tmp_path / "f", lora=lora,
                               frozen_params=["*.bias"])
    state = CheckpointState.load_checkpoint(paths["checkpoint"])
    assert [n for n, p in state.parameters if p.requires_grad and "lora" not in n] == [
        "model.decoder.layers.0.fc1.weight"]
    paths = generate_artifacts(_opt_like(), loss=LossType.MSELoss, artifact_directory=tmp_path / "n",
                               lora=LoRA.from_peft(folder, modules_to_save=None))
    assert not [n for n, p in CheckpointState.load_checkpoint(paths["checkpoint"]).parameters
                if p.requires_grad and "lora" not in n]
    with pytest.raises(LoRAError, match="modules_to_save 'classifier' names no float parameter of the model"):
        _modules(tmp_path / "n", LoRA(targets=["q_proj"], modules_to_save=["classifier"]))
    with pytest.raises(LoRAError, match="modules_to_save 'fc1' names 'model.decoder.layers.0.fc1.weight', which "
                                        "carries a LoRA adapter"):
        _modules(tmp_path / "t", LoRA(targets=["fc1"], modules_to_save="fc1"))


def test_saved_sibling_modules_are_written_as_their_parent():
    """RoBERTa's classifier.dense and classifier.out_proj: PEFT with task_type=SEQ_CLS wraps `classifier` too,
    and a file listing both `classifier` and `classifier.dense` raised KeyError in PeftModel.from_pretrained."""
    from onnxtrain.lora.peft import _whole_modules

    trained = {"classifier.dense.weight", "classifier.dense.bias", "classifier.out_proj.weight"}
    every = {**dict.fromkeys(trained), "roberta.pooler.dense.weight": None, "onnx::MatMul_3": None}
    assert _whole_modules(["classifier.dense", "classifier.out_proj"], trained, every, []) == ["classifier"]
    # not over a module with frozen parameters, an adapted one, or one trained module alone
    assert _whole_modules(["classifier.dense"], trained, {**every, "classifier.norm.weight": None}, []) == [
        "classifier.dense"]
    assert _whole_modules(["classifier.dense", "classifier.out_proj"], trained, every, ["classifier.q"]) == [
        "classifier.dense", "classifier.out_proj"]
    assert _whole_modules(["head.dense"], {"head.dense.weight"}, {"head.dense.weight": None}, []) == ["head.dense"]


def _tied_head():
    """A language model's head tied to its embedding, as torch's exporters leave it once onnxtrain re-ties the
    folded copy: ``/lm_head/MatMul`` reads ``Transpose(model.embed_tokens.weight)``."""
    embed = numpy_helper.from_array(RNG.normal(size=(10, 4)).astype(np.float32), "model.embed_tokens.weight")
    nodes = [helper.make_node("Gather", [embed.name, "ids"], ["e"], name="/model/embed_tokens/Gather"),
             helper.make_node("Transpose", [embed.name], ["t"], perm=[1, 0], name="tied"),
             helper.make_node("MatMul", ["e", "t"], ["logits"], name="/lm_head/MatMul")]
    graph = helper.make_graph(nodes, "tied", [helper.make_tensor_value_info("ids", TensorProto.INT64, [3])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [3, 10])],
                              initializer=[embed])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_head_tied_to_its_embedding_is_the_head_s_module(tmp_path):
    """targets=["lm_head"] matched nothing on GPT-2, OPT, T5 (the module came from the weight's name,
    transformer.wte), and PEFT's adapter of it (with lm_head.base_layer.weight beside, as PEFT saves a head)
    was refused."""
    from safetensors.numpy import save_file

    assert _modules(tmp_path / "a", LoRA(rank=2, targets=["lm_head"]), _tied_head()) == ["lm_head"]
    folder = tmp_path / "peft"
    folder.mkdir()
    json.dump({"peft_type": "LORA", "r": 2, "lora_alpha": 4}, open(folder / "adapter_config.json", "w"))
    save_file({"base_model.model.lm_head.lora_A.weight": np.ones((2, 4), np.float32),
               "base_model.model.lm_head.lora_B.weight": np.ones((10, 2), np.float32),
               "base_model.model.lm_head.base_layer.weight": np.ones((10, 4), np.float32)},
              str(folder / "adapter_model.safetensors"))
    lora = LoRA.from_peft(folder)
    assert lora.base_values is None and lora.modules_to_save is None
    assert _modules(tmp_path / "b", lora, _tied_head()) == ["lm_head"]
