"""HTTP connections that never finish a request cannot exhaust the server: a client silent
after connecting, one sending its headers or body a byte at a time, and 5,000 idle
connections at once (over the connection cap). Each is closed by the server in time, a
normal request is still served within 2 s, and the log stays small."""

import logging
import socket
import time

import httpx
import pytest

from tests.helpers import tiny
from tests.helpers.serving import metrics, served
from tokenrouter.runtime.launch import LaunchOptions
from tokenrouter.runtime.http.app import Limits
from tokenrouter.runtime.http.connections import ConnectionLimits

pytestmark = pytest.mark.slow  # every test here takes seconds: the fast tier (-m "not slow") skips them

LIMITS = Limits(connections=ConnectionLimits(header_timeout_s=1.0, body_timeout_s=1.5, idle_timeout_s=1.0,
                                             max_connections=2000))


@pytest.fixture(scope="module")
def srv(pair):
    with served(tiny.coin(pair, 0.3), LaunchOptions(mode="process", num_blocks=240), limits=LIMITS) as s:
        yield s


def _closed_by_server(sock: socket.socket, within: float) -> float:
    """Seconds until the server closed `sock` (its end-of-file), failing after `within`."""
    t0 = time.monotonic()
    sock.settimeout(within)
    try:
        while sock.recv(4096):
            pass
    except socket.timeout:
        pytest.fail(f"the server kept the connection open for {within} s")
    except ConnectionResetError:
        pass
    return time.monotonic() - t0


def _connect(url) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)))


def _closed(url, why):
    return metrics(url).get(("tokenrouter_http_connections_closed_total", (("reason", why),)), 0.0)


def test_silent_and_slow_clients_are_closed_in_time(srv):
    silent = _connect(srv.url)
    assert _closed_by_server(silent, 5) < 3
    slow_headers = _connect(srv.url)
    for chunk in (b"POST /v1/comp", b"letions HTTP/1.1\r\n", b"Host: x\r\n"):
        slow_headers.send(chunk)
        time.sleep(0.3)
    assert _closed_by_server(slow_headers, 5) < 3
    slow_body = _connect(srv.url)
    slow_body.send(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   b"Content-Length: 100\r\n\r\n{\"prompt\": ")
    assert _closed_by_server(slow_body, 6) < 4
    kept = _connect(srv.url)  # keep-alive after a response: closed when idle
    kept.send(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert b"200 OK" in kept.recv(4096)
    assert _closed_by_server(kept, 5) < 3
    assert _closed(srv.url, "header_timeout") >= 2 and _closed(srv.url, "body_timeout") >= 1
    for s in (silent, slow_headers, slow_body, kept):
        s.close()


def test_5000_idle_connections_do_not_keep_a_normal_request_out(srv, caplog):
    caplog.set_level(logging.WARNING)
    idle = []
    try:
        before = srv.connections.accepted
        refused_before = _closed(srv.url, "evicted") + _closed(srv.url, "header_timeout")
        for _ in range(5000):
            idle.append(_connect(srv.url))
        deadline = time.monotonic() + 60  # the server has taken every one of them
        while srv.connections.accepted < before + 5000:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        t0 = time.monotonic()
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "hello", "max_tokens": 4}, timeout=30)
        served = time.monotonic() - t0
        assert r.status_code == 200 and served < 2.0, (r.status_code, served)
        evicted = _closed(srv.url, "evicted")
        # the cap held: what it did not admit was evicted, or closed silent by the header
        # timeout first (which of the two depends on how fast this host opens 5,000 sockets)
        refused = _closed(srv.url, "evicted") + _closed(srv.url, "header_timeout") - refused_before
        assert refused >= 5000 - LIMITS.connections.max_connections
        print(f"\n5,000 idle connections: a request served in {served:.3f} s; {evicted:.0f} evicted at the cap")
    finally:
        for s in idle:
            s.close()
    assert len(caplog.records) < 50, [r.getMessage() for r in caplog.records[:5]]
