"""Crash-safe file writes for every artifact (one implementation, shared with the checkpoint writer)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from onnxtrain.checkpoint.atomic import StagedWrite, fsync_directory
from onnxtrain.checkpoint.atomic import atomic_write as atomic_write_bytes

__all__ = ["atomic_write_bytes", "StagedFiles", "PROTO_LIMIT", "directory_for_writing"]

# Protobuf cannot serialize a message of 2 GB or more, and onnx's checker takes a model in memory only below it.
PROTO_LIMIT = 1 << 31

_WORKERS = 4  # generate_artifacts writes four files

Data = bytes | bytearray | memoryview | Sequence[bytes | bytearray | memoryview]


class StagedFiles:
    """Files written as one set, each as :func:`atomic_write_bytes` would, on background threads.

    :meth:`stage` hands a file's bytes (or a function computing them) to a worker thread, which writes and
    fsyncs them to a temporary file beside the target while the caller goes on (file writes, fsync and hashing
    release the GIL; files fsync'ed in parallel share the file system's journal commits). :meth:`commit` waits
    for the workers, renames every file onto its target in staging order and fsyncs each directory once.
    Leaving the ``with`` block by an exception, or :meth:`discard`, removes the temporary files: every target
    keeps its old content.
    """

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(_WORKERS, thread_name_prefix="onnxtrain-write")
        self._staged: list[Future[StagedWrite]] = []

    def stage(self, path: str | os.PathLike[str], data: Data | Callable[[], Data], wait: bool = False) -> None:
        """Queue ``path``'s content; ``wait`` blocks until it is written (so that large bytes can be dropped)."""
        future = self._pool.submit(lambda: StagedWrite(path, data() if callable(data) else data))
        self._staged.append(future)
        if wait:
            future.result()

    def commit(self) -> None:
        """Rename every staged file onto its target; raises the first staging error (nothing renamed then)."""
        staged = [future.result() for future in self._staged]
        for file in staged:
            file.commit()
        self._staged = []
        for directory in dict.fromkeys(file.directory for file in staged):
            fsync_directory(directory)

    def discard(self) -> None:
        """Remove every staged file (waiting for the worker first); the targets are untouched."""
        staged, self._staged = self._staged, []
        for future in staged:
            if future.exception() is None:  # a file that failed to stage removed its temporary file itself
                future.result().discard()

    def __enter__(self) -> StagedFiles:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.discard()
        self._pool.shutdown(wait=True)


@contextlib.contextmanager
def directory_for_writing(path: str) -> Iterator[None]:
    """Create the folder ``path`` (and missing parents) for the block's writes; if the block raises, remove the
    folders it created that are still empty, so that a failed write leaves no trace."""
    created = []
    folder = os.path.abspath(path)
    while not os.path.isdir(folder):
        created.append(folder)
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    os.makedirs(path, exist_ok=True)
    try:
        yield
    except BaseException:
        for folder in created:  # innermost first
            try:
                os.rmdir(folder)  # only if empty
            except OSError:
                break
        raise
