"""File-system primitives under every vlctl write (see `vlctl.io` for what is built on them):
the error type, the output policy (--overwrite, --no-wait), the renames, fsyncs and large writes
through the fault-injection hook, and the writers' locks.

Fault injection, for the tests: every rename, fsync and large write goes through `replace`,
`fsync`/`fsync_dir` and `space`. With VLCTL_FAULT=OP:N (OP = replace or fsync) the process kills
itself with SIGKILL right before the N-th such call, with VLCTL_FAULT=OP:N:after right after it;
with VLCTL_FAULT=enospc:N the N-th large write fails with ENOSPC. VLCTL_FAULT_LOG=FILE appends one
line "OP N PATH" per call, which is how a test counts the kill points of a command.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import os
import shutil
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from vlctl.progress import say


class VlctlError(Exception):
    """An error caused by the user's input (a bad file, a mismatched checkpoint, ...).

    The CLI prints these as one line without a traceback; the message names the file, the field
    and the problem.
    """


class LockBusyError(VlctlError):
    """Another process holds the lock, and the caller (or --no-wait) said not to wait."""


class DiskFullError(VlctlError):
    """No space left on the device (ENOSPC or a full quota) for a write; the message names the
    path and the bytes it needs."""


# --- the output policy: --overwrite and --no-wait ------------------------------------------------


@dataclasses.dataclass
class OutputPolicy:
    """overwrite: write into an existing directory that is not a vlctl artefact of the same kind
    (replacing only vlctl's own entries); wait: wait for another writer's lock (else fail)."""

    overwrite: bool = False
    wait: bool = True


_POLICY = OutputPolicy()


def output_policy() -> OutputPolicy:
    return _POLICY


def set_output_policy(overwrite: bool | None = None, wait: bool | None = None) -> OutputPolicy:
    """Set the process's policy (the CLI does, from --overwrite and --no-wait); returns it."""
    if overwrite is not None:
        _POLICY.overwrite = bool(overwrite)
    if wait is not None:
        _POLICY.wait = bool(wait)
    return _POLICY


# --- the primitives every write goes through (and the fault-injection hook) ---------------------

FAULT_ENV, FAULT_LOG_ENV = "VLCTL_FAULT", "VLCTL_FAULT_LOG"
_calls: dict[str, int] = {}  # op -> calls so far in this process


def _hooked(op: str, target: Any, call: Callable[[], Any]) -> Any:
    """Run `call`, the N-th `op` ("replace", "fsync" or "space") of this process, under VLCTL_FAULT."""
    n = _calls[op] = _calls.get(op, 0) + 1
    if log := os.environ.get(FAULT_LOG_ENV):
        with open(log, "a", encoding="utf-8") as f:
            f.write(f"{op} {n} {target}\n")
    kind, _, rest = os.environ.get(FAULT_ENV, "").partition(":")
    number, _, when = rest.partition(":")
    hit = number == str(n)
    if hit and kind == op and when in ("", "before"):
        os.kill(os.getpid(), signal.SIGKILL)
    if hit and kind == "enospc" and op == "space":
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(target))
    result = call()
    if hit and kind == op and when == "after":
        os.kill(os.getpid(), signal.SIGKILL)
    return result


