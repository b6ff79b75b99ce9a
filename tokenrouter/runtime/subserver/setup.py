"""What a subserver is given, what it loads before serving, and how a failed start is reported.

`SubserverSpec` is JSON-safe because it crosses the spawn boundary of a subserver process
(`launch/` makes one per writer). What a subserver loads is a `LoadedWriter`: the program,
the writer's compiled router and a `WriterEngine` (`step.py`), made by its engine's
`load_writer` (`writer_loader`: the engine the program names for the writer, looked up in
the registry, `tokenrouter/engines.py`, and imported by name, so the subserver imports no
engine above it: `runtime/native/` is tokenrouter's, `runtime/vllm/` vLLM's). When loading fails,
`report_startup_failure` sends the frontend a `ready` message carrying the error, so
`tokenrouter serve` says why instead of waiting.
"""

from __future__ import annotations

import logging
import os
import traceback
from dataclasses import asdict, dataclass
from typing import Any, Callable

import zmq

from tokenrouter import engines
from tokenrouter.compiler import ir
from tokenrouter.runtime.subserver.step import WriterEngine
from tokenrouter.runtime.transport import wire
from tokenrouter.runtime.transport.security import Security
from tokenrouter.runtime.transport.sockets import Sender

log = logging.getLogger(__name__)


@dataclass
class SubserverSpec:
    """Everything a subserver process needs, JSON-safe (it crosses a spawn boundary)."""

    program_json: str
    writer: str
    addresses: dict[str, str]  # "frontend" and every writer's subserver
    base_dir: str | None = None  # where relative router files are found
    batch_threshold: int = 1
    max_wait_ms: float = 20.0
    threads: int = 0  # 0: leave torch's default; with `cores`, the most it takes
    cores: dict[str, Any] | None = None  # its byte of the cores' ledger (`runtime/cores.LedgerSpec`), if it shares
    device: str = "cpu"
    block_size: int = 16
    num_blocks: int | None = None
    max_model_len: int | None = None
    max_batch: int = 256
    retention: str = "pending"  # KV of a departed request: "pending" | "rematch" (policies.py)
    transport: str = "peer"  # handoffs: "peer" | "relay" (through the frontend; policies.py)
    set_threads: bool = True  # False in thread mode: threads share one process
    test_hooks: bool = False  # accept test-only messages (debug_fail); tests only
    curve_keys: str | None = None  # folder of the CURVE key pair (tcp between hosts)
    curve_pair: tuple[str, str] | None = None  # or the pair made by the launch (z85 public, secret)
    insecure_tcp: bool = False  # allow plain tcp on a non-loopback address

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class LoadedWriter:
    program: Any  # ir.Program
    members: tuple[str, ...]  # the models this writer steps: itself, or an ensemble's members
    router: Any  # the writer's compiled router (its send and receive serve the subserver)
    engine: WriterEngine


def writer_loader(spec: SubserverSpec) -> Callable[..., LoadedWriter]:
    """The `load_writer` of the engine that serves `spec`'s writer (an ensemble's members
    step together on the default engine)."""
    return engines.implementation(ir.Program.from_json(spec.program_json).engine_of(spec.writer)).load_writer


def report_startup_failure(spec: SubserverSpec, exc: BaseException, ctx=None) -> None:
    """Tell the frontend this subserver could not start, and why."""
    log.error("%s: start-up failed:\n%s", spec.writer, traceback.format_exc())
    c = ctx or zmq.Context()
    try:
        sec = Security.load(spec.curve_keys, spec.insecure_tcp, spec.curve_pair)
    except ValueError:
        sec = None  # the failure may be the keys themselves: report it in the clear (tcp only)
    s = Sender(c, {wire.FRONTEND: spec.addresses[wire.FRONTEND]}, sec)
    s.send(wire.FRONTEND, wire.encode(wire.Ready(
        writer=spec.writer, pid=os.getpid(), inc=wire.new_incarnation(), block_size=0, blocks_total=0, max_model_len=0,
        vocab_size=0, threads=0, batch_threshold=spec.batch_threshold,
        max_wait_ms=spec.max_wait_ms, error=f"{type(exc).__name__}: {exc}")))
    s.close()
    if ctx is None:
        c.term()
