"""A fine-tuning tool's artifact step (onnx-finetune's ``scripts/generate_artifacts.py``): an argparse script that
maps ``--loss mse|cross-entropy|bce`` to ``LossType`` and ``--optimizer adamw|sgd`` to ``OptimType`` (``SGD``
included), freezes initializers by ``--freeze-prefix`` (repeatable; the rest train), calls generate_artifacts with
both lists, then rewrites training_model.onnx, eval_model.onnx and optimizer_model.onnx in place with their IR version
clamped to 10 (``onnx.load`` / ``onnx.save``), for the tool's C++ trainer, which reads the four files.

Source: a public GitHub file found through the code index (stored file id 67416476181, onnx-finetune's
``generate_artifacts.py``, "the one step in the fine-tuning workflow that needs Python").
Adapted: the import; ``main(argv)`` parses the list given instead of ``sys.argv``; the ``--lora-params-file`` branch
(a manifest written by the tool's ``inject_lora.py``) is left out. The tool's C++ trainer (``TrainStep``,
``OptimizerStep``, ``LazyResetGrad`` over the four files) is played by the Python API: a small random-weight torch MLP
(``enc.*`` and ``head.*`` layers) on sklearn's digits, a regression target for ``mse``, the 10 classes for
``cross-entropy`` and one-hot multi-label targets for ``bce``. SGD's step is checked against torch's SGD
(``lr=1e-3``, the peer's default learning rate).
"""

import argparse
import os
import sys

import numpy as np
import onnx
import pytest

from onnxtrain import artifacts  # was: from onnxruntime.training import artifacts
from onnxtrain.api import CheckpointState, Module, Optimizer  # was: from onnxruntime.training.api import ...
from tests.api_compat._data import digits

torch = pytest.importorskip("torch")


# -- the user's script (argv parametrised, the LoRA manifest branch left out; otherwise unchanged) -----------------
LOSS_TYPES = {
    "mse": artifacts.LossType.MSELoss,
    "cross-entropy": artifacts.LossType.CrossEntropyLoss,
    "bce": artifacts.LossType.BCEWithLogitsLoss,
}
OPTIM_TYPES = {
    "adamw": artifacts.OptimType.AdamW,
    "sgd": artifacts.OptimType.SGD,
}

MAX_SUPPORTED_IR_VERSION = 10


def _clamp_ir_version(path):
    model = onnx.load(path)
    if model.ir_version > MAX_SUPPORTED_IR_VERSION:
        model.ir_version = MAX_SUPPORTED_IR_VERSION
        onnx.save(model, path)


def main(argv):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("model", help="input .onnx file")
    p.add_argument("-o", "--output-dir", required=True, help="directory to write training artifacts into")
    p.add_argument("--freeze-prefix", action="append", default=[],
                   help="initializer name prefix to freeze (repeatable).")
    p.add_argument("--loss", choices=LOSS_TYPES, default="mse")
    p.add_argument("--optimizer", choices=OPTIM_TYPES, default="adamw")
    args = p.parse_args(argv)

    model = onnx.load(args.model)
    all_params = [i.name for i in model.graph.initializer]
    if args.freeze_prefix:
        frozen = [
            n
            for n in all_params
            if any(n.startswith(pfx) for pfx in args.freeze_prefix)
        ]
        trainable = [n for n in all_params if n not in frozen]
    else:
        frozen = []
        trainable = list(all_params)

    if not trainable:
        sys.exit(
            "error: --freeze-prefix matched every initializer, nothing left to train"
        )

    print(f"trainable ({len(trainable)}):", ", ".join(trainable))
    if frozen:
        print(f"frozen ({len(frozen)}):", ", ".join(frozen))

    os.makedirs(args.output_dir, exist_ok=True)

    artifacts.generate_artifacts(
        model,
        requires_grad=trainable,
        frozen_params=frozen,
        loss=LOSS_TYPES[args.loss],
        optimizer=OPTIM_TYPES[args.optimizer],
        artifact_directory=args.output_dir,
    )
    print("wrote training artifacts ->", args.output_dir)

    for name in ("training_model.onnx", "eval_model.onnx", "optimizer_model.onnx"):
        _clamp_ir_version(os.path.join(args.output_dir, name))
