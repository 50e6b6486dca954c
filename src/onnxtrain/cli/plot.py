"""The training-curve PNG (needs matplotlib: `pip install 'onnxtrain[plot]'`)."""

from __future__ import annotations

import os

__all__ = ["write_curve", "have_matplotlib"]


def have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def write_curve(records: list[dict], path: str, title: str = "") -> bool:
    """Plot loss (and metrics, on a second panel) per epoch from metrics.jsonl records; False without matplotlib."""
    if not have_matplotlib():
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epochs = [r for r in records if "epoch" in r and "train_loss" in r]
    if not epochs:
        return False
    metric_names = sorted({k.removeprefix("train_") for r in epochs for k in r
                           if k.startswith("train_") and k != "train_loss"})
    fig, axes = plt.subplots(1, 2 if metric_names else 1, figsize=(10 if metric_names else 5.5, 3.8), squeeze=False)
    x = [r["epoch"] for r in epochs]
    ax = axes[0][0]
    for split in ("train", "val"):
        ys = [r.get(f"{split}_loss") for r in epochs]
        if any(y is not None for y in ys):
            ax.plot(x, ys, marker="o", label=f"{split} loss")
    ax.set_xlabel("epoch")
    ax.set_ylabel("loss")
    ax.grid(alpha=0.3)
    ax.legend()
    if metric_names:
        ax = axes[0][1]
        for name in metric_names:
            for split, style in (("train", "-"), ("val", "--")):
                ys = [r.get(f"{split}_{name}") for r in epochs]
                if any(y is not None for y in ys):
                    ax.plot(x, ys, style, marker="o", label=f"{split} {name}")
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
        ax.legend()
    if title:
        fig.suptitle(title)
    save_figure(fig, path)
    return True


def save_figure(fig, path: str) -> None:
    """Lay out, write to a temporary file beside ``path`` and rename it over ``path``; close the figure."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    tmp = f"{path}.tmp.png"
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, path)
