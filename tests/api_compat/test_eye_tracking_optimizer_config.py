"""An eye-tracking app's artifact script: a temporal CNN (four stacked frames, five Conv + BatchNorm stages, global
pooling, three Linear layers; ten regression outputs) put in eval mode with its BatchNorm layers frozen, exported
with ``TrainingMode.EVAL`` and no constant folding, every initializer whose name contains ``bn``, ``running_mean``,
``running_var`` or ``num_batches_tracked`` frozen and the rest trained, an MSE loss, AdamW and a nominal checkpoint.
(Its forward never calls the BatchNorm layers, so the export has none and every initializer trains.)

Source: a public GitHub file found through the code index (stored file id 22111037344, the
``EyeTrackingModel`` artifact export; a sibling script of the same project, file id 21197673727, makes the same
call).
Adapted: the imports; the paths parametrised; 64x64 frames in batches of 4 instead of 128x128 in batches of 16 (the
network pools globally, so nothing else changes). The script passes ``optimizer_config={"lr": 1e-4, "betas":
[0.9, 0.999], "eps": 1e-8, "weight_decay": 1e-4}``, a keyword generate_artifacts does not have: the peer raises
``TypeError: generate_artifacts() got an unexpected keyword argument 'optimizer_config'`` and so does onnxtrain
(checked here). The call is adapted as the peer's API allows it: ``optimizer=onnxblock.optim.AdamW(betas=...,
eps=..., weight_decay=...)`` and the learning rate set on the Optimizer. The app's trainer is played by the Python
API on random frames and targets; the first step's loss and gradients are checked against torch.
"""

import os

import numpy as np
import onnx
import pytest

import onnxtrain.onnxblock as onnxblock  # added, for the adapted optimizer argument
from onnxtrain import artifacts  # was: from onnxruntime.training import artifacts
from onnxtrain.api import CheckpointState, Module, Optimizer  # was: the app's TrainingSession

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional


# -- the user's code (paths and sizes parametrised, the optimizer arguments adapted, otherwise unchanged) ----------
class EyeTrackingModel(nn.Module):
    def __init__(self, dropout_p=0.2):
        super(EyeTrackingModel, self).__init__()

        # Feature extraction layers - for 8 channels (current frame + 3 previous frames)
        self.conv1 = nn.Conv2d(8, 32, kernel_size=5, stride=2, padding=2)  # 64x64
        self.bn1 = nn.BatchNorm2d(32)

        self.conv2 = nn.Conv2d(32, 64, kernel_size=3, stride=2, padding=1)  # 32x32
        self.bn2 = nn.BatchNorm2d(64)

        self.conv3 = nn.Conv2d(64, 128, kernel_size=3, stride=2, padding=1)  # 16x16
        self.bn3 = nn.BatchNorm2d(128)

        self.conv4 = nn.Conv2d(128, 256, kernel_size=3, stride=2, padding=1)  # 8x8
        self.bn4 = nn.BatchNorm2d(256)

        self.conv5 = nn.Conv2d(256, 512, kernel_size=3, stride=2, padding=1)  # 4x4
        self.bn5 = nn.BatchNorm2d(512)

        self.gap = nn.AdaptiveAvgPool2d(1)

        self.fc1 = nn.Linear(512, 256)
        self.dropout1 = nn.Dropout(dropout_p)

        self.fc2 = nn.Linear(256, 64)
        self.dropout2 = nn.Dropout(dropout_p)

        self.fc_blends = nn.Linear(64, 10)

    def forward(self, x, return_blends=True, return_embs=False):
        # Feature extraction
        x = F.relu(self.conv1(x))
        x = self.dropout1(x)
        x = F.relu(self.conv2(x))
        x = self.dropout1(x)
        x = F.relu(self.conv3(x))
        x = self.dropout1(x)
        x = F.relu(self.conv4(x))
        x = self.dropout1(x)
        x = F.relu(self.conv5(x))
        x = self.dropout1(x)

        # Global average pooling
        x = self.gap(x)
        x = x.view(x.size(0), -1)

        # Fully connected layers
        x = F.relu(self.fc1(x))
        x = self.dropout1(x)

        x = F.relu(self.fc2(x))
        x = self.dropout2(x)

        if return_embs:
            return x
        else:
            eye_tracking_params = self.fc_blends(x)
            return eye_tracking_params


def count_parameters(model):
    """Count the number of trainable parameters in the model"""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def freeze_batchnorm(model):
    """Freeze BatchNorm layers to avoid training issues"""
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.eval()  # Set to eval mode
            module.weight.requires_grad = False
            module.bias.requires_grad = False
            module.running_mean.requires_grad = False
            module.running_var.requires_grad = False
            if hasattr(module, 'num_batches_tracked'):
                module.num_batches_tracked.requires_grad = False


