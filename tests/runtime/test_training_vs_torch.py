"""20 training steps with onnxtrain agree with torch.optim on the same model, weights and data."""

from __future__ import annotations

import numpy as np
import pytest

from onnxtrain import blocks
from onnxtrain.api import CheckpointState, Module, Optimizer
from onnxtrain.artifacts import LossType, generate_artifacts

STEPS = 20

OPTIMIZERS = {
    "adamw": (lambda: blocks.AdamW(weight_decay=0.01, mode="torch"),
              lambda torch, params: torch.optim.AdamW(params, lr=1e-3, eps=1e-6, weight_decay=0.01)),
    "sgd": (lambda: blocks.SGD(momentum=0.9, nesterov=True, weight_decay=1e-4),
            lambda torch, params: torch.optim.SGD(params, lr=1e-2, momentum=0.9, nesterov=True, weight_decay=1e-4)),
}


@pytest.mark.parametrize("workload", ["mlp", "lenet"])
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_losses_and_weights_follow_torch(workload, optimizer, workloads, tmp_path):
    w = workloads(workload)
    torch = w.torch
    ours_block, make_torch_opt = OPTIMIZERS[optimizer]
    generate_artifacts(str(w.onnx_path), requires_grad=w.trainable, loss=LossType.CrossEntropyLoss,
                       optimizer=ours_block(), artifact_directory=tmp_path)
    state = CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    module = Module(tmp_path / "training_model.onnx", state)
    opt = Optimizer(tmp_path / "optimizer_model.onnx", module)
    lr = 1e-3 if optimizer == "adamw" else 1e-2
    opt.set_learning_rate(lr)

    model = w.fresh_model()
    torch_opt = make_torch_opt(torch, model.parameters())
    x, y = torch.from_numpy(w.x), torch.from_numpy(w.y)
    for step in range(STEPS):
        ours = float(module(w.x, w.y))
        opt.step()
        module.lazy_reset_grad()
        torch_opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        torch_opt.step()
        # float32 rounding differences grow through Adam's normalisation: 1e-4 for 10 steps, 5e-4 after
        assert ours == pytest.approx(loss.item(), rel=1e-4 if step < 10 else 5e-4, abs=1e-6), f"step {step}"
    # Float rounding differs between onnxruntime and torch kernels; where two values of a MaxPool window or a
    # ReLU input are within rounding of each other the two pick differently and that step's gradient differs
    # (seen once in 20 LeNet steps, 1e-3 on one tensor). Adam then carries it: compare whole tensors at 5e-3.
    for name, p in model.named_parameters():
        ref = p.detach().numpy()
        diff = np.linalg.norm(state.parameters[name].data - ref) / np.linalg.norm(ref)
        assert diff < 5e-3, f"{name}: relative difference {diff:.2e} after {STEPS} steps"
