"""Safe writes: atomic files and directories, locks, a full disk as an error, content hashes.

Everything vlctl writes goes through here, so the guarantees are made in one place:

* Atomic. A file is written under a temporary sibling name, fsynced and renamed over the target;
  a directory is built under `.NAME.<random>.tmp` and renamed into place (`atomic_dir`). A crash
  leaves the old state or the new one, never half of either.
* Kill-safe swaps. Replacing an existing directory takes two renames; a kill between them leaves
  no target, but a complete `.NAME.<random>.new` (the new state) or `.NAME.<random>.old` (the old
  one) beside it. `recover_dir`, called by every writer before it starts and by the readers when
  the target is missing, renames it back into place with a message, and removes the temporary
  entries of dead processes.
* One writer at a time. A writer holds an exclusive `fcntl.flock` on `.NAME.lock` beside its
  target for the whole write (`locked`); a second writer waits, saying so, or fails at once under
  `--no-wait` (`set_output_policy(wait=False)`). Readers take no lock: every commit is a rename.
* Never destroying what vlctl did not write. `atomic_dir` writes into an existing directory only
  when it holds a vlctl artefact of the same kind, known by its marker file (a JSON file whose
  "format" names vlctl: config.json of an estimator, meta.json of a dataset, ...); anything else
  is refused unless `--overwrite` (`set_output_policy(overwrite=True)`), and then only the entries
  vlctl writes are replaced, everything else is kept.
* A full disk is an error. ENOSPC becomes one VlctlError naming the path and the bytes needed, and
  the temporary output is removed; memory-mapped outputs reserve their blocks first
  (`open_memmap`), so a full disk cannot kill the process with SIGBUS halfway through.

The primitives these rest on -- the error type, the output policy, the locks and the renames,
fsyncs and large writes through the fault-injection hook (VLCTL_FAULT) -- are in `vlctl.fsops`,
imported from there.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import gc
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from vlctl.fsops import (
    DiskFullError,
    LockBusyError,
    VlctlError,
    fsync,
    fsync_dir,
    is_private,
    locked,
    mark_private,
    no_space_error,
    output_policy,
    replace,
    space,
    umask,
)
from vlctl.progress import say

__all__ = [
    "ContentChangedError",
    "atomic_dir",
    "atomic_save_npz",
    "atomic_save_safetensors",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "check_content",
    "check_file",
    "clean_dead_temps",
    "fast_hash_file",
    "hash_state_dict",
    "open_memmap",
    "read_json",
    "read_text_utf8",
    "recover_dir",
    "sha256_bytes",
    "sha256_file",
    "sha256_json",
]


# --- atomic files --------------------------------------------------------------------------------


def _tmp_sibling(path: Path) -> Path:
    """A new empty file next to `path`, with the mode a plain open() would give it.

    mkstemp creates 0600 files whatever the umask; the file is renamed into place, so that mode
    would become the output's: set the usual 0666 & ~umask instead.
    """
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~umask())
    finally:
        os.close(fd)
    return Path(tmp)


def _atomic_file(path: str | os.PathLike, needed: int, write: Callable[[Any], None]) -> Path:
    """Write `path` through `write(f)` into a temporary sibling, fsync it and rename it over."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = None
    try:
        tmp = _tmp_sibling(path)
        with open(tmp, "wb") as f:
            space(tmp, needed, lambda: write(f))
            f.flush()
            fsync(f)
        replace(tmp, path)
    except BaseException as e:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and (err := no_space_error(e, path, needed)):
            raise err from None
        raise
    return path


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    return _atomic_file(path, len(data), lambda f: f.write(data))


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n")


def _json_default(o: Any) -> Any:
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def gc_paused(fn: Callable) -> Callable:
    """Run `fn` with Python's cyclic garbage collector paused (then as it was). A loader builds millions of
    small lists and dicts, none of them in a cycle, and every gen-2 collection meanwhile rescans all of
    them: the cost grows with the square of their count (COCO's 113k-image Karpathy train split loaded in
    6.3 s of CPU with it, 1.9 s without; its tenth in 0.30 and 0.20 s)."""

    @functools.wraps(fn)
    def paused(*args, **kwargs):
        was = gc.isenabled()
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            if was:
                gc.enable()

    return paused


