"""Files under faults: a read-only cache that holds everything serves; a model build that is
interrupted (SIGTERM, or kill -9) leaves no temporary folder behind; `tokenrouter serve`
exits with a distinct status for each way it can end."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time

import httpx
import pytest

from tests.helpers import tiny
from tests.helpers.ports import free_port
from tests.helpers.serving import CLI, stop, wait_until_healthy

pytestmark = pytest.mark.slow  # every test here takes seconds: the fast tier (-m "not slow") skips them


def _serve(route, pair, port, env, prefix=(), **popen):
    cmd = [*prefix, *CLI, "serve", str(route), "--port", str(port), "--model", f"slm={pair['slm']}",
           "--model", f"llm={pair['llm']}", "--num-blocks", "64"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, **popen)


def _can_mount_read_only(tmp_path) -> str | None:
    """None if this process may make a private mount namespace with a read-only bind mount."""
    if shutil.which("unshare") is None:
        return "no `unshare` command"
    d = tmp_path / "probe"
    d.mkdir()
    r = subprocess.run(["unshare", "-m", "sh", "-c", f"mount --bind -o ro {d} {d} && touch {d}/x"],
                       capture_output=True, text=True)
    if "Read-only file system" in r.stderr:
        return None
    return f"cannot mount read-only here: {r.stderr.strip() or r.returncode}"


def test_a_read_only_cache_that_holds_everything_serves(pair, tmp_path):
    why = _can_mount_read_only(tmp_path)
    if why is not None:
        pytest.skip(why)
    tiny.example_program("demo", str(tmp_path), pair, dtype="float32")  # float32: kernel plans are measured
    cache = tmp_path / "cache"
    env = {**os.environ, "TOKENROUTER_CACHE": str(cache)}
    url = None
    for read_only in (False, True):  # the first run fills the cache; the second cannot write to it
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        prefix = ("unshare", "-m", "sh", "-c", f'mount --bind -o ro "{cache}" "{cache}" && exec "$@"', "sh") \
            if read_only else ()
        proc = _serve(tmp_path / "demo.route", pair, port, env, prefix)
        try:
            wait_until_healthy(proc, url, timeout_s=180)
            r = httpx.post(url + "/v1/completions", json={"prompt": "read only", "max_tokens": 8}, timeout=60)
            assert r.status_code == 200, r.text
        finally:
            status = stop(proc, 60)
        out = proc.stdout.read()
        assert status in (0, 128 + signal.SIGINT) and "Traceback" not in out, out  # SIGINT: uvicorn re-raises it
        if not read_only:
            assert any(cache.rglob("*.json")), "the first run kept nothing in the cache"


def test_ctrl_c_stops_serve_and_its_subservers_without_a_traceback(pair, tmp_path):
    tiny.example_program("demo", str(tmp_path), pair, dtype="float32")
    port = free_port()
    env = {**os.environ, "TOKENROUTER_CACHE": str(tmp_path / "cache")}
    proc = _serve(tmp_path / "demo.route", pair, port, env, start_new_session=True)  # a group of its own
    try:
        wait_until_healthy(proc, f"http://127.0.0.1:{port}", timeout_s=180)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: every process of the group
        status = proc.wait(60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    out = proc.stdout.read()
    assert status in (0, 128 + signal.SIGINT), out
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out
    deadline = time.monotonic() + 10
    while True:  # the subservers end too
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        assert time.monotonic() < deadline, "a subserver outlived serve"
        time.sleep(0.1)


BUILD = textwrap.dedent("""
    import os, signal, sys, time
    from tokenrouter.runtime import cache
    from tokenrouter.runtime.subserver.process import exit_on_sigterm
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    def build(folder):
        open(os.path.join(folder, "half.bin"), "wb").write(b"x" * 1000)
        print("building", flush=True)
        time.sleep(60)
    cache.get_or_build("gguf-test", {"n": 1}, build)
""")


def _building(env):
    p = subprocess.Popen([sys.executable, "-c", BUILD], stdout=subprocess.PIPE, text=True, env=env)
    assert p.stdout.readline().strip() == "building"
    return p


def test_an_interrupted_build_leaves_no_temporary_folder(tmp_path):
    env = {**os.environ, "TOKENROUTER_CACHE": str(tmp_path)}

    def leftovers():
        return [n for n in os.listdir(tmp_path) if n.startswith(".gguf-test-")]

    p = _building(env)
    assert len(leftovers()) == 1
    p.send_signal(signal.SIGTERM)  # how a stopped serve ends its subservers
    assert p.wait(30) == 128 + signal.SIGTERM
    assert leftovers() == []
    p = _building(env)
    p.kill()  # no chance to clean up: the next build removes what it left
    p.wait(30)
    assert len(leftovers()) == 1
    q = _building(env)
    assert len(leftovers()) == 1  # the dead one's folder is gone, the live one's is there
    q.kill()
    q.wait(30)


def test_serve_exit_statuses_are_distinct(pair, tmp_path):
    tiny.example_program("demo", str(tmp_path), pair)
    route = tmp_path / "demo.route"
    models = ["--model", f"slm={pair['slm']}", "--model", f"llm={pair['llm']}"]
    # 1: the program has errors (a router weights path that is a folder is E311, before any process)
    bad = tmp_path / "bad.route"
    bad.write_text(textwrap.dedent(f"""\
        tokenrouter 1
        model slm = "{pair['slm']}"
        model llm = "{pair['llm']}"
        router r on slm = "{tmp_path}" {{
          inputs = [topk_logits(4), entropy(normalized)]
          arch = r2r
        }}
        route {{
          start slm
          slm -> llm when r >= 0.5 rewrite
          visit llm max 1 then slm
        }}
        """))
    r = subprocess.run(CLI + ["serve", str(bad)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "E311" in r.stderr and "is a folder" in r.stderr and "Traceback" not in r.stderr
    # 2: a bad argument
    r = subprocess.run(CLI + ["serve", str(route), "--max-queue", "-1", *models], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "--max-queue" in r.stderr
    # 4: did not start (the port is taken)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = subprocess.run(CLI + ["serve", str(route), "--port", str(port), "--num-blocks", "64", *models],
                           capture_output=True, text=True, timeout=180)
    assert r.returncode == 4, r.stderr[-2000:]
    # 3: restarts exhausted while serving (test_cli.py's end-to-end test)
