"""Models from torch.onnx.export with its defaults (the dynamo exporter and its graph optimizer) train torch's own
parameters, under torch's names (artifacts/torch_names.py)."""

from __future__ import annotations

import copy
import re
import warnings

import numpy as np
import onnx
import pytest

from onnxtrain import artifacts
from onnxtrain.api import CheckpointState, Module

torch = pytest.importorskip("torch")


def _export_with_defaults(model, args, path, input_names, dynamic_axes):
    """``torch.onnx.export`` as a user's script calls it: the dynamo exporter with its default optimization."""
    pytest.importorskip("onnxscript")  # the dynamo exporter's; it needs a newer onnx than onnxtrain's floor
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model.eval(), args, str(path), dynamo=True, input_names=input_names,
                          output_names=["logits"], dynamic_axes=dynamic_axes, verbose=False)
    return onnx.load(str(path))


def _tiny_bert():
    from tests.zoo.vision import import_torchvision

    import_torchvision()  # transformers imports torchvision; see tests/zoo/vision.py
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=32, num_labels=3, max_position_embeddings=32,
                                     attn_implementation="eager")
    return transformers.BertForSequenceClassification(config).eval()   # fresh weights: zero biases, unit norms


def _torch_step(model, ids, labels):
    """torch's loss and gradients, in float64 (float32's own rounding is about the size of the tolerance)."""
    model = copy.deepcopy(model).double()
    logits = model(torch.from_numpy(ids)).logits
    loss = torch.nn.functional.cross_entropy(logits, torch.from_numpy(labels))
    loss.backward()
    return float(loss), {n: p.grad.numpy() for n, p in model.named_parameters()}


def test_the_default_export_of_a_fresh_bert_trains_every_torch_parameter_under_its_name(tmp_path):
    model = _tiny_bert()
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 50, (2, 8)).astype(np.int64)
    exported = _export_with_defaults(model, (torch.from_numpy(ids),), tmp_path / "bert.onnx", ["input_ids"],
                                     {"input_ids": {0: "batch", 1: "sequence"}, "logits": {0: "batch"}})
    stored = {i.name for i in exported.graph.initializer}
    names = [n for n, _ in model.named_parameters()]
    # what the optimizer did, so that this test checks the restoration and not an exporter that changed
    assert any(re.fullmatch(r"val_\d+", s) for s in stored), "no transposed weight under a made-up name"
    assert len(set(names) - stored) > 10, "equal parameters were not stored once"

    artifacts.generate_artifacts(str(tmp_path / "bert.onnx"), requires_grad=names,
                                 loss=artifacts.LossType.CrossEntropyLoss, optimizer=artifacts.OptimType.SGD,
                                 artifact_directory=tmp_path / "art", additional_output_names=["logits"])
    state = CheckpointState.load_checkpoint(tmp_path / "art" / "checkpoint")
    assert sorted(n for n, _ in state.parameters) == sorted(names)
    torch_values = dict(model.named_parameters())
    for name, parameter in state.parameters:
        np.testing.assert_array_equal(parameter.data, torch_values[name].detach().numpy(), err_msg=name)

    module = Module(tmp_path / "art" / "training_model.onnx", state, tmp_path / "art" / "eval_model.onnx")
    for batch, length in ((2, 8), (3, 5)):   # the exported size, and another batch and sequence length
        ids = rng.integers(1, 50, (batch, length)).astype(np.int64)
        ids[:, -2:] = 0   # padding tokens: torch's Embedding(padding_idx=0) never updates their row
        labels = rng.integers(0, 3, batch).astype(np.int64)
        module.lazy_reset_grad()
        loss = float(module(ids, labels)[0])
        torch_loss, torch_grads = _torch_step(model, ids, labels)
        assert loss == pytest.approx(torch_loss, rel=1e-5)
        for name, parameter in state.parameters:
            expected = torch_grads[name]
            error = np.linalg.norm(parameter.grad - expected) / max(np.linalg.norm(expected), 1e-6)
            assert error < 1e-4, f"{name} ({batch}x{length}): relative gradient error {error:.2e}"
        assert not state.parameters["bert.embeddings.word_embeddings.weight"].grad[0].any()

    module.export_model_for_inferencing(tmp_path / "inference.onnx", ["logits"])
    import onnxruntime as ort

    ids = rng.integers(0, 50, (3, 6)).astype(np.int64)
    got = ort.InferenceSession(str(tmp_path / "inference.onnx")).run(None, {"input_ids": ids})[0]
    np.testing.assert_allclose(got, model(torch.from_numpy(ids)).logits.detach().numpy(), rtol=1e-4, atol=1e-5)