def replace(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """os.replace, through the fault hook: vlctl renames nothing any other way."""
    _hooked("replace", dst, lambda: os.replace(src, dst))


def fsync(f: Any) -> None:
    """os.fsync of an open file object or descriptor, through the fault hook."""
    fd = f if isinstance(f, int) else f.fileno()
    _hooked("fsync", getattr(f, "name", fd), lambda: os.fsync(fd))


def fsync_dir(path: str | os.PathLike) -> None:
    """fsync a directory, so the renames in it survive a power loss (not only a kill)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        _hooked("fsync", path, lambda: os.fsync(fd))
    finally:
        os.close(fd)


def space(path: Any, needed: int, call: Callable[[], Any]) -> Any:
    """A write of about `needed` bytes (where ENOSPC shows), through the fault hook."""
    return _hooked("space", path, call)


def no_space_error(e: OSError, path: str | os.PathLike, needed: int | None) -> DiskFullError | None:
    """The one-line error for a full disk (ENOSPC or a full quota), None for any other OSError."""
    if e.errno not in (errno.ENOSPC, errno.EDQUOT):
        return None
    where = Path(path).parent
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        free = f", {shutil.disk_usage(where).free} bytes free"
    except OSError:
        free = ""
    size = f"{needed} bytes needed" if needed is not None else "the write did not fit"
    return DiskFullError(f"{path}: no space left on device ({size}{free}); nothing was written, free space or "
                         "choose another output path")


def umask() -> int:
    """The process umask (read by setting it and putting it back: there is no getter)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# --- locks ---------------------------------------------------------------------------------------

_held: dict[str, list] = {}  # lock file -> [fd, depth]: a lock is reentrant within the process
_private: set[str] = set()  # directories this process is building under a temporary name


def mark_private(directory: str | os.PathLike, private: bool = True) -> None:
    """Say that this process is building `directory` under a temporary name (or no longer is)."""
    (_private.add if private else _private.discard)(os.path.abspath(directory))


def lock_file(target: str | os.PathLike) -> Path:
    """The lock of `target`: `.NAME.lock` beside it (the target itself may not exist yet, or be
    swapped for a new directory while locked)."""
    target = Path(os.path.abspath(target))
    return target.parent / f".{target.name}.lock"


def is_private(target: Path) -> bool:
    s = os.path.abspath(target)
    return any(s == p or s.startswith(p + os.sep) for p in _private)


def _holder(lock: Path) -> str:
    with contextlib.suppress(OSError, ValueError):
        return f" (pid {int(lock.read_text().strip())})"
    return ""


def _acquire(lock: Path, target: Path, wait: bool) -> int:
    lock.parent.mkdir(parents=True, exist_ok=True)
    said = False
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666 & ~umask())
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if not wait:
                    raise LockBusyError(f"{target}: another vlctl process{_holder(lock)} is writing it (lock "
                                        f"{lock}); not waiting (--no-wait)") from None
                if not said:
                    say(f"{target}: another vlctl process{_holder(lock)} is writing it; waiting for it to "
                         "finish (--no-wait: fail instead)")
                    said = True
                fcntl.flock(fd, fcntl.LOCK_EX)
            # The holder deletes the lock file as it lets go: a lock on a deleted file is no lock.
            st = os.fstat(fd)
            try:
                now = os.stat(lock)
            except FileNotFoundError:
                now = None
            if now is not None and (now.st_ino, now.st_dev) == (st.st_ino, st.st_dev):
                with contextlib.suppress(OSError):  # the pid is for the waiters' message only (a full disk)
                    os.ftruncate(fd, 0)
                    os.write(fd, f"{os.getpid()}\n".encode())
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)


@contextlib.contextmanager
def locked(target: str | os.PathLike, wait: bool | None = None) -> Iterator[None]:
    """Hold the exclusive lock of `target` (a store, dataset, cache entry, run directory) for the
    block; reentrant. Another holder: wait with a message, or raise LockBusyError when `wait`
    (default: the output policy's) is False. Directories under construction by this process
    (inside an `atomic_dir`) need no lock: nobody else sees them.

    The lock is `fcntl.flock`, so it dies with its process: no stale locks after a kill.
    """
    target = Path(os.path.abspath(target))
    key = str(lock_file(target))
    if key in _held or is_private(target):
        depth = _held.get(key)
        if depth is not None:
            depth[1] += 1
        try:
            yield
        finally:
            if depth is not None:
                depth[1] -= 1
        return
    fd = _acquire(Path(key), target, _POLICY.wait if wait is None else wait)
    _held[key] = [fd, 1]
    try:
        yield
    finally:
        del _held[key]
        with contextlib.suppress(FileNotFoundError):
            os.unlink(key)  # while still holding it: see _acquire
        os.close(fd)
