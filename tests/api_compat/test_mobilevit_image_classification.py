"""The C# image-classification sample's offline step: a Hugging Face MobileViT with 7 labels, exported at opset 12,
only the classifier trained, torch's buffers listed as frozen.

Source: https://github.com/microsoft/onnxruntime-training-examples/blob/master/on_device_training/desktop/csharp/image_classification/mobilevit_offline.ipynb
Adapted: the imports; a random-weight MobileViT (small config, 64x64 images) instead of the apple/mobilevit-xx-small
download; exported with ``dynamo=False`` (the notebook's TorchScript exporter). The notebook passes
``do_constant_folding=False, training=...`` to generate_artifacts, which onnxruntime-training 1.19.2 rejects as well
(TypeError: unexpected keyword arguments); the call without them is the one that runs. The C# training loop is the
Python API's, on digits as 7 "expressions". onnxruntime-training 1.19.2 runs this script too, but its exported
inference model keeps BatchNormalization in training mode (batch statistics: up to 1e-3 off torch's eval mode here);
onnxtrain's is torch's eval-mode network. Slow (about 25 s: transformers' import and the TorchScript export).
"""

import numpy as np
import pytest

from onnxtrain import artifacts  # was: from onnxruntime.training import artifacts
from onnxtrain.api import CheckpointState, Module, Optimizer  # was: (the C# training API)
from tests.api_compat._data import digit_images
from tests.zoo.vision import import_torchvision

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
import_torchvision()  # transformers imports torchvision; see tests/zoo/vision.py


@pytest.mark.slow
def test_mobilevit_classifier_fine_tuning(tmp_path):
    import onnx

    torch.manual_seed(0)
    config = transformers.MobileViTConfig(image_size=64, patch_size=2, hidden_sizes=[16, 16, 24],
                                          neck_hidden_sizes=[8, 8, 12, 12, 16, 16, 32], num_attention_heads=2,
                                          num_labels=7, expand_ratio=2.0)
    model = transformers.MobileViTForImageClassification(config)
    onnx_name = str(tmp_path / "mobilevit.onnx")
    random_input = {"pixel_values": torch.rand(5, 3, 64, 64)}
    torch.onnx.export(model, random_input, onnx_name,
                      input_names=["pixel_values"], output_names=["outputs"],
                      export_params=True,
                      dynamic_axes={
                          "pixel_values": {0: "batch_size"},
                          "outputs": {0: "batch_size"},
                      },
                      do_constant_folding=False,
                      training=torch.onnx.TrainingMode.TRAINING,
                      opset_version=12, dynamo=False)

    requires_grad = []
    frozen_params = []
    for name, param in model.named_parameters():
        if name == "classifier.weight" or name == "classifier.bias":
            requires_grad.append(name)
        else:
            frozen_params.append(name)
    for name, param in model.named_buffers():
        frozen_params.append(name)
    onnx_model = onnx.load(onnx_name)

    with pytest.raises(TypeError, match="do_constant_folding"):
        artifacts.generate_artifacts(onnx_model, optimizer=artifacts.OptimType.AdamW,
                                     loss=artifacts.LossType.CrossEntropyLoss, requires_grad=requires_grad,
                                     frozen_params=frozen_params, do_constant_folding=False,
                                     training=torch.onnx.TrainingMode.TRAINING)
    artifacts.generate_artifacts(
        onnx_model,
        optimizer=artifacts.OptimType.AdamW,
        loss=artifacts.LossType.CrossEntropyLoss,
        requires_grad=requires_grad,
        frozen_params=frozen_params,
        artifact_directory=str(tmp_path),
    )

    state = CheckpointState.load_checkpoint(str(tmp_path / "checkpoint"))
    module = Module(str(tmp_path / "training_model.onnx"), state, str(tmp_path / "eval_model.onnx"))
    optimizer = Optimizer(str(tmp_path / "optimizer_model.onnx"), module)
    assert sorted(n for n, p in state.parameters if p.requires_grad) == ["classifier.bias", "classifier.weight"]
    images, labels = digit_images(70, size=64)
    labels = labels % 7
    optimizer.set_learning_rate(0.01)
    losses = []
    for _ in range(6):
        losses.append(float(module(images[:35], labels[:35])))
        optimizer.step()
        module.lazy_reset_grad()
    assert losses[-1] < losses[0]
    # The opset-12 training-mode export was converted (BatchNormalization's 5 outputs, training by output count);
    # the exported inference model must be torch's network in eval mode with the trained head.
    module.export_model_for_inferencing(str(tmp_path / "inference.onnx"), ["outputs"])
    from onnxruntime import InferenceSession

    session = InferenceSession(str(tmp_path / "inference.onnx"), providers=["CPUExecutionProvider"])
    with torch.no_grad():
        for name in requires_grad:
            model.get_parameter(name).copy_(torch.from_numpy(state.parameters[name].data))
        expected = model.eval()(torch.from_numpy(images[35:])).logits.numpy()
    np.testing.assert_allclose(session.run(["outputs"], {"pixel_values": images[35:]})[0], expected,
                               rtol=1e-3, atol=1e-4)