@gc_paused
def read_json(path: str | os.PathLike, what: str = "JSON file") -> Any:
    """Read JSON, turning a missing or corrupt file into a VlctlError that names it."""
    path = Path(path)
    if not path.is_file():
        raise VlctlError(f"{path}: {what} not found")
    try:
        return json.loads(path.read_text("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise VlctlError(f"{path}: corrupt {what} ({e})") from None


def atomic_save_npz(path: str | os.PathLike, **arrays: np.ndarray) -> Path:
    needed = sum(np.asarray(a).nbytes for a in arrays.values())
    return _atomic_file(path, needed, lambda f: np.savez(f, **arrays))


def merged_npz(paths: list[Path]) -> dict[str, np.ndarray]:
    """The arrays of several .npz files in one dict; a name in several keeps the first file's array."""
    out: dict[str, np.ndarray] = {}
    for path in paths:
        with np.load(path) as arr:
            for k in arr.files:
                out.setdefault(k, arr[k])
    return out


def atomic_save_safetensors(path: str | os.PathLike, tensors: dict, metadata: dict[str, str] | None = None) -> Path:
    """Save a dict of torch tensors as safetensors, atomically; the same tensors and metadata give
    the same bytes (so the same sha256)."""
    from safetensors.torch import save

    data = save({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, metadata=metadata)
    return atomic_write_bytes(path, _sorted_metadata(data))


def _sorted_metadata(data: bytes) -> bytes:
    """safetensors bytes with the header's __metadata__ keys in sorted order: safetensors writes
    that map in the random order of a Rust HashMap, so two saves of one model differed in bytes."""
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    if "__metadata__" not in header:
        return data
    header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)  # the data stays 8-byte aligned, as safetensors pads it
    return len(text).to_bytes(8, "little") + text + data[8 + n :]


def _allocate(fd: int, size: int) -> None:
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
        # A file system without fallocate: at least refuse what cannot fit now.
        if shutil.disk_usage(f"/proc/self/fd/{fd}").free < size:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)) from None


def open_memmap(path: str | os.PathLike, dtype: Any, shape: tuple[int, ...]) -> np.memmap:
    """A new .npy file memory-mapped for writing (np.lib.format.open_memmap, mode "w+"), its
    blocks reserved on disk first (posix_fallocate).

    numpy makes the file sparse; on a full disk the first page the kernel cannot back kills the
    process with SIGBUS, leaving the temporary output behind. With the blocks reserved, a full disk
    is a VlctlError here, before any work, naming the file and the bytes it needs.
    """
    path = Path(path)
    needed = int(np.prod(shape)) * np.dtype(dtype).itemsize
    arr = None
    try:
        arr = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=tuple(shape))
        needed = path.stat().st_size
        fd = os.open(path, os.O_RDWR)
        try:
            space(path, needed, lambda: _allocate(fd, needed))
        finally:
            os.close(fd)
    except OSError as e:
        del arr
        path.unlink(missing_ok=True)
        if err := no_space_error(e, path, needed):
            raise err from None
        raise
    return arr


# --- directories ---------------------------------------------------------------------------------

Kind = tuple[str, str, str | None]  # (marker file, its "format", its "class" or None)
PARTIAL = ".vlctl-partial.json"  # in a directory while entries are merged into it (see atomic_dir)


def _leftovers(path: Path) -> list[Path]:
    """Temporary entries of writes of `path` beside it: `.NAME.<8 random>.tmp|new|old`."""
    pat = re.compile(rf"^\.{re.escape(path.name)}\.[a-z0-9_]{{8}}\.(tmp|new|old)$")
    try:
        names = os.listdir(path.parent)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [path.parent / n for n in sorted(names) if pat.match(n)]


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)


