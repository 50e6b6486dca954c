"""Data for the users' scripts: scikit-learn's bundled digits in place of the MNIST/image downloads.

Imports neither onnxtrain nor onnxruntime, so the scripts can also be run against the peer (change the imports back).
"""

from __future__ import annotations

import numpy as np


def digits(n: int | None = None, features: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """(x float32 [n, features], y int64 [n]): 8x8 digit images scaled to [0, 1], zero-padded to ``features``."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = (data.data / 16.0).astype(np.float32)[:n]
    if features > x.shape[1]:
        x = np.pad(x, ((0, 0), (0, features - x.shape[1])))
    return x, data.target.astype(np.int64)[:n]


def digit_images(n: int, size: int = 32, channels: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """(images float32 [n, channels, size, size], y int64 [n]): the digits upsampled, repeated over channels."""
    x, y = digits(n)
    images = x.reshape(-1, 1, 8, 8).repeat(size // 8, axis=2).repeat(size // 8, axis=3)
    return np.ascontiguousarray(np.repeat(images, channels, axis=1)), y


def batches(x: np.ndarray, y: np.ndarray, batch_size: int):
    """Consecutive (x, y) batches, the last one possibly smaller (as a torch DataLoader without drop_last)."""
    for start in range(0, len(x), batch_size):
        yield x[start:start + batch_size], y[start:start + batch_size]