def export_model_with_training_artifacts(base, input_resolution=128, batch_size=16):
    # Configuration
    num_frames = 4  # Current frame + 3 previous frames  # noqa: F841 (the user's)

    # Create model instance
    model = EyeTrackingModel(dropout_p=0.0)  # Set dropout to 0 for inference

    # Set model to eval mode to freeze BatchNorm statistics
    model.eval()

    # Freeze BatchNorm layers
    freeze_batchnorm(model)

    # Count and print trainable parameters in PyTorch model
    total_params = count_parameters(model)
    print(f"Total trainable parameters in PyTorch model: {total_params:,}")

    # Create a dummy input tensor (8 channels - 2 channels per frame * 4 frames)
    dummy_input = torch.randn(batch_size, 8, input_resolution, input_resolution)

    # Verify model works
    out = model(dummy_input)
    print(f"Model output shape: {out.shape}")

    # Create output directories
    os.makedirs(f"{base}/onnx_artifacts", exist_ok=True)
    os.makedirs(f"{base}/onnx_artifacts/training", exist_ok=True)

    onnx_model_path = f"{base}/onnx_artifacts/temporal_eye_tracking_model.onnx"
    artifacts_output_dir = f"{base}/onnx_artifacts/training"

    # Export the model to ONNX format with training mode DISABLED
    torch.onnx.export(
        model,                      # PyTorch model
        dummy_input,                # Dummy input
        onnx_model_path,            # Output path
        export_params=True,         # Store the trained weights
        opset_version=15,           # ONNX version
        do_constant_folding=False,  # Don't fold constants
        input_names=['input'],      # Input names
        output_names=['output'],    # Output names
        dynamic_axes={              # Variable length axes
            'input': {0: 'batch_size'},
            'output': {0: 'batch_size'}
        },
        training=torch.onnx.TrainingMode.EVAL,  # Use EVAL mode
        dynamo=False,  # added: torch 2.9's default is the dynamo exporter; the script's torch used TorchScript
    )

    print(f"ONNX model exported to {onnx_model_path}")

    # Load the exported ONNX model
    onnx_model = onnx.load(onnx_model_path)

    # Identify parameters that need gradients
    requires_grad_params = []
    frozen_params = []
    trainable_param_count = 0

    # Make all parameters trainable except BatchNorm parameters
    for param in onnx_model.graph.initializer:
        # Skip BatchNorm parameters and running statistics
        if any(bn_param in param.name for bn_param in [
            'bn', 'running_mean', 'running_var', 'num_batches_tracked'
        ]):
            frozen_params.append(param.name)
        else:
            requires_grad_params.append(param.name)
            # Get the shape of the parameter tensor from the raw data
            tensor = onnx.numpy_helper.to_array(param)
            trainable_param_count += np.prod(tensor.shape)

    # Generate training artifacts with proper optimizer settings
    artifacts.generate_artifacts(
        onnx_model,
        requires_grad=requires_grad_params,
        frozen_params=frozen_params,
        loss=artifacts.LossType.MSELoss,  # Using MSE loss for regression
        # was: optimizer=artifacts.OptimType.AdamW, optimizer_config={"lr": 1e-4, "betas": [0.9, 0.999],
        #      "eps": 1e-8, "weight_decay": 1e-4}  (a TypeError on the peer); the learning rate goes to the Optimizer
        optimizer=onnxblock.optim.AdamW(betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-4),
        artifact_directory=artifacts_output_dir,
        nominal_checkpoint=True
    )

    print(f"Training artifacts generated in {artifacts_output_dir}")
    print(f"Number of trainable parameters: {trainable_param_count:,}")
    print(f"Number of trainable parameter tensors: {len(requires_grad_params)}")
    print(f"Number of frozen parameter tensors: {len(frozen_params)}")

    # Verify that the training artifacts were created
    expected_files = [
        "training_model.onnx",
        "eval_model.onnx",
        "optimizer_model.onnx",
        "checkpoint"
    ]

    for file in expected_files:
        full_path = os.path.join(artifacts_output_dir, file)
        if os.path.exists(full_path):
            print(f"✓ {file} created successfully")
        else:
            print(f"✗ {file} was not created!")
    return model, onnx_model_path, artifacts_output_dir
# ------------------------------------------------------------------------------------------------------------------


def test_eval_mode_export_trains_as_torch(tmp_path):
    torch.manual_seed(0)
    model, onnx_path, out = export_model_with_training_artifacts(tmp_path, input_resolution=64, batch_size=4)

    # The script's own call, optimizer_config included, is a TypeError here as on the peer.
    with pytest.raises(TypeError, match="optimizer_config"):
        artifacts.generate_artifacts(onnx.load(onnx_path), requires_grad=["fc1.weight"],
                                     loss=artifacts.LossType.MSELoss, optimizer=artifacts.OptimType.AdamW,
                                     artifact_directory=str(tmp_path / "x"), optimizer_config={"lr": 1e-4})

    # The forward never calls its BatchNorm layers, so the export has none: every initializer trains, and the
    # trainable size is what the script counts in torch (BatchNorm frozen there).
    state = CheckpointState.load_checkpoint(os.path.join(out, "checkpoint"))
    module = Module(os.path.join(out, "training_model.onnx"), state, os.path.join(out, "eval_model.onnx"))
    optimizer = Optimizer(os.path.join(out, "optimizer_model.onnx"), module)
    optimizer.set_learning_rate(1e-4)  # was: optimizer_config's "lr"
    assert module.get_parameters_size(trainable_only=True) == count_parameters(model) == 1722538
    assert module.get_parameters_size(trainable_only=False) == count_parameters(model)
    assert os.path.exists(os.path.join(out, "nominal_checkpoint"))

    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 8, 64, 64)).astype(np.float32)
    y = rng.standard_normal((4, 10)).astype(np.float32)
    module.train()
    loss = float(module(x, y))
    torch_loss = F.mse_loss(model(torch.from_numpy(x)), torch.from_numpy(y))
    torch_loss.backward()
    assert loss == pytest.approx(torch_loss.item(), rel=1e-5)
    torch_params = dict(model.named_parameters())
    for name, p in state.parameters:
        assert p.requires_grad, name
        np.testing.assert_allclose(p.grad, torch_params[name].grad.numpy(), rtol=1e-4, atol=1e-6, err_msg=name)
    optimizer.step()
    module.lazy_reset_grad()
    for _ in range(4):
        module(x, y)
        optimizer.step()
        module.lazy_reset_grad()
    module.eval()
    assert float(module(x, y)) < loss
