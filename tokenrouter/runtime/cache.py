"""The on-disk cache (`$TOKENROUTER_CACHE`, default `~/.cache/tokenrouter`): its root, the
entries of converted models, a file lock and atomic JSON writes for what processes share there.

A model entry is a Hugging Face checkpoint folder. Entries are keyed by what they were made from (a source file's path, size and mtime, or a
generation recipe) plus `FORMAT_VERSION`, so a changed source or converter never serves stale
weights. Each entry is built in a temporary folder and renamed into place, which is atomic: two
subservers loading the same model at once either both build it (one rename wins, the other is
thrown away) or one finds it ready.

A build that is interrupted leaves nothing behind: its temporary folder is removed on the way
out (a subserver turns SIGTERM into an exit for that), and one left by a process that was
killed outright (its name carries the process id) is removed by the next build.

Other parts of the runtime keep their own files under the root (the C kernels' builds, the
measured kernel plans and attention choices): `write_json` replaces a file atomically, so a
concurrent reader never sees half of it, and `locked` serialises the processes that would
otherwise measure the same thing at once.

A read-only cache (a shared, prepared one) serves as long as it holds what is asked of it:
`locked` then locks nothing and `write_json` keeps nothing (what they guard is measured again
in memory), and a model it lacks is a `CacheError` that says so.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from typing import Any, Callable, Iterator

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
READ_ONLY = (errno.EROFS, errno.EACCES, errno.EPERM)


class CacheError(OSError):
    """The cache cannot hold what must be built (read-only, full): the message says what to do."""

log = logging.getLogger(__name__)


def cache_root() -> str:
    root = os.environ.get("TOKENROUTER_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "tokenrouter")
    return os.path.abspath(root)


def file_key(path: str) -> dict[str, Any]:
    """What identifies a source file's contents cheaply: its path, size and mtime."""
    st = os.stat(path)
    return {"path": os.path.realpath(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def entry_path(slug: str, key: dict[str, Any]) -> str:
    blob = json.dumps({"format": FORMAT_VERSION, **key}, sort_keys=True).encode()
    return os.path.join(cache_root(), f"{slug}-{hashlib.sha256(blob).hexdigest()[:16]}")


def is_cached(slug: str, key: dict[str, Any]) -> bool:
    return os.path.isfile(os.path.join(entry_path(slug, key), "config.json"))


def get_or_build(slug: str, key: dict[str, Any], build: Callable[[str], None]) -> str:
    """The entry's folder, calling `build(tmp_folder)` to fill it first if it is not there."""
    final = entry_path(slug, key)
    if os.path.isfile(os.path.join(final, "config.json")):
        return final
    try:
        os.makedirs(cache_root(), exist_ok=True)
        remove_abandoned_builds()
        tmp = tempfile.mkdtemp(prefix=f".{slug}-{os.getpid()}-", dir=cache_root())
    except OSError as exc:
        raise CacheError(exc.errno, f"the model cache {cache_root()} cannot hold {slug} ({exc.strerror}): it "
                                    f"must be built once where the cache is writable (or point "
                                    f"TOKENROUTER_CACHE at a writable folder)") from None
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is shared like ~/.cache
    t0 = time.monotonic()
    log.info("building %s into the cache (%s; once)", slug, final)
    try:
        build(tmp)
        with open(os.path.join(tmp, "cache_key.json"), "w") as f:
            json.dump({"format": FORMAT_VERSION, **key}, f, indent=1)
        try:
            os.rename(tmp, final)
        except OSError:  # another process renamed its copy first: use that one
            if not os.path.isfile(os.path.join(final, "config.json")):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("built %s in %.0f s", slug, time.monotonic() - t0)
    return final


def folder_bytes(folder: str) -> int:
    """The bytes the files under `folder` hold (0 when it is not there)."""
    total = 0
    for root, _, files in os.walk(folder):
        for fn in files:
            try:
                total += os.stat(os.path.join(root, fn)).st_size
            except OSError:  # removed while we walk (a build that finished)
                pass
    return total


def remove_abandoned_builds() -> None:
    """Remove the temporary folders of builds whose process is gone (killed mid-build): a
    build's folder is `.SLUG-PID-RANDOM` (`get_or_build`)."""
    for name in os.listdir(cache_root()):
        parts = name.split("-")
        if not name.startswith(".") or len(parts) < 3 or not parts[-2].isdigit() or len(parts[-2]) > 9:
            continue
        try:
            os.kill(int(parts[-2]), 0)
        except ProcessLookupError:
            shutil.rmtree(os.path.join(cache_root(), name), ignore_errors=True)
        except OSError:
            pass  # alive (another user's process): not ours to judge


def _open_lock(lock_path: str):
    """The lock file, open; None where the cache is read-only."""
    try:
        os.makedirs(os.path.dirname(lock_path), exist_ok=True)
        return open(lock_path, "a")
    except OSError as exc:
        if exc.errno in READ_ONLY:
            return None
        raise


@contextlib.contextmanager
def locked(lock_path: str | None) -> Iterator[None]:
    """An exclusive lock on the file `lock_path` (created, with its folder) for the duration of
    the block; nothing without a path, or where the cache is read-only (nothing is written there
    either). Every process that takes the same path waits its turn."""
    f = _open_lock(lock_path) if lock_path else None
    if f is None:
        yield
        return
    with f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def write_json(path: str, data: dict) -> None:
    """Write `data` as JSON at `path` atomically (concurrent processes share the cache); in a
    read-only cache nothing is kept (said once in the log)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, path)  # atomic: a concurrent reader never reads half a file
    except OSError as exc:
        if exc.errno not in READ_ONLY:
            raise
        log.warning("the cache is read-only: %s is not kept (%s)", path, exc.strerror)
