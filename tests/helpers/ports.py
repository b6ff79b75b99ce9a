"""A free loopback port, for a server or a tcp bind (a module of its own: the transport
tests take it without importing the HTTP stack)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