def recover_dir(path: str | os.PathLike) -> bool:
    """Finish what a killed write of directory `path` left: if `path` is missing, rename a complete
    `.new` (else `.old`) beside it into place, saying so; then delete the temporary entries of
    writes whose process is dead. Returns True when `path` was restored. Cheap when there is
    nothing to do (one directory listing); takes the lock of `path` otherwise."""
    path = Path(os.path.abspath(path))
    if not _leftovers(path):
        return False
    with locked(path, wait=True):
        left = _leftovers(path)  # again, under the lock: a live writer has finished by now
        restored = None
        if not path.exists():
            for suffix in (".new", ".old"):
                found = sorted((p for p in left if p.suffix == suffix), key=lambda p: p.stat().st_mtime_ns)
                if found:
                    restored = found[-1]
                    replace(restored, path)
                    fsync_dir(path.parent)
                    what = "the new version (its write was killed after it was complete)" if suffix == ".new" \
                        else "the previous version (a write was killed while replacing it)"
                    say(f"{path}: restored {what} from {restored.name}")
                    break
        rest = [p for p in left if p != restored]
        for p in rest:
            _remove(p)
        if rest and restored is None:
            say(f"{path}: removed {len(rest)} temporary entr{'y' if len(rest) == 1 else 'ies'} of a killed write")
    return restored is not None


def clean_dead_temps(directory: str | os.PathLike) -> None:
    """`recover_dir` every target in `directory` that has temporary entries and no live writer
    (its lock is free): the leftovers of killed runs, e.g. `.KEY.*.tmp` in an embedding cache."""
    pat = re.compile(r"^\.(.+)\.[a-z0-9_]{8}\.(tmp|new|old)$")
    try:
        names = {m.group(1) for m in map(pat.match, os.listdir(directory)) if m}
    except FileNotFoundError:
        return
    for name in sorted(names):
        with contextlib.suppress(LockBusyError), locked(Path(directory) / name, wait=False):
            recover_dir(Path(directory) / name)


def _kinds(d: Path) -> set[Kind]:
    """The vlctl markers at the top of `d`: (file, format, class) of each JSON object file whose
    "format" names vlctl."""
    out: set[Kind] = set()
    for name in (n for n in os.listdir(d) if n.endswith(".json")):
        with contextlib.suppress(OSError, ValueError):
            doc = json.loads((d / name).read_text("utf-8"))
            if isinstance(doc, dict) and isinstance(doc.get("format"), str) and "vlctl" in doc["format"]:
                out.add((name, doc["format"], doc["class"] if isinstance(doc.get("class"), str) else None))
    if (d / PARTIAL).is_file():  # a merge was interrupted: the directory still is what it was becoming
        with contextlib.suppress(OSError, ValueError, TypeError):
            out |= {tuple(k) for k in json.loads((d / PARTIAL).read_text("utf-8"))["kinds"]}
    return out


def _describe(kinds: set[Kind] | None) -> str:
    if not kinds:
        return "vlctl output"
    name, fmt, cls = min(kinds, key=str)
    return f"{fmt}{'/' + cls if cls else ''} ({name})"


