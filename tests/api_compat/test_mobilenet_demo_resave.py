"""A user's MobileNet demo script: it edits the generated eval model (drops the extra outputs of every
BatchNormalization), saves the checkpoint through the private ``model._state`` over the file it was loaded from,
with the optimizer state, reloads it, trains one step and evaluates.

Source: a public GitHub script found through the code index (stored file id 31228962520, paths under
``__file_storage__/models/mobilenet_pretrained_demo``).
Adapted: the import; a small random-weight convolutional classifier with BatchNorm, exported in training mode,
and its artifacts generated here (the script reads them from disk), 32x32 images instead of 224x224; the script's
results (``foo``, ``bar``) are returned and checked.
"""

import os

import numpy as np
import onnx
import pytest

from onnxtrain import artifacts  # was: from onnxruntime.training import artifacts
from onnxtrain.api import CheckpointState, Module, Optimizer  # was: from onnxruntime.training.api import ...

torch = pytest.importorskip("torch")


# -- the user's code (paths parametrised, otherwise unchanged) -------------------------------------------------------
def main(base):
    eval_model = onnx.load(f"{base}/eval_model.onnx")
    for node in eval_model.graph.node:
        if node.op_type == "BatchNormalization":
            del node.output[1:]
    onnx.save(eval_model, f"{base}/eval_model.onnx")

    state = CheckpointState.load_checkpoint(f"{base}/checkpoint")

    # Create module.
    model = Module(f"{base}/training_model.onnx", state, f"{base}/eval_model.onnx")
    # Create optimizer.
    optimizer = Optimizer(f"{base}/optimizer_model.onnx", model)
    optimizer.set_learning_rate(0.1)
    state.save_checkpoint(model._state, f"{base}/checkpoint", include_optimizer_state=True)

    state = CheckpointState.load_checkpoint(f"{base}/checkpoint")
    # Create module.
    model = Module(f"{base}/training_model.onnx", state, f"{base}/eval_model.onnx")
    # Create optimizer.
    optimizer = Optimizer(f"{base}/optimizer_model.onnx", model)
    lr = optimizer.get_learning_rate()

    model.train()
    input = torch.randn(2, 3, 32, 32).numpy()
    forward_inputs = [input, np.array([0, 0])]
    foo = model(*forward_inputs)
    optimizer.step()
    model.lazy_reset_grad()

    model.eval()
    bar = model(*forward_inputs)
    return state, lr, foo, bar
# ------------------------------------------------------------------------------------------------------------------


def test_mobilenet_demo_resaves_through_module_state(tmp_path):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                              torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 4))
    base = tmp_path / "mobilenet_pretrained_demo"
    os.makedirs(base)
    torch.onnx.export(net, (torch.randn(2, 3, 32, 32),), str(tmp_path / "m.onnx"), input_names=["input"],
                      output_names=["output"], dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}},
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False, dynamo=False)
    forward = onnx.load(str(tmp_path / "m.onnx"))
    requires_grad = ["5.weight", "5.bias"]
    frozen_params = [p.name for p in forward.graph.initializer if p.name not in requires_grad]
    artifacts.generate_artifacts(forward, requires_grad=requires_grad, frozen_params=frozen_params,
                                 loss=artifacts.LossType.CrossEntropyLoss, optimizer=artifacts.OptimType.AdamW,
                                 artifact_directory=base)
    generated = CheckpointState.load_checkpoint(base / "checkpoint")
    before = {name: p.data for name, p in generated.parameters}

    torch.manual_seed(1)
    state, lr, foo, bar = main(base)

    # The re-saved checkpoint holds the generated values. The learning rate set before saving is not part of it
    # (the peer's checkpoint keeps only the initial learning rate a scheduler registers): the reloaded optimizer
    # starts from the default.
    assert lr == pytest.approx(1e-3)
    assert np.isfinite(foo) and np.isfinite(bar) and np.shape(foo) == np.shape(bar) == ()
    for name, p in state.parameters:
        if name in requires_grad:
            assert not np.array_equal(p.data, before[name]), name
        else:
            np.testing.assert_array_equal(p.data, before[name], err_msg=name)
