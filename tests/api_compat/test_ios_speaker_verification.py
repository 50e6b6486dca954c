"""The iOS speaker-verification sample's artifact script: Wav2Vec2 with a new 2-class head and a custom loss block
that takes every model output (``build(self, logits, *args)``) but uses only the logits.

Source: https://github.com/microsoft/onnxruntime-training-examples/blob/master/on_device_training/mobile/ios/artifacts_gen.py
Adapted: the imports; a random-weight Wav2Vec2 (small config) instead of the superb/wav2vec2-base-superb-sid
download, 0.1 s of audio instead of 10 s; the script's ``artifacts_dir=`` keyword (not a parameter of
generate_artifacts in onnxruntime-training 1.19.2 either: a TypeError there too) is ``artifact_directory=``. The
training loop is the app's (Swift: trainStep, optimizerStep, lazyResetGrad) in Python, on a user's recordings
(label 1) against other speakers' (label 0).
"""

import numpy as np
import pytest

import onnxtrain.onnxblock as onnxblock  # was: import onnxruntime.training.onnxblock as onnxblock
from onnxtrain import artifacts  # was: from onnxruntime.training import artifacts
from onnxtrain.api import CheckpointState, Module, Optimizer  # was: (the Swift training API)
from tests.zoo.vision import import_torchvision

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
import_torchvision()  # transformers imports torchvision; see tests/zoo/vision.py


class CustomCELoss(onnxblock.Block):
    def __init__(self):
        super().__init__()
        self.celoss = onnxblock.loss.CrossEntropyLoss()

    def build(self, logits, *args):
        return self.celoss(logits)


def test_ios_speaker_verification_artifacts_and_training(tmp_path):
    import onnx
    from transformers import Wav2Vec2Config, Wav2Vec2ForSequenceClassification

    torch.manual_seed(0)
    config = Wav2Vec2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                            conv_dim=(32, 32), conv_stride=(5, 4), conv_kernel=(10, 4), num_feat_extract_layers=2,
                            num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, classifier_proj_size=256,
                            num_labels=4)
    model = Wav2Vec2ForSequenceClassification(config)
    model.classifier = torch.nn.Linear(256, 2)

    dummy_input = torch.randn(1, 1600, requires_grad=True)
    torch.onnx.export(model, dummy_input, str(tmp_path / "wav2vec.onnx"), input_names=["input"],
                      output_names=["output"], dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}},
                      dynamo=False)

    onnx_model = onnx.load(str(tmp_path / "wav2vec.onnx"))
    requires_grad = ["classifier.weight", "classifier.bias"]
    frozen_params = [
        param.name
        for param in onnx_model.graph.initializer
        if param.name not in requires_grad
    ]
    with pytest.raises(TypeError, match="artifacts_dir"):
        artifacts.generate_artifacts(onnx_model, requires_grad=requires_grad, frozen_params=frozen_params,
                                     loss=CustomCELoss(), optimizer=artifacts.OptimType.AdamW,
                                     artifacts_dir=str(tmp_path))
    artifacts.generate_artifacts(
        onnx_model,
        requires_grad=requires_grad,
        frozen_params=frozen_params,
        loss=CustomCELoss(),
        optimizer=artifacts.OptimType.AdamW,
        artifact_directory=str(tmp_path),
    )

    state = CheckpointState.load_checkpoint(str(tmp_path / "checkpoint"))
    frozen_before = {n: p.data for n, p in state.parameters if not p.requires_grad}
    module = Module(str(tmp_path / "training_model.onnx"), state, str(tmp_path / "eval_model.onnx"))
    optimizer = Optimizer(str(tmp_path / "optimizer_model.onnx"), module)
    assert module.input_names() == ["input", "labels"]
    rng = np.random.default_rng(0)
    t = np.arange(1600, dtype=np.float32) / 16000
    user = np.stack([np.sin(2 * np.pi * 440 * t + p) for p in rng.uniform(0, 6, 4)]).astype(np.float32)
    others = rng.standard_normal((4, 1600)).astype(np.float32)
    audio, labels = np.concatenate([user, others]), np.array([1] * 4 + [0] * 4, dtype=np.int64)
    losses = []
    for _ in range(15):
        losses.append(float(module(audio, labels)))
        optimizer.step()
        module.lazy_reset_grad()
    # onnxruntime-training 1.19.2 runs this script to the same losses (within 1e-6); at the default learning rate
    # (1e-3) a head on random features learns slowly but steadily.
    assert all(later < earlier for earlier, later in zip(losses, losses[1:]))
    assert losses[-1] < losses[0] - 0.015
    assert sorted(n for n, p in state.parameters if p.requires_grad) == sorted(requires_grad)
    for name, before in frozen_before.items():
        np.testing.assert_array_equal(state.parameters[name].data, before, err_msg=name)
