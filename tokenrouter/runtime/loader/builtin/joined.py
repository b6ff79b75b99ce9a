"""A file that is only ever seen whole and verified: bytes are streamed into a temporary file,
counted and hashed on the way, and `commit` gives it its final name (an atomic rename on the
same filesystem) only when its size and sha256 are the expected ones.

    out = JoinedFile(tmp_path, Expected(size, sha256, "model.gguf"), progress)
    for stream in parts:
        out.append(stream)
    out.commit(final_path)          # VerifyError, and the temporary file removed, on a mismatch

A `JoinedFile` that is not committed (an error, Ctrl-C) removes its temporary file in `abort`
(`with JoinedFile(...)` does it on the way out); so no file under the final name is ever
partial. A process killed outright leaves its temporary file in the folder its caller made
for it, which the caller sweeps (`pypi.py`: the cache's abandoned-build sweep).
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from dataclasses import dataclass
from typing import BinaryIO

from tokenrouter.runtime.loader.errors import LoadError

log = logging.getLogger(__name__)

CHUNK = 1 << 20
MB = 1e6


class VerifyError(LoadError):
    """Bytes that are not the expected file (size or sha256), or a part that is missing."""


@dataclass(frozen=True)
class Expected:
    size: int
    sha256: str
    what: str  # the file's name, for messages

    def check(self, size: int, digest: str, where: str) -> None:
        """VerifyError unless (`size`, `digest`) are this file's; `where` names the bytes checked."""
        if size != self.size:
            raise VerifyError(f"{where} holds {size:,} bytes, but {self.what} has {self.size:,}: not the file")
        if digest != self.sha256:
            raise VerifyError(f"{where} has sha256 {digest}, but {self.what} has {self.sha256}: not the file")


class Progress:
    """One INFO line `LABEL: DOING X of Y MB (S s)` at most every `every_s` seconds, and a last
    one; `say` puts another line of the same step on the same clock."""

    def __init__(self, label: str, total: int, every_s: float = 3.0, doing: str = "read"):
        self.label, self.total, self.every_s, self.doing = label, total, every_s, doing
        self.t0 = self.last = time.monotonic()

    def update(self, done: int, final: bool = False) -> None:
        if final or self.due():
            self.say(f"{self.doing} {done / MB:.1f} of {self.total / MB:.1f} MB")

    def due(self) -> bool:
        return time.monotonic() - self.last >= self.every_s

    def say(self, text: str) -> None:
        self.last = time.monotonic()
        log.info("%s: %s (%.0f s)", self.label, text, self.last - self.t0)


def sha256_file(path: str, progress: Progress | None = None) -> str:
    """The sha256 of the file at `path`, read in chunks (progress as it goes)."""
    h, done = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            done += len(chunk)
            if progress:
                progress.update(done)
    if progress:
        progress.update(done, final=True)
    return h.hexdigest()


class JoinedFile:
    """See the module docstring."""

    def __init__(self, tmp_path: str, expected: Expected, progress: Progress | None = None):
        self.tmp_path, self.expected, self.progress = tmp_path, expected, progress
        self.hash = hashlib.sha256()
        self.size = 0
        self.f: BinaryIO | None = open(tmp_path, "xb")

    def __enter__(self) -> "JoinedFile":
        return self

    def __exit__(self, *exc) -> None:
        self.abort()

    def append(self, stream: BinaryIO) -> int:
        """Copy `stream` to the end of the file; the number of bytes it gave."""
        assert self.f is not None, "append after commit or abort"
        n = 0
        while chunk := stream.read(CHUNK):
            self.f.write(chunk)
            self.hash.update(chunk)
            n += len(chunk)
            self.size += len(chunk)
            if self.size > self.expected.size:  # no point writing on: it cannot be the file
                raise VerifyError(f"the joined parts hold more than {self.expected.size:,} bytes, "
                                  f"the size of {self.expected.what}: not the file")
            if self.progress:
                self.progress.update(self.size)
        return n

    def commit(self, final: str) -> str:
        """Check size and sha256, then rename the file to `final` (replacing what is there);
        VerifyError (and nothing renamed, the temporary file removed) on a mismatch."""
        assert self.f is not None, "commit after commit or abort"
        if self.progress:
            self.progress.update(self.size, final=True)
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()
        self.f = None
        try:
            self.expected.check(self.size, self.hash.hexdigest(), "the joined parts")
            os.chmod(self.tmp_path, 0o444)  # weights are read, never written in place
            os.replace(self.tmp_path, final)
        except BaseException:
            self.abort()
            raise
        return final

    def abort(self) -> None:
        """Close and remove the temporary file (nothing when it was committed)."""
        if self.f is not None:
            self.f.close()
            self.f = None
        try:
            os.remove(self.tmp_path)
        except FileNotFoundError:
            pass
