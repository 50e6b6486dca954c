"""Flat storage: every trainable parameter (or gradient, or optimizer state) is a view into one contiguous
vector, so the optimizer updates them all with a dozen vector ops. Double-buffered storage has a second vector
that receives each update, and the two swap roles, so nothing is copied between steps and an update can be
thrown away; the second vector is allocated when it is first asked for, so storage that is only ever updated
in place (an optimizer graph bound in place, the gradients) holds one vector (docs/memory.md)."""

from __future__ import annotations

import mmap
import sys
from collections.abc import Sequence

import numpy as np

__all__ = ["FlatStorage"]

# Linux gives an anonymous private mapping's pages back on MADV_DONTNEED and reads them as zeros afterwards
# (macOS may keep the old bytes, so elsewhere a slot is zeroed by filling it)
_RELEASE = (sys.platform.startswith("linux") and hasattr(mmap, "MADV_DONTNEED") and hasattr(mmap, "MAP_ANONYMOUS"))


class FlatStorage:
    """Flat vectors (``current`` and ``spare``) and a view per named slot into each.

    Args:
        layout: (name, shape) of each slot, in order.
        dtype: element type of every slot.
        copies: 2 (double-buffered: the spare vector is allocated on first use of :attr:`spare`) or 1 (``spare``
            is ``current`` and :meth:`swap` does nothing).
        releasable: with one copy, on Linux, the vector is an anonymous mapping whose pages :meth:`zero` gives
            back to the system: a slot that a training step writes a few rows of (an embedding's gradient,
            scattered) is then resident only for those rows (reading a page never written costs no memory).
    """

    def __init__(self, layout: Sequence[tuple[str, tuple[int, ...]]], dtype: np.dtype, copies: int = 2,
                 releasable: bool = False):
        if copies not in (1, 2):
            raise ValueError(f"FlatStorage holds 1 or 2 copies of its vector, got copies={copies}")
        self.layout = [(n, tuple(s)) for n, s in layout]
        self.dtype = np.dtype(dtype)
        self.sizes = [int(np.prod(s)) for _, s in self.layout]  # elements per slot, in layout order
        self.offsets = dict(zip((n for n, _ in self.layout), np.cumsum([0, *self.sizes[:-1]]).tolist()))
        self.size = int(sum(self.sizes))
        self._copies = copies
        self._map = None
        if releasable and copies == 1 and _RELEASE and self.size:
            self._map = mmap.mmap(-1, self.size * self.dtype.itemsize, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            self._vectors = [np.frombuffer(self._map, self.dtype, count=self.size)]
        else:
            self._vectors = [np.zeros(self.size, self.dtype)]
        self._views = [self._make_views(self._vectors[0])]
        self._current = 0
        self._chunks: dict[tuple, list[np.ndarray]] = {}

    def _make_views(self, vector: np.ndarray) -> dict[str, np.ndarray]:
        views = {}
        for name, shape in self.layout:
            start = self.offsets[name]
            views[name] = vector[start:start + int(np.prod(shape))].reshape(shape)
        return views

    @property
    def copies(self) -> int:
        """How many vectors this storage holds now (1, or 2 once a double buffer's spare was asked for)."""
        return len(self._vectors)

    @property
    def nbytes(self) -> int:
        """Bytes held by the vectors."""
        return sum(v.nbytes for v in self._vectors)

    @property
    def current(self) -> np.ndarray:
        return self._vectors[self._current]

    def _spare_index(self) -> int:
        if self._copies == 2 and len(self._vectors) == 1:
            self._vectors.append(np.zeros(self.size, self.dtype))
            self._views.append(self._make_views(self._vectors[1]))
        return (self._current + 1) % len(self._vectors)

    @property
    def spare(self) -> np.ndarray:
        return self._vectors[self._spare_index()]

    def views(self) -> dict[str, np.ndarray]:
        """Views of the current vector by slot name."""
        return self._views[self._current]

    def spare_views(self) -> dict[str, np.ndarray]:
        return self._views[self._spare_index()]

    def chunks(self, bounds: Sequence[tuple[int, int]], spare: bool = False) -> list[np.ndarray]:
        """Views of the current (or spare) vector's slices ``[start:stop]``, the same objects on every call (so
        a session's bindings of them are reused)."""
        index = self._spare_index() if spare else self._current
        key = (index, tuple(bounds))
        if key not in self._chunks:
            self._chunks[key] = [self._vectors[index][a:b] for a, b in bounds]
        return self._chunks[key]

    def zero(self, name: str) -> None:
        """Fill slot ``name`` of the current vector with zeros; in a releasable vector, its whole pages are given
        back to the system instead (they read as zeros)."""
        view = self.views()[name].reshape(-1)
        if self._map is None:
            view.fill(0)
            return
        page, item = mmap.PAGESIZE, self.dtype.itemsize
        start = self.offsets[name] * item
        stop = start + view.size * item
        first, last = -(-start // page) * page, stop // page * page
        if last <= first:
            view.fill(0)
            return
        self._map.madvise(mmap.MADV_DONTNEED, first, last - first)
        view[:(first - start) // item].fill(0)
        view[(last - start) // item:].fill(0)

    def swap(self) -> None:
        """The spare vector (just written) becomes current."""
        self._current = self._spare_index()

    def __contains__(self, name: str) -> bool:
        return name in self.offsets
