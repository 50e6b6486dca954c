"""Accuracy after the same number of steps: LoRA vs the classifier head vs every layer, on the demo's task.

    python bench/lora_digits.py [--epochs 12] [--seed 0]

The demo's CNN (conv 16, conv 32, fc 64, fc 10) is pre-trained on scikit-learn's digits, then personalized
on one user's slanted, bold, offset handwriting (200 digits; accuracy on 200 held-out ones) with AdamW, batch 16,
lr 3e-3, the same steps for every variant. The convolutions are 3x3, so the adapters go on the two fully
connected layers (Gemm). Prints a markdown table; not a test.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np

from onnxtrain.api import CheckpointState, Module, Optimizer
from onnxtrain.artifacts import LoRA, LossType, OptimType, generate_artifacts
from onnxtrain.demo.digits import load_demo_data
from onnxtrain.demo.model import OUTPUT, build_cnn

VARIANTS = {  # name -> generate_artifacts keyword arguments
    "every layer": {},
    "head (fc1, fc2)": {"requires_grad": ["fc1.*", "fc2.*"]},
    "LoRA r=4 on fc1, fc2": {"lora": LoRA(rank=4, alpha=8, targets=["fc1.weight", "fc2.weight"])},
    "LoRA r=4 on fc1 + fc2 trained": {"lora": LoRA(rank=4, alpha=8, targets=["fc1.weight"]),
                                      "requires_grad": ["fc2.*"]},
}


def train(directory: str, x: np.ndarray, y: np.ndarray, epochs: int, batch: int, lr: float, seed: int) -> Module:
    state = CheckpointState.load_checkpoint(os.path.join(directory, "checkpoint"))
    module = Module(os.path.join(directory, "training_model.onnx"), state, os.path.join(directory, "eval_model.onnx"))
    optimizer = Optimizer(os.path.join(directory, "optimizer_model.onnx"), module)
    optimizer.set_learning_rate(lr)
    rng = np.random.default_rng(seed)
    module.train()
    for _ in range(epochs):
        order = rng.permutation(len(x))
        for i in range(0, len(x) - batch + 1, batch):
            module(x[order[i:i + batch]], y[order[i:i + batch]])
            optimizer.step()
            module.lazy_reset_grad()
    return module


def accuracy(module: Module, x: np.ndarray, y: np.ndarray) -> float:
    module.eval()
    return float(np.mean(module(x, y)[1].argmax(axis=1) == y))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=12, help="personalization epochs (13 steps each)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    data = load_demo_data(args.seed)
    common = {"loss": LossType.CrossEntropyLoss, "optimizer": OptimType.AdamW, "additional_output_names": [OUTPUT]}
    with tempfile.TemporaryDirectory() as tmp:
        generate_artifacts(build_cnn(args.seed), artifact_directory=os.path.join(tmp, "server"), **common)
        server = train(os.path.join(tmp, "server"), data.global_train.x, data.global_train.y, 5, 32, 3e-3, args.seed)
        pretrained = os.path.join(tmp, "pretrained.onnx")
        server.export_model_for_inferencing(pretrained, [OUTPUT])
        steps = args.epochs * (len(data.user_train.x) // 16)
        global_accuracy = accuracy(server, data.global_val.x, data.global_val.y)
        print(f"pre-trained: global validation accuracy {100 * global_accuracy:.1f} %; personalization: {steps} "
              "steps\n")
        print("| what trains | trainable parameters | user accuracy before | after |")
        print("|---|---|---|---|")
        for name, kwargs in VARIANTS.items():
            directory = os.path.join(tmp, name.replace(" ", "_"))
            generate_artifacts(pretrained, artifact_directory=directory, **common, **kwargs)
            state = CheckpointState.load_checkpoint(os.path.join(directory, "checkpoint"))
            count = sum(p.data.size for _, p in state.parameters if p.requires_grad)
            before = accuracy(Module(os.path.join(directory, "training_model.onnx"), state,
                                     os.path.join(directory, "eval_model.onnx")), data.user_test.x, data.user_test.y)
            module = train(directory, data.user_train.x, data.user_train.y, args.epochs, 16, 3e-3, args.seed)
            after = accuracy(module, data.user_test.x, data.user_test.y)
            print(f"| {name} | {count:,} | {100 * before:.1f} % | {100 * after:.1f} % |")


if __name__ == "__main__":
    main()
