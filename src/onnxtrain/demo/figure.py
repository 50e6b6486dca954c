"""The demo's picture of personalization: some of the user's digits with the predictions before and after."""

from __future__ import annotations

import numpy as np

__all__ = ["write_predictions_figure"]


def write_predictions_figure(images: np.ndarray, labels: np.ndarray, before: np.ndarray, after: np.ndarray,
                             path: str, count: int = 12) -> bool:
    """A row of ``count`` digits titled "before -> after" (green when right); False without matplotlib."""
    from onnxtrain.cli.plot import have_matplotlib, save_figure

    if not have_matplotlib():
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Show the digits the personalization fixed first, then the others: the figure is about the change.
    order = np.concatenate([np.flatnonzero((before != labels) & (after == labels)),
                            np.flatnonzero(~((before != labels) & (after == labels)))])[:count]
    fig, axes = plt.subplots(1, len(order), figsize=(1.1 * len(order), 1.7), squeeze=False)
    for ax, i in zip(axes[0], order):
        ax.imshow(images[i].reshape(images.shape[-2:]), cmap="gray_r", vmin=0, vmax=1)
        ax.set_title(f"{before[i]}\u2192{after[i]}", fontsize=10, color="green" if after[i] == labels[i] else "red")
        ax.axis("off")
    fig.suptitle("the user's digits: prediction before \u2192 after personalization", fontsize=9)
    save_figure(fig, path)
    return True
