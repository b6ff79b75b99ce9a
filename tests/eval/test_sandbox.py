"""The sandbox against hostile completions: each one must fail (or, for a program that exits 0
after starting a daemon, leave nothing behind), and the host must be untouched: the files, a
listening socket, the process table and a sentinel process are checked after each run.

Every test runs against the strongest sandbox this host has (`auto`: bubblewrap where it
works); the ones the fallback also promises run against `plain` too. A test whose guarantee
the chosen sandbox does not give here is skipped with the reason (its warning), never run
unconfined: a fork bomb or a kill of the parent outside a sandbox would hit the host.
"""

import os
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

import tokenrouter
from tokenrouter.eval.sandbox import Limits, open_sandbox

pytestmark = pytest.mark.slow
REPO = Path(tokenrouter.__file__).resolve().parents[1]
FAST = Limits(timeout_s=4.0, cpu_s=3)


def box_or_skip(mechanism: str, limits: Limits = FAST):
    try:
        return open_sandbox(limits, mechanism, log=lambda m: None)
    except RuntimeError as exc:
        pytest.skip(str(exc))


@pytest.fixture(params=["auto", "plain"])
def box(request):
    return box_or_skip(request.param)


@pytest.fixture
def strong():
    b = box_or_skip("auto")
    if b.mechanism != "bwrap" and not b.switch_uid:
        pytest.skip(f"no isolated sandbox here: {'; '.join(b.warnings)}")
    return b


def tagged(tag: str) -> list[int]:
    """Pids of the processes whose command line holds `tag` (the sandbox passes it as argv[1])."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if tag.encode() in Path(f"/proc/{d}/cmdline").read_bytes():
                    out.append(int(d))
            except OSError:
                pass
    return out


def run(box, source: str):
    tag = f"hostile-{uuid.uuid4().hex[:12]}"
    outcome = box.run(textwrap.dedent(source), tag)
    time.sleep(0.2)  # the kernel reaps a killed namespace asynchronously
    assert tagged(tag) == [], f"processes of {tag} outlived their run"
    return outcome


def test_a_program_passes_or_fails_by_its_exit_status(box):
    assert run(box, "assert sorted([3, 1, 2]) == [1, 2, 3]\n").status == "passed"
    o = run(box, "def f():\n    return 1\nassert f() == 2, 'wrong'\n")
    assert o.status == "failed" and o.detail == "AssertionError: wrong"


def test_an_infinite_loop_is_stopped_by_its_limits(box):
    t0 = time.perf_counter()
    o = run(box, "while True:\n    pass\n")
    assert o.status == "timeout" or (o.status == "failed" and o.detail == "CPU time limit"), o
    assert time.perf_counter() - t0 < FAST.timeout_s + 5


def test_a_sleeping_program_is_killed_at_the_wall_clock_timeout(box):
    o = run(box, "import time\ntime.sleep(3600)\n")
    assert o.status == "timeout" and "wall-clock" in o.detail
    assert o.seconds < FAST.timeout_s + 3


def test_memory_growth_fails_at_the_memory_limit(box):
    o = run(box, "x = []\nwhile True:\n    x.append(bytearray(64 << 20))\n")
    assert o.status == "failed" and "MemoryError" in o.detail, o


def test_environment_secrets_are_not_passed_in(box, monkeypatch):
    monkeypatch.setenv("TOKENROUTER_TEST_SECRET", "hunter2")
    o = run(box, "import os\nprint(os.environ['TOKENROUTER_TEST_SECRET'])\n")
    assert o.status == "failed" and "KeyError" in o.detail


def test_a_network_call_fails_and_reaches_nothing(box):
    if not (box.mechanism == "bwrap" or box.unshare_net):
        pytest.skip("; ".join(box.warnings))
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        listener.settimeout(0.5)
        port = listener.getsockname()[1]
        o = run(box, f"""
            import socket
            socket.create_connection(("127.0.0.1", {port}), timeout=2).sendall(b"exfiltrated")
        """)
        assert o.status == "failed" and ("ConnectionRefused" in o.detail or "unreachable" in o.detail), o
        with pytest.raises(socket.timeout):
            listener.accept()
    o = run(box, 'import socket\nsocket.create_connection(("1.1.1.1", 53), timeout=2)\n')
    assert o.status == "failed"


@pytest.mark.parametrize("where", ["repo", "home", "test_folder", "tmp"])
def test_writing_outside_its_folder_fails(strong, tmp_path, where):
    name = f"pwned-{uuid.uuid4().hex[:8]}"
    target = {"repo": REPO, "home": Path.home(), "test_folder": tmp_path, "tmp": Path("/tmp")}[where] / name
    try:
        o = run(strong, f"open({str(target)!r}, 'w').write('x')\n")
        assert not target.exists()
        if where == "tmp" and strong.mechanism == "bwrap":
            assert o.passed  # its /tmp is a private tmpfs, gone with it
        else:
            assert o.status == "failed", o
    finally:
        target.unlink(missing_ok=True)


def test_deleting_or_reading_a_file_outside_its_folder_fails(strong, tmp_path):
    canary = tmp_path / "canary.txt"
    canary.write_text("secret")
    canary.chmod(0o644)
    assert run(strong, f"import os\nos.remove({str(canary)!r})\n").status == "failed"
    assert run(strong, f"print(open({str(canary)!r}).read())\n").status == "failed"
    assert canary.read_text() == "secret"


def test_its_own_folder_is_writable(box):
    assert run(box, "open('scratch.txt', 'w').write('x')\nassert open('scratch.txt').read() == 'x'\n").passed


def test_a_fork_bomb_fails_and_leaves_no_process(strong):
    t0 = time.perf_counter()
    o = run(strong, "import os\nwhile True:\n    os.fork()\n")
    assert not o.passed
    assert time.perf_counter() - t0 < FAST.timeout_s + 5


def test_killing_its_parent_or_another_process_fails(strong):
    sentinel = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        o = run(strong, f"""
            import os
            os.kill(os.getppid(), 9)
            os.kill({sentinel.pid}, 9)
            os.kill({os.getpid()}, 9)
        """)
        assert o.status == "failed", o
        assert sentinel.poll() is None, "the sentinel process was killed"
    finally:
        sentinel.kill()
        sentinel.wait()


def test_a_daemon_it_leaves_behind_is_killed(strong):
    o = run(strong, """
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(600)
    """)  # run() checks that no process of it is left
    assert o.status == "passed"


def test_programs_run_in_parallel_in_order(box):
    outs = box.run_all(["pass\n", "raise SystemExit(3)\n", "import time\ntime.sleep(0.2)\n", "1/0\n"],
                       workers=2, use_tqdm=False)
    assert [o.status for o in outs] == ["passed", "failed", "passed", "failed"]
    assert outs[1].detail == "exit status 3" and "ZeroDivisionError" in outs[3].detail


def test_the_run_folder_is_removed(box):
    before = {p for p in os.listdir("/tmp") if p.startswith("tokenrouter-sandbox-")}
    run(box, "open('left.txt', 'w').write('x')\nimport os\nos.chmod('.', 0o500)\n")
    after = {p for p in os.listdir("/tmp") if p.startswith("tokenrouter-sandbox-")}
    assert after <= before


def test_a_missing_bubblewrap_is_a_warning_naming_the_install(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on it
    warned = []
    box = open_sandbox(Limits(timeout_s=4.5), "auto", log=warned.append)
    assert box.mechanism == "plain"
    assert any("bubblewrap (bwrap) is not installed" in w and "apt-get install bubblewrap" in w for w in warned)
    assert box.describe()["warnings"] == box.warnings and box.run("pass\n").passed