class _TiedLM(torch.nn.Module):
    """A language model's embedding and output head sharing one weight, as GPT-2's."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(20, 8)
        self.mix = torch.nn.Linear(8, 8)
        self.head = torch.nn.Linear(8, 20, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids):
        return self.head(torch.tanh(self.mix(self.embed(ids))))[:, -1]     # the next token's scores


def test_a_weight_torch_ties_stays_one_parameter(tmp_path):
    """The optimizer stores the head's use of the tied weight transposed, as a tensor of its own: restored, the
    head reads the embedding's weight, and the one parameter's gradient sums both uses, as in torch."""
    torch.manual_seed(0)
    model = _TiedLM().eval()
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 20, (2, 5)).astype(np.int64)
    _export_with_defaults(model, (torch.from_numpy(ids),), tmp_path / "lm.onnx", ["ids"],
                          {"ids": {0: "batch", 1: "sequence"}})
    artifacts.generate_artifacts(str(tmp_path / "lm.onnx"), loss=artifacts.LossType.CrossEntropyLoss,
                                 optimizer=artifacts.OptimType.SGD, artifact_directory=tmp_path / "art")
    state = CheckpointState.load_checkpoint(tmp_path / "art" / "checkpoint")
    # torch.export names the tied weight after its last owner (torch's named_parameters, after its first)
    assert sorted(n for n, _ in state.parameters) == ["head.weight", "mix.bias", "mix.weight"]
    module = Module(tmp_path / "art" / "training_model.onnx", state)
    labels = rng.integers(0, 20, 2).astype(np.int64)
    loss = float(module(ids, labels))
    model.zero_grad()
    reference = torch.nn.functional.cross_entropy(model(torch.from_numpy(ids)), torch.from_numpy(labels))
    reference.backward()
    assert loss == pytest.approx(float(reference), rel=1e-5)
    torch_grads = {n: p.grad.numpy() for n, p in model.named_parameters()}
    torch_grads["head.weight"] = torch_grads.pop("embed.weight")
    for name, parameter in state.parameters:   # the embedding's gradient sums both of its uses
        np.testing.assert_allclose(parameter.grad, torch_grads[name], rtol=1e-4, atol=1e-6, err_msg=name)

    # torch's own list of names calls the tied weight embed.weight: it trains the same tensor
    artifacts.generate_artifacts(str(tmp_path / "lm.onnx"), requires_grad=[n for n, _ in model.named_parameters()],
                                 loss=artifacts.LossType.CrossEntropyLoss, optimizer=artifacts.OptimType.SGD,
                                 artifact_directory=tmp_path / "named")
    named = CheckpointState.load_checkpoint(tmp_path / "named" / "checkpoint")
    assert sorted(n for n, p in named.parameters if p.requires_grad) == ["head.weight", "mix.bias", "mix.weight"]


def test_a_batchnorm_the_default_export_folded_is_named_with_the_way_out(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                                torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 3)).eval()
    _export_with_defaults(model, (torch.randn(2, 3, 8, 8),), tmp_path / "cnn.onnx", ["image"],
                          {"image": {0: "batch"}})
    with pytest.raises(ValueError, match=r"'1.weight' is not an initializer of the model: torch.onnx.export's "
                                         r"graph optimizer .* folded it into the Conv node .*optimize=False"):
        artifacts.generate_artifacts(str(tmp_path / "cnn.onnx"), requires_grad=[n for n, _ in model.named_parameters()],
                                     loss=artifacts.LossType.CrossEntropyLoss, artifact_directory=tmp_path / "art")
    # every tensor the file holds trains under its own name
    artifacts.generate_artifacts(str(tmp_path / "cnn.onnx"), loss=artifacts.LossType.CrossEntropyLoss,
                                 optimizer=artifacts.OptimType.SGD, artifact_directory=tmp_path / "art")
    state = CheckpointState.load_checkpoint(tmp_path / "art" / "checkpoint")
    assert {"0.weight", "4.weight", "4.bias"} <= {n for n, _ in state.parameters}


class _ZeroBiases(torch.nn.Module):
    """A convolution, a LayerNorm and a Linear whose biases are zero, as a fresh model's: the optimizer drops
    them from the Conv, LayerNormalization and Gemm nodes."""

    def __init__(self):
        super().__init__()
        self.conv, self.norm, self.fc = torch.nn.Conv2d(3, 4, 3), torch.nn.LayerNorm(4), torch.nn.Linear(4, 3)
        for bias in (self.conv.bias, self.fc.bias):
            torch.nn.init.zeros_(bias)

    def forward(self, x):
        return self.fc(self.norm(self.conv(x).permute(0, 2, 3, 1)).mean(dim=(1, 2)))


def test_biases_the_default_export_dropped_as_zero_come_back_and_train(tmp_path):
    torch.manual_seed(0)
    model = _ZeroBiases().eval()
    exported = _export_with_defaults(model, (torch.randn(2, 3, 8, 8),), tmp_path / "m.onnx", ["image"],
                                     {"image": {0: "batch"}})
    names = [n for n, _ in model.named_parameters()]
    assert {"conv.bias", "norm.bias", "fc.bias"} - {i.name for i in exported.graph.initializer}, "none dropped"
    artifacts.generate_artifacts(str(tmp_path / "m.onnx"), requires_grad=names,
                                 loss=artifacts.LossType.CrossEntropyLoss, optimizer=artifacts.OptimType.SGD,
                                 artifact_directory=tmp_path / "art")
    state = CheckpointState.load_checkpoint(tmp_path / "art" / "checkpoint")
    assert sorted(n for n, _ in state.parameters) == sorted(names)
    x = np.random.default_rng(2).standard_normal((3, 3, 8, 8)).astype(np.float32)
    labels = np.array([0, 2, 1], dtype=np.int64)
    loss = float(Module(tmp_path / "art" / "training_model.onnx", state)(x, labels))
    reference = torch.nn.functional.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(labels))
    reference.backward()
    assert loss == pytest.approx(float(reference), rel=1e-5)
    for name, parameter in model.named_parameters():
        np.testing.assert_allclose(state.parameters[name].grad, parameter.grad.numpy(), rtol=1e-4, atol=1e-6,
                                   err_msg=name)


class _CausalAttention(torch.nn.Module):
    """Self-attention with a causal mask and SDPA's scale, a learned scalar temperature, a registered buffer and a
    MultiheadAttention: the export makes the mask, the scale and the buffer initializers of its own."""

    def __init__(self, width=16, heads=2):
        super().__init__()
        self.qkv, self.out, self.heads = torch.nn.Linear(width, 3 * width), torch.nn.Linear(width, width), heads
        self.mha = torch.nn.MultiheadAttention(width, heads, batch_first=True)
        self.temperature = torch.nn.Parameter(torch.tensor(2.0))
        self.register_buffer("offset", torch.full((width,), 0.5))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (y.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for y in self.qkv(x).chunk(3, -1))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = self.out(y.transpose(1, 2).reshape(b, t, d)) + self.offset
        return self.mha(y, y, y, need_weights=False)[0] * self.temperature


def test_the_default_export_trains_the_module_parameters_and_no_constant_of_the_export(tmp_path):
    """requires_grad=None on the default export trains exactly torch's parameters, by the exporter's own list
    (its graph signature): the 0-d temperature too, and not the causal mask, SDPA's scale or the buffer, which
    the export stores as initializers under made-up names (trained, they changed what the model computes)."""
    torch.manual_seed(0)
    model = _CausalAttention().eval()
    x = torch.randn(2, 5, 16)
    exported = _export_with_defaults(model, (x,), tmp_path / "attention.onnx", ["x"], None)
    made_up = [i.name for i in exported.graph.initializer if re.fullmatch(r"val_\d+", i.name)]
    assert len(made_up) >= 3, "the export no longer stores its constants as initializers"
    artifacts.generate_artifacts(exported, requires_grad=None, loss=artifacts.LossType.MSELoss,
                                 artifact_directory=tmp_path / "a")
    state = CheckpointState.load_checkpoint(tmp_path / "a" / "checkpoint")
    trainable = {n for n, p in state.parameters if p.requires_grad}
    assert trainable == {n for n, _ in model.named_parameters()}   # mha.out_proj.bias by its torch name too
    module = Module(tmp_path / "a" / "training_model.onnx", state)
    target = np.zeros((2, 5, 16), np.float32)
    loss = module(x.numpy(), target)
    reference = model.double()
    torch_loss = torch.nn.functional.mse_loss(reference(x.double()), torch.from_numpy(target).double())
    torch_loss.backward()
    assert abs(float(loss) - float(torch_loss)) < 1e-5
    for name, p in reference.named_parameters():
        np.testing.assert_allclose(state.parameters[name].grad, p.grad.numpy(), rtol=1e-4, atol=1e-6,
                                   err_msg=name)


def test_parameters_the_optimizer_merged_without_a_record_are_named(tmp_path, caplog):
    """A fresh TransformerDecoderLayer: the two attention blocks' zero in_proj_bias become one tensor, and the
    cross-attention reads its copy through a Split that records no torch call: they would train as one, so the
    generation warns and naming the lost one says where it went and how to keep it."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerDecoderLayer(16, 2, 32, dropout=0.0, batch_first=True).eval()

    class Decoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = layer

        def forward(self, x, memory):
            return self.layer(x, memory)

    exported = _export_with_defaults(Decoder(), (torch.randn(2, 5, 16), torch.randn(2, 7, 16)),
                                     tmp_path / "decoder.onnx", ["x", "memory"], None)
    with pytest.raises(ValueError, match=r"'layer.multihead_attn.in_proj_bias' is not an initializer of the model: "
                                         r".* stored it once with another parameter of equal values .* "
                                         r"optimize=False"):
        artifacts.generate_artifacts(exported, requires_grad=["layer.multihead_attn.in_proj_bias"],
                                     loss=artifacts.LossType.MSELoss, artifact_directory=tmp_path / "a")
    assert "share a tensor with another parameter" in caplog.text
    assert "layer.multihead_attn.in_proj_bias" in caplog.text


