"""LoRA against Hugging Face PEFT on small random transformers OPT and GPT-2, exported by torch (TorchScript).

OPT's node names leave out its ``model`` module and GPT-2's Conv1D stores its weights (in, out): PEFT's own
adapter starts the artifacts with PEFT's outputs, ours loads back into PEFT (without its fan_in_fan_out
correction) with the same outputs, and ``"all-linear"`` adapts the modules PEFT's does. Nothing is downloaded.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import onnxruntime as ort
import pytest

from tests.zoo.vision import import_torchvision

torch = pytest.importorskip("torch")
import_torchvision()
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from onnxtrain.api import CheckpointState, Module  # noqa: E402
from onnxtrain.artifacts import LoRA, LossType, generate_artifacts  # noqa: E402
from onnxtrain.lora import lora_meta, save_peft_adapter  # noqa: E402

MODELS = {  # config, the targets PEFT users write
    "opt": (lambda: transformers.OPTForCausalLM(transformers.OPTConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=1, ffn_dim=32, num_attention_heads=2,
        max_position_embeddings=16, word_embed_proj_dim=16, dropout=0.0)), ["q_proj", "v_proj"]),
    "gpt2": (lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=50, n_embd=16, n_layer=1, n_head=2, n_positions=16, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0)), ["c_attn"]),
}


def _model(kind: str):
    torch.manual_seed(0)
    return MODELS[kind][0]().eval()


@pytest.fixture(scope="module", params=sorted(MODELS))
def exported(request, tmp_path_factory):
    """(kind, the ONNX file, a batch of token ids)."""
    kind = request.param
    model, path = _model(kind), tmp_path_factory.mktemp(kind) / "model.onnx"
    ids = torch.randint(0, 50, (2, 6), generator=torch.Generator().manual_seed(1))
    forward = model.forward
    model.forward = lambda input_ids: forward(input_ids=input_ids).logits
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (ids,), str(path), input_names=["input_ids"], output_names=["logits"],
                          dynamo=False, opset_version=17, dynamic_axes={"input_ids": {0: "batch", 1: "seq"}})
    return kind, path, ids.numpy()


def _logits(model, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(input_ids=torch.from_numpy(ids)).logits.numpy()


def test_peft_adapters_start_the_artifacts_and_ours_load_back(exported, tmp_path):
    kind, path, ids = exported
    config = peft.LoraConfig(r=3, lora_alpha=5, target_modules=MODELS[kind][1], init_lora_weights=False)
    peft.get_peft_model(_model(kind), config).save_pretrained(str(tmp_path / "theirs"))
    expected = _logits(peft.PeftModel.from_pretrained(_model(kind), str(tmp_path / "theirs")).eval(), ids)
    assert np.abs(expected - _logits(_model(kind), ids)).max() > 1e-3   # the adapters change the outputs

    paths = generate_artifacts(str(path), loss=LossType.MSELoss, artifact_directory=tmp_path / "art",
                               additional_output_names=["logits"], lora=LoRA.from_peft(tmp_path / "theirs"))
    state = CheckpointState.load_checkpoint(paths["checkpoint"])
    Module(paths["training"], state, paths["eval"]).export_model_for_inferencing(tmp_path / "m.onnx", ["logits"])
    ours = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"]).run(
        ["logits"], {"input_ids": ids})[0]
    np.testing.assert_allclose(ours, expected, rtol=1e-4, atol=1e-5)

    save_peft_adapter(state, paths["training"], tmp_path / "ours", task_type="CAUSAL_LM")
    theirs_config = json.load(open(tmp_path / "theirs" / "adapter_config.json"))
    ours_config = json.load(open(tmp_path / "ours" / "adapter_config.json"))
    assert ours_config["fan_in_fan_out"] == theirs_config["fan_in_fan_out"] == (kind == "gpt2")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*fan_in_fan_out")
        loaded = peft.PeftModel.from_pretrained(_model(kind), str(tmp_path / "ours")).eval()
    assert isinstance(loaded, peft.PeftModelForCausalLM)
    np.testing.assert_allclose(_logits(loaded, ids), ours, rtol=1e-4, atol=1e-5)


def test_all_linear_adapts_the_modules_peft_does(exported, tmp_path):
    kind, path, _ = exported
    wrapped = peft.get_peft_model(_model(kind), peft.LoraConfig(r=2, target_modules="all-linear"))
    theirs = sorted(n.removeprefix("base_model.model.").removesuffix(".lora_A.default.weight")
                    for n, _ in wrapped.named_parameters() if ".lora_A." in n)
    paths = generate_artifacts(str(path), loss=LossType.MSELoss, artifact_directory=tmp_path,
                               lora=LoRA(rank=2, targets="all-linear"))
    assert sorted(lora_meta(paths["training"]).modules) == theirs and "lm_head" not in theirs
