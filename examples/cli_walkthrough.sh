#!/usr/bin/env bash
# The onnxtrain command line, step by step, on scikit-learn's digits (about 20 seconds).
#   bash examples/cli_walkthrough.sh [WORKDIR]
# Needs: pip install -e '.[cli]'   (and '.[plot]' for the training-curve PNG)
set -euo pipefail
work=${1:-onnxtrain-walkthrough}
mkdir -p "$work" && cd "$work"

# 1. A model and a CSV file of data. Any ONNX model works; this one is the demo's CNN.
python - <<'PY'
import onnx
from sklearn.datasets import load_digits
from onnxtrain.demo.model import build_cnn

onnx.save(build_cnn(seed=0), "cnn.onnx")
digits = load_digits()
with open("digits.csv", "w") as f:
    f.write(",".join(f"p{i}" for i in range(64)) + ",digit\n")
    for row, label in zip(digits.data, digits.target):
        f.write(",".join(str(int(v)) for v in row) + f",{label}\n")
PY

# 2. Convert the CSV into the dataset file that train and eval read (x: [N, 1, 8, 8] in [0, 1], y: int64).
onnxtrain data digits.csv -o digits.npz --shape 1,8,8 --scale 16 --num-classes 10

# 3. Training artifacts, with the training recipe stored inside them.
onnxtrain generate cnn.onnx -o artifacts --loss cross-entropy --optimizer adamw --weight-decay 0.01 \
    --epochs 5 --batch-size 32 --lr 3e-3 --scheduler cosine --val-split 0.1
onnxtrain info artifacts

# 4. Train (the stored options apply; the command line overrides them), evaluate, export.
onnxtrain train artifacts --data digits.npz --restart
onnxtrain eval artifacts --data digits.npz --checkpoint best
onnxtrain export artifacts -o digits_cnn.onnx --checkpoint best
onnxtrain info digits_cnn.onnx

# 5. Fine-tune only the classifier head of the trained model (the last 3 ops), as on a device.
onnxtrain generate digits_cnn.onnx -o head --loss cross-entropy --trainable-ops 3 --epochs 3 --lr 1e-3
onnxtrain train head --data digits.npz --val-split 0.2 --restart
