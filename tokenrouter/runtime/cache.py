"""The on-disk cache (`$TOKENROUTER_CACHE`, default `~/.cache/tokenrouter`): its root, the
entries of converted models, a file lock and atomic JSON writes for what processes share there.

A model entry is a Hugging Face checkpoint folder. Entries are keyed by what they were made from (a source file's path, size and mtime, or a
generation recipe) plus `FORMAT_VERSION`, so a changed source or converter never serves stale
weights. Each entry is built in a temporary folder and renamed into place, which is atomic: two
subservers loading the same model at once either both build it (one rename wins, the other is
thrown away) or one finds it ready.

Other parts of the runtime keep their own files under the root (the C kernels' builds, the
measured kernel plans and attention choices): `write_json` replaces a file atomically, so a
concurrent reader never sees half of it, and `locked` serialises the processes that would
otherwise measure the same thing at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from typing import Any, Callable, Iterator

FORMAT_VERSION = 1

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
    os.makedirs(cache_root(), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{slug}-", dir=cache_root())
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


@contextlib.contextmanager
def locked(lock_path: str | None) -> Iterator[None]:
    """An exclusive lock on the file `lock_path` (created, with its folder) for the duration of
    the block; nothing without a path. Every process that takes the same path waits its turn."""
    if not lock_path:
        yield
        return
    os.makedirs(os.path.dirname(lock_path), exist_ok=True)
    with open(lock_path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def write_json(path: str, data: dict) -> None:
    """Write `data` as JSON at `path` atomically (concurrent processes share the cache)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)  # atomic: a concurrent reader never reads half a file