def _refusal(path: Path, want: str, found: set[Kind]) -> VlctlError:
    entries = sorted(os.listdir(path))
    has = f"holds a {_describe(found)}, not a {want}" if found else \
        f"holds {len(entries)} entries vlctl did not write (e.g. {', '.join(entries[:3])})"
    return VlctlError(f"{path}: exists and {has}; refusing to write into it. Choose another output directory, "
                      "or pass --overwrite to replace only vlctl's own entries in it (everything else is kept)")


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike, exist_ok: bool = True, *, kind: Kind | None = None,
               overwrite: bool | None = None, legacy: Callable[[Path], bool] | None = None) -> Iterator[Path]:
    """Build a directory under a temporary name; put it at `path` only if the block succeeds.

    Yields the temporary directory to write into; write the marker file (the JSON whose "format"
    says what the directory is) last. The whole write holds the lock of `path`.

    An existing `path` (exist_ok=False: refused) must be an empty directory or hold a vlctl
    artefact of the same kind: `kind` = (marker file, format, class or None) when the caller knows
    it (checked before the block runs), else the markers of the new directory (a directory with no
    markers at all then counts as the same kind); `legacy(path)` True also says it is one (written
    by a vlctl before its marker named its format). Anything else is refused unless `overwrite`
    (default: the output policy, i.e. --overwrite).

    Committing: a missing target is one rename. An artefact of the same kind holding nothing else
    is swapped whole (the new directory renamed to `.new`, the old one to `.old`, the new one into
    place: `recover_dir` finishes a swap killed between the renames). Otherwise the new entries are
    merged in, each replacing the entry of that name, the marker files removed first and written
    last, and every other entry is kept (and named on stderr).
    """
    path = Path(os.path.abspath(path))
    overwrite = output_policy().overwrite if overwrite is None else overwrite
    with contextlib.ExitStack() as stack:
        if not is_private(path):
            stack.enter_context(locked(path))
            recover_dir(path)
        if path.exists():
            if not path.is_dir():
                raise VlctlError(f"{path}: exists and is not a directory; choose another output path")
            if any(path.iterdir()):
                if not exist_ok:
                    raise VlctlError(f"{path}: already exists")
                found = _kinds(path) if kind else None
                if kind and not overwrite and kind not in found and not (legacy and legacy(path)):
                    raise _refusal(path, _describe({kind}), found)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
        os.chmod(tmp, 0o777 & ~umask())  # mkdtemp makes 0700; the directory is renamed into place
        mark_private(tmp)
        try:
            yield tmp
            mark_private(tmp, False)
            _commit(tmp, path, kind, overwrite, legacy)
        except DiskFullError as e:  # name the output, not its temporary directory
            mark_private(tmp, False)
            shutil.rmtree(tmp, ignore_errors=True)
            raise DiskFullError(str(e).replace(str(tmp), str(path))) from None
        except BaseException:
            mark_private(tmp, False)
            shutil.rmtree(tmp, ignore_errors=True)
            raise


def _commit(tmp: Path, path: Path, kind: Kind | None, overwrite: bool, legacy: Callable[[Path], bool] | None) -> None:
    if not path.exists() or not any(path.iterdir()):
        replace(tmp, path)  # onto nothing, or onto an empty directory: one rename
        fsync_dir(path.parent)
        return
    new_kinds = {kind} if kind else _kinds(tmp)
    old_kinds = _kinds(path) | ({kind} if kind and legacy and legacy(path) else set())
    # Without a kind from the caller, a directory without markers may be written over by name.
    same = bool(new_kinds & old_kinds) or (kind is None and not old_kinds)
    if not same and not overwrite:
        raise _refusal(path, _describe(new_kinds), old_kinds)
    old, new = set(os.listdir(path)) - {PARTIAL}, set(os.listdir(tmp))
    if same and old <= new:
        ready = tmp.with_name(tmp.name.removesuffix(".tmp") + ".new")
        aside = tmp.with_name(tmp.name.removesuffix(".tmp") + ".old")
        replace(tmp, ready)
        replace(path, aside)
        replace(ready, path)
        fsync_dir(path.parent)
        shutil.rmtree(aside, ignore_errors=True)
        return
    # Merge: the directory holds entries this write does not produce; they stay.
    atomic_write_json(path / PARTIAL, {"kinds": sorted(new_kinds, key=str)})
    markers = sorted(k[0] for k in new_kinds if k[0] in new)
    for name in markers:
        (path / name).unlink(missing_ok=True)  # first: no reader takes the mix for a complete artefact
    for name in sorted(new - set(markers)) + markers:
        _replace_entry(tmp / name, path / name)
    (path / PARTIAL).unlink(missing_ok=True)
    fsync_dir(path)
    shutil.rmtree(tmp, ignore_errors=True)
    kept = sorted(old - new)
    say(f"{path}: replaced {len(new)} entr{'y' if len(new) == 1 else 'ies'} vlctl writes; kept {len(kept)} "
        f"other{'s' if len(kept) != 1 else ''}: {', '.join(kept[:5])}{', ...' if len(kept) > 5 else ''}")