def test_an_embedding_that_scales_its_gradient_by_frequency_gets_torch_gradient(tmp_path):
    """Embedding(scale_grad_by_freq=True): torch divides each lookup's gradient by its index's count in the
    batch; the dynamo export records the flag (the fourth argument of aten.embedding), which the Gather rule reads
    (a row looked up 4 times had 4x torch's gradient)."""
    torch.manual_seed(0)

    class Bag(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = torch.nn.Embedding(10, 4, scale_grad_by_freq=True)
            self.head = torch.nn.Linear(4, 3)

        def forward(self, ids):
            return self.head(self.embedding(ids).mean(1))

    model = Bag().eval()
    ids = torch.tensor([[1, 1, 2, 3], [1, 5, 1, 0]])
    exported = _export_with_defaults(model, (ids,), tmp_path / "bag.onnx", ["ids"], None)
    artifacts.generate_artifacts(exported, requires_grad=None, loss=artifacts.LossType.CrossEntropyLoss,
                                 artifact_directory=tmp_path / "a")
    state = CheckpointState.load_checkpoint(tmp_path / "a" / "checkpoint")
    labels = np.array([0, 2], np.int64)
    Module(tmp_path / "a" / "training_model.onnx", state)(ids.numpy(), labels)
    torch.nn.functional.cross_entropy(model(ids), torch.from_numpy(labels)).backward()
    np.testing.assert_allclose(state.parameters["embedding.weight"].grad, model.embedding.weight.grad.numpy(),
                               rtol=1e-5, atol=1e-7)
