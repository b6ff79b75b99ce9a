"""A remote subserver that really is on another host: a network namespace joined to this
one by a veth pair (`ip netns`, root), the large model's subserver inside it, the frontend
and the small model's subserver outside, all traffic over CURVE-authenticated tcp on the
pair's own addresses. Greedy outputs equal the reference across it; a plain peer is
refused; after kill -9 of the remote subserver the requests in flight wait, and finish with
the reference's tokens once a new process of it reports ready.

Skipped, with the reason, where namespaces cannot be made (not root, no `ip`, no
CAP_SYS_ADMIN). Only the namespace's own link-local pair of addresses is used."""

import os
import random
import shutil
import subprocess
import time

import httpx
import pytest
import zmq

from tests.helpers import tiny
from tests.helpers.liveness import check_against_reference, ip, kill_under_load
from tests.helpers.ports import free_port
from tests.helpers.serving import CLI, ServerThread
from tokenrouter.runtime.launch import LaunchOptions
from tokenrouter.runtime.transport.security import Security, generate_keys
from tokenrouter.runtime.transport.sockets import Sender

pytestmark = pytest.mark.slow  # every test here takes seconds: the fast tier (-m "not slow") skips them


@pytest.fixture
def netns():
    """(namespace, host address, namespace address) of a fresh veth pair."""
    if shutil.which("ip") is None:
        pytest.skip("no `ip` command (iproute2) to make a network namespace")
    if os.geteuid() != 0:
        pytest.skip("making a network namespace needs root")
    tag = f"{os.getpid() % 10000}{random.randint(0, 99)}"
    ns, host_if, ns_if = f"tr16-{tag}", f"trh{tag}", f"trn{tag}"
    sub = random.randint(1, 250)
    host_ip, ns_ip = f"10.216.{sub}.1", f"10.216.{sub}.2"
    made = ip("netns", "add", ns, check=False)
    if made.returncode != 0:
        pytest.skip(f"cannot make a network namespace: {made.stderr.strip()}")
    try:
        for cmd in (["link", "add", host_if, "type", "veth", "peer", "name", ns_if],
                    ["link", "set", ns_if, "netns", ns],
                    ["addr", "add", f"{host_ip}/30", "dev", host_if],
                    ["link", "set", host_if, "up"],
                    ["netns", "exec", ns, "ip", "addr", "add", f"{ns_ip}/30", "dev", ns_if],
                    ["netns", "exec", ns, "ip", "link", "set", ns_if, "up"],
                    ["netns", "exec", ns, "ip", "link", "set", "lo", "up"]):
            r = ip(*cmd, check=False)
            if r.returncode != 0:
                pytest.skip(f"cannot set up the veth pair (ip {' '.join(cmd)}): {r.stderr.strip()}")
        yield ns, host_ip, ns_ip
    finally:
        ip("netns", "delete", ns, check=False)  # removes the pair too
        ip("link", "delete", host_if, check=False)


def test_remote_subserver_in_a_network_namespace_over_curve(pair, tmp_path, netns):
    ns, host_ip, ns_ip = netns
    keys = str(tmp_path / "keys")
    generate_keys(keys)
    program = tiny.example_program("demo", str(tmp_path), pair)
    binds = {"frontend": f"tcp://{host_ip}:{free_port()}", "slm": f"tcp://{host_ip}:{free_port()}",
             "llm": f"tcp://{ns_ip}:{free_port()}"}
    bind_args = [a for n, addr in binds.items() for a in ("--bind", f"{n}={addr}")]
    cmd = ["ip", "netns", "exec", ns, *CLI, "serve",
           str(tmp_path / "demo.route"), "--subserver", "llm", "--model", f"slm={pair['slm']}",
           "--model", f"llm={pair['llm']}", "--num-blocks", "240", "--curve-keys", keys, *bind_args]
    procs = [subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)]
    remote = procs[0]
    srv = None
    try:
        srv = ServerThread(program, LaunchOptions(mode="process", num_blocks=240, addresses=binds,
                                                  remote=("llm",), curve_keys=keys),
                           liveness={"heartbeat_timeout_s": 3.0})
        check_against_reference(srv.url, program, srv.tokenizer, ["across hosts", "another one", "x"])
        stats = srv.stats()
        assert sum(stats["llm"]["handoffs_in"].values()) > 0  # requests really crossed the pair

        # a peer without the keys reaches the port but gets nothing through
        ctx = zmq.Context()
        plain = Sender(ctx, {"llm": binds["llm"]})
        plain.send("llm", b'{"v": 1, "t": "shutdown"}')
        wrong_dir = str(tmp_path / "other")
        generate_keys(wrong_dir)
        wrong = Sender(ctx, {"llm": binds["llm"]}, Security.load(wrong_dir))
        wrong.send("llm", b'{"v": 1, "t": "shutdown"}')
        time.sleep(1.5)
        plain.close()
        wrong.close()
        ctx.term()
        assert remote.poll() is None  # still serving
        check_against_reference(srv.url, program, srv.tokenizer, ["still there"])

        def restart_remote():  # noticed by its silence; its host's supervisor starts a new one
            deadline = time.monotonic() + 10
            while httpx.get(srv.url + "/health", timeout=5).status_code == 200:
                assert time.monotonic() < deadline, "the remote's death was not noticed"
                time.sleep(0.1)
            r = httpx.get(srv.url + "/health", timeout=5)
            assert r.json()["subservers"]["llm"]["up"] is False and "no heartbeat" in r.text
            procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))

        results = kill_under_load(srv.url, remote.pid, then=restart_remote)
        assert [r[:2] for r in results] == [(200, None)] * 4, results
        check_against_reference(srv.url, program, srv.tokenizer, ["after the restart"])
    finally:
        if srv is not None:
            srv.close()
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(10)