def _replace_entry(src: Path, dst: Path) -> None:
    for p in _leftovers(dst):  # of a merge killed while it replaced this entry
        _remove(p)
    if dst.is_dir() and not dst.is_symlink():
        aside = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", suffix=".old", dir=dst.parent))
        os.rmdir(aside)
        replace(dst, aside)
        replace(src, dst)
        shutil.rmtree(aside, ignore_errors=True)
        return
    if src.is_dir() and (dst.exists() or dst.is_symlink()):
        dst.unlink()
    replace(src, dst)


# --- hashes --------------------------------------------------------------------------------------

FAST_FULL = 1 << 20  # files up to this size are hashed whole by fast_hash_file
FAST_BLOCKS, FAST_BLOCK = 64, 1 << 14  # larger ones: 64 blocks of 16 KiB, evenly spaced


def fast_hash_file(path: str | os.PathLike) -> str:
    """A hash cheap enough to check on every open: blake2b-128 of the file's size and of its
    content -- all of it up to FAST_FULL bytes, else FAST_BLOCKS blocks of FAST_BLOCK bytes at
    evenly spaced offsets, the first and the last block included (1 MiB read whatever the size).
    A change of size or of any sampled byte changes it; `vlctl verify` does the full check."""
    size = os.path.getsize(path)
    h = hashlib.blake2b(size.to_bytes(8, "little"), digest_size=16)
    with open(path, "rb") as f:
        if size <= FAST_FULL:
            h.update(f.read())
        else:
            step = (size - FAST_BLOCK) / (FAST_BLOCKS - 1)
            for i in range(FAST_BLOCKS):
                f.seek(round(i * step))
                h.update(f.read(FAST_BLOCK))
    return h.hexdigest()


class ContentChangedError(VlctlError):
    """A file's content is not what the manifest that names it records."""


def check_file(file: Path, size: int | None, source: Path, what: str) -> None:
    """Refuse `file` unless it exists with the `size` that `source` records (None: not recorded)."""
    if not file.is_file():
        raise VlctlError(f"{file}: {what} named in {source} is missing")
    actual = file.stat().st_size
    if size is not None and actual != size:
        raise VlctlError(f"{file}: {actual} bytes, but {source} records {size} (truncated or overwritten)")


def check_content(file: Path, fast: str | None, sha256: str | None, source: Path) -> None:
    """Refuse `file` unless its fast hash is the one `source` records (None: not recorded, by an
    older vlctl). A mismatch is confirmed with the full sha256 when one is recorded."""
    if fast is None or fast_hash_file(file) == fast:
        return
    which = "hash"
    if sha256 is not None:
        if sha256_file(file) == sha256:
            return  # only the sampled blocks' hash was stale: the content is the recorded one
        which = "sha256"
    raise ContentChangedError(f"{file}: {which} differs from {source} (the file was changed or corrupted after it was "
                     "written); rebuild it")


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_json(obj: Any) -> str:
    """Hash of a JSON-serialisable object, independent of key order."""
    return sha256_bytes(json.dumps(obj, sort_keys=True, default=_json_default).encode())


def hash_state_dict(state: dict) -> str:
    """Content hash of a torch state dict: names, dtypes, shapes and bytes, in sorted order."""
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().cpu().contiguous()
        h.update(name.encode())
        h.update(str(t.dtype).encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.view(-1).view(dtype=__import__("torch").uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def read_text_utf8(path: str | os.PathLike, what: str = "text file") -> str:
    """A user's text file, read as UTF-8 (a leading byte-order mark dropped). A missing or unreadable
    file, or bytes that are not UTF-8, is a VlctlError naming the file, `what` it is and the byte
    offset of the first bad byte."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise VlctlError(f"{path}: {what} not found") from None
    except IsADirectoryError:
        raise VlctlError(f"{path}: is a directory, expected a {what}") from None
    except OSError as e:
        raise VlctlError(f"{path}: cannot read the {what} ({e.strerror or e})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise VlctlError(f"{path}: not UTF-8 at byte {e.start} (0x{data[e.start]:02x}) of the {what}; vlctl reads "
                         "text files as UTF-8") from None
    return text.removeprefix("\ufeff")
