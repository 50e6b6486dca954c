"""The demo's data: scikit-learn's handwritten digits (1,797 8x8 images, shipped with the package), split into a
"global" population and one user whose digits all carry the same personal style.

The user's style is a fixed transform applied to each of their digits: a slant (shear), a bolder stroke
(dilation) and an offset to the right, computed at 4x resolution and pooled back to 8x8. The global model
never sees this style, so it misreads many of the user's digits until it is personalized.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from onnxtrain.data import Dataset

__all__ = ["DemoData", "load_demo_data", "user_style"]


def _load_digits():
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise ImportError("the demo needs scikit-learn for its digits data set: pip install 'onnxtrain[cli]'") from None
    return load_digits()


def user_style(images: np.ndarray, slant: float = 0.45, bold: int = 3, offset: int = 4) -> np.ndarray:
    """One writer's style: ``images`` [N, 8, 8] in [0, 1] -> [N, 8, 8] in [0, 1], slanted, bold and offset."""
    from scipy import ndimage

    out = np.empty_like(images, dtype=np.float32)
    shear = np.array([[1.0, 0.0], [slant, 1.0]])  # rows (y) stay, columns (x) move with y
    for i, image in enumerate(images):
        big = ndimage.zoom(image, 4, order=1)                      # 32x32
        centre = np.array(big.shape) / 2
        big = ndimage.affine_transform(big, shear, offset=centre - shear @ centre, order=1)
        big = ndimage.grey_dilation(big, size=(bold, bold))
        big = ndimage.shift(big, (0, offset), order=1)
        small = big.reshape(8, 4, 8, 4).mean(axis=(1, 3))
        out[i] = np.clip(small / max(float(small.max()), 1e-6), 0.0, 1.0)
    return out


@dataclass
class DemoData:
    global_train: Dataset
    global_val: Dataset
    user_train: Dataset   # the user's labelled digits on the device (the fine-tuning set)
    user_val: Dataset     # monitored during fine-tuning
    user_test: Dataset    # held out: the before/after accuracy
    user_clean: Dataset   # the user's test digits without the style (how much general skill is kept)


def load_demo_data(seed: int = 0, n_user: int = 500, n_user_train: int = 200, n_user_val: int = 100,
                   val_fraction: float = 0.1) -> DemoData:
    digits = _load_digits()
    x = (digits.images / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order], y[order]
    gx, gy, ux, uy = x[:-n_user], y[:-n_user], x[-n_user:], y[-n_user:]
    n_val = int(round(len(gx) * val_fraction))
    styled = user_style(ux)
    a, b = n_user_train, n_user_train + n_user_val
    image = lambda a: a[:, None]  # noqa: E731  [N, 8, 8] -> [N, 1, 8, 8]
    classes = [str(d) for d in range(10)]
    return DemoData(
        global_train=Dataset(image(gx[n_val:]), gy[n_val:], classes),
        global_val=Dataset(image(gx[:n_val]), gy[:n_val], classes),
        user_train=Dataset(image(styled[:a]), uy[:a], classes),
        user_val=Dataset(image(styled[a:b]), uy[a:b], classes),
        user_test=Dataset(image(styled[b:]), uy[b:], classes),
        user_clean=Dataset(image(ux[b:]), uy[b:], classes),
    )
