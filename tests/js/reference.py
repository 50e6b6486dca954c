"""Artifacts, data and Python reference results for the JavaScript tests (js/test/).

    python tests/js/reference.py OUT_DIR

writes, for each case (``mlp_sgd``, ``mlp_adamw``, ``cnn_sgd``, ``cnn_adamw``, ``bn_adamw``: a convolution with
BatchNorm running statistics), ``OUT_DIR/<case>/`` with the
artifacts generate_artifacts writes, the train-step model (``write_train_step_model``), ``data.safetensors``
(the batches ``x/<i>``, ``y/<i>`` and an eval batch), ``expected.ckpt`` (Python's CheckpointState after the
steps, optimizer state included) and ``reference.safetensors`` (the loss of every step, the eval loss and
outputs). ``resume/`` holds the mid-training checkpoint ``half.ckpt`` of ``cnn_adamw`` for the resume test;
``positions_slice/`` and ``positions_range/`` the artifacts of a model with a position table (size-limit errors).
``cases.json`` lists every case with its learning rate and step count. Everything is small and built in a few
seconds, so nothing large is committed: the tests call this script.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import safetensors.numpy

ROOT = Path(__file__).resolve().parents[2]

# case -> (model, optimizer, learning rate, steps, batch size)
CASES = {
    "mlp_sgd": ("mlp", "SGD", 0.1, 20, 16),
    "mlp_adamw": ("mlp", "AdamW", 0.01, 20, 16),
    "cnn_sgd": ("cnn", "SGD", 0.05, 10, 32),
    "cnn_adamw": ("cnn", "AdamW", 0.002, 10, 32),
    "bn_adamw": ("bn", "AdamW", 0.05, 8, 16),
}
RESUME_CASE = "cnn_adamw"  # Python trains half the steps and saves; JS resumes from that checkpoint


def build_model(kind: str):
    """The forward model: the tests' MLP (8 features, 4 classes), their Conv + BatchNorm model (3 classes) or the
    digits CNN of the demo."""
    if kind in ("mlp", "bn"):
        sys.path.insert(0, str(ROOT))
        from tests.models import conv_bn, mlp

        model = mlp(features=8, hidden=16, classes=4, seed=0) if kind == "mlp" else conv_bn(seed=0)
        return model, "input", "output"
    from onnxtrain.demo.model import INPUT, OUTPUT, build_cnn

    return build_cnn(seed=0), INPUT, OUTPUT


def make_batches(kind: str, steps: int, batch: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """``steps`` training batches and one eval batch (the last): learnable data, fixed seed."""
    rng = np.random.default_rng(1)
    if kind == "mlp":
        teacher = rng.standard_normal((8, 4))
        x = rng.standard_normal(((steps + 1) * batch, 8)).astype(np.float32)
        y = np.argmax(x @ teacher, axis=1).astype(np.int64)
    elif kind == "bn":  # one training batch, seen at every step (the running statistics still move), and an eval one
        x = rng.standard_normal((2 * batch, 2, 6, 6)).astype(np.float32)
        y = rng.integers(0, 3, 2 * batch)
        return [(x[:batch], y[:batch])] * steps + [(x[batch:], y[batch:])]
    else:
        from sklearn.datasets import load_digits

        digits = load_digits()
        order = rng.permutation(len(digits.target))[:(steps + 1) * batch]
        x = (digits.images[order] / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
        y = digits.target[order].astype(np.int64)
    return [(x[i * batch:(i + 1) * batch], y[i * batch:(i + 1) * batch]) for i in range(steps + 1)]


def train(folder: Path, batches, lr: float, start=None, first: int = 0, last: int | None = None):
    """Train on ``batches[first:last]`` from ``start`` (a checkpoint path; default the generated one) as a user
    of onnxtrain.api would; returns (state, module, losses)."""
    from onnxtrain.api import CheckpointState, Module, Optimizer

    state = CheckpointState.load_checkpoint(start or folder / "checkpoint")
    module = Module(folder / "training_model.onnx", state, folder / "eval_model.onnx")
    optimizer = Optimizer(folder / "optimizer_model.onnx", module)
    optimizer.set_learning_rate(lr)
    losses = []
    for x, y in batches[first:last]:
        loss, _ = module(x, y)
        optimizer.step()
        module.lazy_reset_grad()
        losses.append(float(loss))
    return state, module, losses


def write_case(out: Path, case: str) -> dict:
    from onnxtrain.api import CheckpointState
    from onnxtrain.artifacts import LossType, OptimType, generate_artifacts
    from onnxtrain.artifacts.fused import write_train_step_model

    kind, optim, lr, steps, batch = CASES[case]
    folder = out / case
    model, _, output = build_model(kind)
    generate_artifacts(model, loss=LossType.CrossEntropyLoss, optimizer=getattr(OptimType, optim),
                       artifact_directory=str(folder), additional_output_names=[output])
    write_train_step_model(folder)
    batches = make_batches(kind, steps, batch)
    data = {f"x/{i}": x for i, (x, _) in enumerate(batches)} | {f"y/{i}": y for i, (_, y) in enumerate(batches)}
    safetensors.numpy.save_file(data, str(folder / "data.safetensors"))
    state, module, losses = train(folder, batches, lr, last=steps)
    CheckpointState.save_checkpoint(state, folder / "expected.ckpt", include_optimizer_state=True)
    eval_loss, eval_output = module.eval()(*batches[steps])
    safetensors.numpy.save_file({"losses": np.array(losses, np.float32), "eval/loss": np.asarray(eval_loss),
                                 "eval/output": eval_output}, str(folder / "reference.safetensors"))
    if case == RESUME_CASE:
        (out / "resume").mkdir(exist_ok=True)
        half, _, _ = train(folder, batches, lr, last=steps // 2)
        CheckpointState.save_checkpoint(half, out / "resume" / "half.ckpt", include_optimizer_state=True)
    return {"model": kind, "optimizer": optim, "lr": lr, "steps": steps, "batch": batch, "output": output,
            "input": build_model(kind)[1]}


def write_peer_case(out: Path) -> None:
    """peer/: onnxtrain's artifacts of the model behind the onnxruntime-training checkpoint in
    tests/checkpoint/data/peer_tiny, and Python's import of that checkpoint (JavaScript must write the same bytes)."""
    from onnxtrain.artifacts import LossType, OptimType, generate_artifacts
    from onnxtrain.checkpoint import import_peer_checkpoint, save_checkpoint

    peer = ROOT / "tests" / "checkpoint" / "data" / "peer_tiny"
    folder = out / "peer"
    generate_artifacts(str(peer / "tiny.onnx"), requires_grad=["fc1.weight", "fc1.bias", "fc2.weight"],
                       frozen_params=["fc2.bias"], loss=LossType.CrossEntropyLoss, optimizer=OptimType.AdamW,
                       artifact_directory=folder)
    save_checkpoint(import_peer_checkpoint(peer / "checkpoint", folder / "checkpoint"), folder / "imported.ckpt",
                    include_optimizer_state=True)


def write_position_cases(out: Path) -> None:
    """``positions_slice/`` and ``positions_range/``: artifacts of a classifier over token and position
    embeddings whose position table has ``POSITIONS`` rows, indexed as a BERT (a slice) or a GPT-2 (a range) does
    (tests.models.position_classifier): a longer sequence fails in the engine."""
    sys.path.insert(0, str(ROOT))
    from onnxtrain.artifacts import LossType, generate_artifacts
    from tests.models import position_classifier

    for positions in ("slice", "range"):
        generate_artifacts(position_classifier(positions), requires_grad=["tokens", "positions", "fc"],
                           loss=LossType.CrossEntropyLoss, artifact_directory=out / f"positions_{positions}")


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_peer_case(out)
    write_position_cases(out)
    cases = {case: write_case(out, case) for case in CASES}
    cases["_resume"] = {"case": RESUME_CASE, "from_step": CASES[RESUME_CASE][3] // 2}
    (out / "cases.json").write_text(json.dumps(cases, indent=1))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: reference.py OUT_DIR")
    main(Path(sys.argv[1]))