# ------------------------------------------------------------------------------------------------------------------


class _Net(torch.nn.Module):
    def __init__(self, outputs):
        super().__init__()
        self.enc = torch.nn.Linear(64, 32)
        self.head = torch.nn.Linear(32, outputs)

    def forward(self, x):
        return self.head(torch.relu(self.enc(x)))


def _export(tmp_path, outputs):
    torch.manual_seed(0)
    net = _Net(outputs)
    torch.onnx.export(net, (torch.randn(4, 64),), str(tmp_path / "toy.onnx"), input_names=["input"],
                      output_names=["output"], dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}},
                      do_constant_folding=False, dynamo=False)
    return net


def _targets(loss, x, y):
    if loss == "mse":
        return x.sum(axis=1, keepdims=True) / 8  # the tool's regression toy: the target is the input's sum
    if loss == "bce":
        return np.eye(10, dtype=np.float32)[y]
    return y


@pytest.mark.parametrize("loss,optimizer", [("mse", "adamw"), ("cross-entropy", "sgd"), ("bce", "adamw")])
def test_generate_clamp_and_train(tmp_path, loss, optimizer):
    outputs = 1 if loss == "mse" else 10
    net = _export(tmp_path, outputs)
    out = tmp_path / "artifacts"
    main([str(tmp_path / "toy.onnx"), "-o", str(out), "--freeze-prefix", "enc.", "--loss", loss,
          "--optimizer", optimizer])
    for name in ("training_model.onnx", "eval_model.onnx", "optimizer_model.onnx"):
        assert onnx.load(str(out / name)).ir_version <= MAX_SUPPORTED_IR_VERSION

    # The tool's trainer, on the four files as the script left them.
    state = CheckpointState.load_checkpoint(str(out / "checkpoint"))
    module = Module(str(out / "training_model.onnx"), state, str(out / "eval_model.onnx"))
    opt = Optimizer(str(out / "optimizer_model.onnx"), module)
    assert sorted(name for name, p in state.parameters if p.requires_grad) == ["head.bias", "head.weight"]
    x, y = digits(256)
    t = _targets(loss, x, y)
    module.eval()
    before = float(module(x, t))

    # One step: the loss is torch's; the frozen encoder stays; the head takes the step (SGD's is torch's; the peer's
    # AdamW is Hugging Face's form, whose epsilon is not torch's, so there only the direction is checked).
    reference = {name: p.detach().clone() for name, p in net.named_parameters()}
    module.train()
    first = float(module(x[:32], t[:32]))
    opt.step()
    module.lazy_reset_grad()
    criterion = {"mse": torch.nn.MSELoss(), "cross-entropy": torch.nn.CrossEntropyLoss(),
                 "bce": torch.nn.BCEWithLogitsLoss()}[loss]
    torch_loss = criterion(net(torch.from_numpy(x[:32])), torch.from_numpy(t[:32]))
    torch_loss.backward()
    assert first == pytest.approx(torch_loss.item(), rel=1e-5)
    with torch.no_grad():
        for p in net.head.parameters():
            p -= 1e-3 * p.grad
    trained = dict(net.named_parameters())
    for name, p in state.parameters:
        if name.startswith("enc."):
            np.testing.assert_array_equal(p.data, reference[name].numpy(), err_msg=name)
        elif optimizer == "sgd":
            np.testing.assert_allclose(p.data, trained[name].detach().numpy(), rtol=1e-5, atol=1e-7, err_msg=name)
        else:
            step = p.data - reference[name].numpy()
            assert np.all(np.sign(step) * np.sign(trained[name].grad.numpy()) <= 0), name

    opt.set_learning_rate(0.05)
    for _ in range(3):
        for start in range(0, len(x), 32):
            module(x[start:start + 32], t[start:start + 32])
            opt.step()
            module.lazy_reset_grad()
    module.eval()
    assert float(module(x, t)) < before


def test_freeze_prefix_matching_everything_exits(tmp_path):
    _export(tmp_path, 1)
    with pytest.raises(SystemExit, match="nothing left to train"):
        main([str(tmp_path / "toy.onnx"), "-o", str(tmp_path / "a"), "--freeze-prefix", "enc.",
              "--freeze-prefix", "head."])
