"""Replace a file atomically: a crash at any moment leaves the old complete file or the new complete one.

The bytes go to a temporary file in the target's directory (same file system, so the rename is atomic),
which is flushed and fsync'ed, renamed onto the target with ``os.replace``, and then the directory is
fsync'ed so the rename itself survives a power loss. On any error the temporary file is removed. Only a
hard crash (power loss, SIGKILL) mid-write can leave a ``.<name>.<random>.tmp`` file behind; the target
is intact either way, and the next save or load of the target removes such leftovers
(:func:`clear_stale_temps`): on POSIX a writer holds an advisory lock on its temporary file until the
rename, so a file nobody holds is a dead writer's.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import re
import secrets
import time
from collections.abc import Sequence

try:
    import fcntl
except ImportError:  # Windows: no advisory locks, so leftovers are never judged stale
    fcntl = None

__all__ = ["atomic_write", "StagedWrite", "fsync_directory", "clear_stale_temps"]

try:
    _IOV_MAX = max(16, os.sysconf("SC_IOV_MAX"))  # 1024 on Linux and macOS; POSIX guarantees 16
except (AttributeError, ValueError, OSError):
    _IOV_MAX = 16

# A temporary file younger than this is never removed: its writer may not have locked it yet.
_GRACE_SECONDS = 5.0


def atomic_write(path: str | os.PathLike[str],
                 data: bytes | bytearray | memoryview | Sequence[bytes | bytearray | memoryview]) -> None:
    """Write ``data`` (bytes, or a sequence of pieces written one after the other) to ``path`` atomically and
    durably (see the module docstring).

    Raises:
        IsADirectoryError: ``path`` is a directory.
        FileNotFoundError: the directory of ``path`` does not exist.
        OSError: any other I/O failure; the old file at ``path``, if any, is untouched.
    """
    staged = StagedWrite(path, data)
    staged.commit()
    fsync_directory(staged.directory)


class StagedWrite:
    """The first half of :func:`atomic_write`, for files replaced together: ``data`` is written to a temporary
    file beside ``path``, flushed and fsync'ed (and locked: a live writer's). :meth:`commit` renames it onto
    ``path``, after which the caller fsyncs the directory, once for several files (:func:`fsync_directory`);
    :meth:`discard` removes it and leaves ``path`` untouched. Raises as :func:`atomic_write` does."""

    def __init__(self, path: str | os.PathLike[str],
                 data: bytes | bytearray | memoryview | Sequence[bytes | bytearray | memoryview]):
        self.target = os.path.abspath(os.fspath(path))
        self.directory, name = os.path.split(self.target)
        if os.path.isdir(self.target):
            raise IsADirectoryError(errno.EISDIR, "cannot save over a directory", self.target)
        if not os.path.isdir(self.directory):
            raise FileNotFoundError(errno.ENOENT, "cannot save: the directory does not exist", self.directory)
        clear_stale_temps(self.target)
        try:
            self._temp, fd = _create_temp(self.directory, name)
        except OSError as exc:  # named after the file the caller asked for, not the temporary one beside it
            raise OSError(exc.errno, f"{exc.strerror}: cannot write beside it in {self.directory} "
                          f"({self._untouched()})", self.target) from exc
        self._open = contextlib.ExitStack()  # the temporary file, open (and locked) until the rename
        try:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_EX)  # held until the rename: this file has a live writer
            _keep_mode(fd, self.target)
            self._file = self._open.enter_context(os.fdopen(fd, "wb"))
            _write_pieces(self._file, [data] if isinstance(data, bytes | bytearray | memoryview) else data)
            os.fsync(self._file.fileno())
            if fcntl is None:  # Windows cannot rename a file that is open
                self._open.close()
        except OSError as exc:
            self.discard()
            if exc.filename is None and exc.errno is not None:  # a write or fsync error (a full disk) names no file
                raise OSError(exc.errno, f"{exc.strerror} ({self._untouched()})", self.target) from exc
            raise
        except BaseException:
            self.discard()
            raise

    def _untouched(self) -> str:
        """What a failed write left of the target, for its error message."""
        return "the file is unchanged" if os.path.exists(self.target) else "nothing was written"

    def commit(self) -> None:
        """Rename the temporary file onto the target (not yet durable: fsync the directory next)."""
        try:
            os.replace(self._temp, self.target)
        except BaseException:
            self.discard()
            raise
        self._open.close()

    def discard(self) -> None:
        """Remove the temporary file; the target keeps its old content."""
        self._open.close()
        with contextlib.suppress(OSError):
            os.unlink(self._temp)


def clear_stale_temps(path: str | os.PathLike[str]) -> list[str]:
    """Remove the ``.<name>.<random>.tmp`` files beside ``path`` that no live writer holds (a crashed save's
    leftovers); returns their paths. Files that cannot be inspected or removed are left alone."""
    if fcntl is None:
        return []
    directory, name = os.path.split(os.path.abspath(os.fspath(path)))
    pattern = re.compile(rf"\.{re.escape(name)}\.[0-9a-f]{{8}}\.tmp")
    try:
        entries = [e for e in os.listdir(directory) if pattern.fullmatch(e)]
    except OSError:
        return []
    removed = []
    for entry in entries:
        temp = os.path.join(directory, entry)
        try:
            fd = os.open(temp, os.O_RDONLY)
        except OSError:
            continue
        try:
            if time.time() - os.fstat(fd).st_mtime < _GRACE_SECONDS:
                continue
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # fails while a live writer holds it
            os.unlink(temp)
            removed.append(temp)
        except OSError:
            continue
        finally:
            os.close(fd)
    return removed


def _write_pieces(file: io.BufferedWriter,
                  pieces: Sequence[bytes | bytearray | memoryview]) -> None:
    """Write the pieces one after the other and flush. Where the platform has ``writev``, up to ``IOV_MAX``
    pieces go in one call: every write gives the GIL up, and a thread that gives it up once per piece (a
    checkpoint has one per tensor) waits for it once per piece while another thread runs Python."""
    views = [memoryview(piece).cast("B") for piece in pieces]
    views = [view for view in views if view.nbytes]
    if not hasattr(os, "writev"):
        for view in views:
            file.write(view)
        file.flush()
        return
    file.flush()
    fd, first = file.fileno(), 0
    while first < len(views):
        written = os.writev(fd, views[first:first + _IOV_MAX])
        while first < len(views) and written >= views[first].nbytes:
            written -= views[first].nbytes
            first += 1
        if written:  # a short write: the rest of this piece goes in the next call
            views[first] = views[first][written:]


def _keep_mode(fd: int, target: str) -> None:
    """A replaced file keeps its permission bits (a read-only or private checkpoint stays so)."""
    with contextlib.suppress(FileNotFoundError):
        mode = os.stat(target).st_mode & 0o7777
        if hasattr(os, "fchmod"):
            os.fchmod(fd, mode)


def _create_temp(directory: str, name: str) -> tuple[str, int]:
    """Create a new, empty temporary file next to the target. Mode 0o666 lets the umask decide the
    permissions, as for an ordinary new file (``tempfile.mkstemp`` would force 0o600)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        temp = os.path.join(directory, f".{name}.{secrets.token_hex(4)}.tmp")
        try:
            return temp, os.open(temp, flags, 0o666)
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "could not find a free temporary file name", directory)


def fsync_directory(directory: str) -> None:
    """Make the rename durable. Windows cannot open directories, and some file systems refuse to sync them;
    there the rename is as durable as the platform allows."""
    if os.name == "nt":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)
