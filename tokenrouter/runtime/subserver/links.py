"""A subserver's sockets, and the threads that own them (ZeroMQ sockets are not thread-safe,
`transport/sockets.py`): the `Receiver` of the writer's address (the messaging loop), `out`
to the frontend and the peers (the decoding loop), `reply` to the frontend (the messaging
loop's answers to `stats`) and the heartbeat thread's own socket.

The heartbeat tells the frontend this process is alive, and what its decoding loop did
(`progress.py`; the frontend judges it, `frontend/liveness.py`), while its messaging loop
runs: a process that can no longer hear the frontend stops beating, so it is declared down
and replaced. The thread needs nothing of the decoding loop, so a long step never delays it.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

import zmq

from tokenrouter.runtime.subserver.setup import SubserverSpec
from tokenrouter.runtime.transport.security import Security, check_bind, stop_authenticator
from tokenrouter.runtime.transport.sockets import Receiver, Sender
from tokenrouter.runtime.transport.wire import FRONTEND

log = logging.getLogger(__name__)

HEARTBEAT_S = 0.5


class Links:
    """`peers`: where `out` sends (the transport policy's addresses: the frontend and the
    peers, or only the frontend); `ctx`: a ZeroMQ context to share (thread mode), else one
    of its own, ended by `close`."""

    def __init__(self, spec: SubserverSpec, peers: dict[str, str], ctx=None):
        self.writer = spec.writer
        self.address = spec.addresses[spec.writer]
        self._ctx = ctx or zmq.Context()
        self._own_ctx = ctx is None
        self.security = Security.load(spec.curve_keys, spec.insecure_tcp, spec.curve_pair)
        check_bind(self.address, self.security)  # before `ready`: a clear start-up error
        sec, front = self.security, {FRONTEND: spec.addresses[FRONTEND]}
        self.out = Sender(self._ctx, peers, sec)  # decoding loop only
        self.reply = Sender(self._ctx, front, sec)  # messaging loop only
        self._beat = Sender(self._ctx, front, sec)  # heartbeat thread only
        self._beating = threading.Event()

    def listen(self, on_frame: Callable[[bytes], None], on_refused: Callable[[], None]) -> None:
        """Bind the writer's address and start the messaging loop."""
        self.receiver = Receiver(self._ctx, self.address, on_frame, name=f"msg-{self.writer}",
                                 security=self.security, on_refused=on_refused)

    def start_heartbeat(self, frame: Callable[[], bytes]) -> None:
        """Send `frame()` (the encoded heartbeat, as of now) every `HEARTBEAT_S` while the
        messaging loop runs."""
        self._beat_thread = threading.Thread(target=self._heartbeat, args=(frame,), name=f"beat-{self.writer}",
                                             daemon=True)
        self._beat_thread.start()

    def _heartbeat(self, frame: Callable[[], bytes]) -> None:
        while not self._beating.wait(HEARTBEAT_S):
            if not self.receiver.alive:
                log.error("%s: the messaging loop stopped; no more heartbeats", self.writer)
                return
            self._beat.send(FRONTEND, frame())

    def close(self) -> None:
        """Stop the heartbeat and the messaging loop, close every socket (and end the context
        when it is this one's own)."""
        self._beating.set()
        self._beat_thread.join(5)
        self.receiver.stop()
        self.out.close()
        self.reply.close()
        self._beat.close()
        if self._own_ctx:
            stop_authenticator(self._ctx)
            self._ctx.term()
