"""Start one subserver per writer (processes by default, threads for tests) and stop them.

What each subserver gets comes from the program's serving schedule:

* batch threshold B_i: the number given, or for `auto` (and for a writer the schedule does
  not mention) the one chosen above the runtime and handed in as a number
  (`LaunchOptions.tuned_batch`: `tokenrouter serve --profile` and the bench ask the tuner,
  `tuner.program.auto_thresholds`), else B = 1 for the start writer and
  min(4, concurrency // 2 or 1) for the others;
* max wait: the schedule's, else 20 ms;
* CPU threads: the schedule's (or `--threads`) for a writer that names them, fixed for its
  life; every other local writer whose engine steps on torch threads (tokenrouter's:
  `Capabilities.shares_cores`) on the CPU shares the host's cores by need
  (`runtime/cores.py`: a ledger of who is stepping now, created here, one byte per
  writer; `LaunchOptions.cores` = "split" gives the old fixed even split and "all" every
  writer every core, for the benchmarks that compare them); shown in /metrics;
* its engine: the one its model names (`engine = NAME`, tokenrouter's by default), which
  its subserver finds in the registry (`tokenrouter/engines.py`); what the launch needs of
  it is its capabilities: its optional extra (checked here, one line naming it), whether
  it shares the host's cores, keeps departed requests as asked (`retention`), starts a
  process per rank (tensor parallelism), and takes longer to start.

Processes use the `spawn` start method (a forked torch is not safe), are daemons (they
end with a normal exit of the parent), and also watch their parent, so a killed frontend
leaves no orphans. The OS tells the frontend at once when one ends (`watch_exits`: the
event loop reads each process's pidfd, or its multiprocessing sentinel where there is
none). A writer over several tensor-parallel ranks starts a process per rank, which a
daemon may not: it is not one, and is killed at exit instead (its rank processes end with
it). `stop` asks nicely (the frontend's shutdown message), then terminates, then kills.

`open_runtime` starts a program's subservers with a `Launcher` and a `Frontend` connected
to them, in the running event loop (`tokenrouter serve`, the offline API, the tests);
`close_runtime` stops both.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import multiprocessing
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import zmq

from tokenrouter import engines
from tokenrouter.compiler import ir
from tokenrouter.runtime.cores import SPIN_ENV, Ledger, environment, host_cores
from tokenrouter.runtime.logs import about
from tokenrouter.runtime.frontend.frontend import Frontend
from tokenrouter.runtime.subserver.setup import SubserverSpec
from tokenrouter.runtime.subserver.process import run_process, run_thread
from tokenrouter.runtime.transport.security import Security, stop_authenticator
from tokenrouter.runtime.transport.sockets import cleanup_ipc, make_addresses
from tokenrouter.runtime.transport.wire import FRONTEND

log = logging.getLogger(__name__)

DEFAULT_MAX_WAIT_MS = 20.0


@dataclass
class LaunchOptions:
    mode: str = "process"  # "process" | "thread"
    concurrency: int = 8  # expected concurrent requests, for `auto` thresholds
    batch: dict[str, int] = field(default_factory=dict)  # overrides the schedule
    max_wait_ms: dict[str, float] = field(default_factory=dict)
    threads: dict[str, int] = field(default_factory=dict)
    addresses: dict[str, str] | None = None  # explicit endpoints (tcp across hosts)
    remote: tuple[str, ...] = ()  # writers running elsewhere (not started here)
    block_size: int = 16
    num_blocks: int | None = None
    max_model_len: int | None = None
    retention: str = "pending"  # KV of a departed request: "pending" | "rematch" (policies.py)
    transport: str = "peer"  # handoffs: "peer" | "relay" through the frontend (policies.py)
    tuned_batch: dict[str, int] = field(default_factory=dict)  # B_i for `auto` writers, chosen by the caller
    base_dir: str | None = None
    test_hooks: bool = False  # subservers accept test-only messages (tests only)
    curve_keys: str | None = None  # CURVE key folder (`tokenrouter keygen`) for tcp
    insecure_tcp: bool = False  # allow plain tcp on non-loopback addresses
    cores: str = "share"  # writers without fixed threads: "share" by need | "split" evenly | "all" each


def served_writers(program: ir.Program) -> list[str]:
    """Writers a request can reach from the start writer; each gets a subserver (a model
    used only inside an ensemble runs in the ensemble's subserver)."""
    seen, todo = [], [program.start]
    while todo:
        w = todo.pop()
        if w in seen:
            continue
        seen.append(w)
        todo += [t.dest for t in program.transitions_from(w)]
        b = program.bound(w)
        if b.then:
            todo.append(b.then)
    return [w for w in program.writers() if w in seen]


def batch_thresholds(program: ir.Program, writers: list[str], concurrency: int,
                     overrides: dict[str, int] | None = None, tuned: dict[str, int] | None = None) -> dict[str, int]:
    """B_i per writer: `overrides` (`--batch`), else the schedule's number, else for `auto`
    the caller's `tuned` value, else the default (module docstring)."""
    given = dict(program.schedule.batch)
    out: dict[str, int] = {}
    for w in writers:
        if overrides and w in overrides:
            out[w] = int(overrides[w])
        elif given.get(w, "auto") != "auto":
            out[w] = int(given[w])
        elif tuned and w in tuned:
            out[w] = int(tuned[w])
        elif w == program.start:
            out[w] = 1
        else:
            out[w] = min(4, max(1, concurrency // 2))
    return out


def capabilities(program: ir.Program, writer: str) -> engines.Capabilities:
    """What the engine that steps `writer` can do (`tokenrouter/engines.py`)."""
    return engines.capabilities(program.engine_of(writer))


def require_engines(program: ir.Program, remote: tuple[str, ...] = ()) -> None:
    """Raise `extras.MissingExtra` (one line naming the extra) when a writer served here
    needs an engine whose extra is not installed."""
    for w in served_writers(program):
        if w not in remote:
            engines.require(program.engine_of(w))


CORE_MODES = ("share", "split", "all")


def sharing_writers(program: ir.Program, opts: LaunchOptions) -> list[str]:
    """The local writers whose threads are not fixed and whose engine steps on torch threads
    on the CPU: those that share the cores (`runtime/cores.py`)."""
    fixed = {**dict(program.schedule.threads), **opts.threads}
    placement = dict(program.schedule.placement)
    return [w for w in served_writers(program) if w not in opts.remote and not fixed.get(w)
            and capabilities(program, w).shares_cores and placement.get(w, "cpu").split(":")[0] not in ("cuda", "mps", "xpu")]


def plan(program: ir.Program, opts: LaunchOptions, security=None, ledger: Ledger | None = None
         ) -> dict[str, SubserverSpec]:
    """Each writer's `SubserverSpec`. `security`: the launch's (`Security.for_launch`), whose
    key pair, when made for this launch, the subservers get; `ledger`: the cores' ledger of
    the writers that share them (`sharing_writers`), None when they do not."""
    if opts.cores not in CORE_MODES:
        raise ValueError(f"cores mode {opts.cores!r} is not one of {', '.join(CORE_MODES)}")
    writers = served_writers(program)
    if opts.addresses is not None:
        missing = [n for n in [FRONTEND, *writers] if n not in opts.addresses]
        if missing:
            raise ValueError(f"no address given for {', '.join(missing)}")
        addresses = {n: opts.addresses[n] for n in [FRONTEND, *writers]}
    else:
        addresses = make_addresses([FRONTEND, *writers], "inproc" if opts.mode == "thread" else "ipc")
    thresholds = batch_thresholds(program, writers, opts.concurrency, opts.batch, opts.tuned_batch)
    waits = dict(program.schedule.max_wait_ms)
    threads = dict(program.schedule.threads)
    placement = dict(program.schedule.placement)
    local = [w for w in writers if w not in opts.remote]
    require_engines(program, opts.remote)
    for w in writers:
        kept = capabilities(program, w).retentions
        if opts.retention not in kept:
            raise ValueError(f"{w}: {capabilities(program, w).title} keeps departed requests "
                             f"{' or '.join(kept)}, not {opts.retention!r}")
    cores = host_cores()
    specs = {}
    for w in writers:
        device = placement.get(w, "cpu")
        if ":" in device and not device.startswith(("cuda", "mps", "xpu")):
            device = "cpu"  # host:port placement: the address says where it runs
        specs[w] = SubserverSpec(
            program_json=program.to_json(indent=None), writer=w, addresses=addresses,
            base_dir=opts.base_dir, batch_threshold=thresholds[w],
            max_wait_ms=float(opts.max_wait_ms.get(w, waits.get(w, DEFAULT_MAX_WAIT_MS))),
            threads=int(opts.threads.get(w, threads.get(w, 0)) or (cores if opts.cores != "split"
                                                                    else max(1, cores // max(1, len(local))))),
            cores=asdict(ledger.spec(w)) if ledger is not None and w in ledger.writers else None,
            device=device, block_size=opts.block_size, num_blocks=opts.num_blocks,
            max_model_len=opts.max_model_len, retention=opts.retention, transport=opts.transport,
            set_threads=opts.mode != "thread", test_hooks=opts.test_hooks,
            curve_keys=opts.curve_keys, insecure_tcp=opts.insecure_tcp,
            curve_pair=security.launch_pair if security is not None else None)
    return specs


class Launcher:
    """Owns the subservers started on this host."""

    def __init__(self, program: ir.Program, opts: LaunchOptions | None = None):
        self.program = program
        self.opts = opts or LaunchOptions()
        addresses = self.opts.addresses or {}
        self.security = Security.for_launch(self.opts.curve_keys, self.opts.insecure_tcp, addresses,
                                            tuple(w for w in self.opts.remote if w in addresses))
        sharing = sharing_writers(program, self.opts) if self.opts.mode == "process" else []
        self.ledger = Ledger(sharing) if self.opts.cores == "share" and len(sharing) > 1 else None
        self.specs = plan(program, self.opts, self.security, self.ledger)
        self.addresses = next(iter(self.specs.values())).addresses
        self.ctx = None
        self._procs: dict[str, Any] = {}
        self._threads: dict[str, threading.Thread] = {}
        self._exits: tuple[asyncio.AbstractEventLoop, Any] | None = None  # (loop, on_exit) of `watch_exits`

    @property
    def local(self) -> list[str]:
        return [w for w in self.specs if w not in self.opts.remote]

    def start(self) -> "Launcher":
        if self.opts.mode == "thread":
            self.ctx = zmq.Context()
            for w in self.local:
                t = threading.Thread(target=run_thread, args=(self.specs[w], self.ctx),
                                     name=f"subserver-{w}", daemon=True)
                t.start()
                self._threads[w] = t
        elif self.opts.mode == "process":
            for w in self.local:
                self._spawn(w)
        else:
            raise ValueError(f"launch mode {self.opts.mode!r} is not 'process' or 'thread'")
        return self

    def _spawn(self, w: str) -> None:
        mp = multiprocessing.get_context("spawn")
        # a daemon cannot start processes: a writer over several ranks starts one per rank
        daemon = not (capabilities(self.program, w).tensor_parallel and self.program.model(w).tensor_parallel > 1)
        p = mp.Process(target=run_process, args=(self.specs[w].to_dict(),), name=f"tokenrouter-{w}", daemon=daemon)
        with environment(SPIN_ENV if self.ledger is not None else {}):
            p.start()
        self._procs[w] = p
        if not daemon:  # ended at exit as a daemon would be, before multiprocessing joins it
            atexit.register(_kill, p)
        self._watch_exit(w, p)

    def watch_exits(self, loop: asyncio.AbstractEventLoop, on_exit) -> None:
        """From now on call `on_exit(writer)` in `loop` as soon as a local subserver process
        ends, a restarted one included: the OS says so (the process's pidfd turns readable)."""
        self._exits = (loop, on_exit)
        for w, p in self._procs.items():
            self._watch_exit(w, p)

    def _watch_exit(self, w: str, p) -> None:  # any thread (a restart runs in an executor)
        if self._exits is None:
            return
        loop, on_exit = self._exits
        try:
            fd, own = os.pidfd_open(p.pid), True
        except (AttributeError, OSError):  # no pidfd (not Linux 5.3+): the sentinel, readable at its exit
            fd, own = p.sentinel, False

        def ended() -> None:
            loop.remove_reader(fd)
            if own:
                os.close(fd)
            on_exit(w)
        try:
            loop.call_soon_threadsafe(loop.add_reader, fd, ended)
        except RuntimeError:  # the loop is closed: nobody is watching any more
            if own:
                os.close(fd)

    def restart(self, w: str) -> None:
        """Replace writer `w`'s process (kill what is left of the old one first). The new
        one binds the same address and reports `ready` to the frontend like the first."""
        old = self._procs.get(w)
        if old is not None:
            if old.is_alive():
                old.kill()
            old.join(5)
        log.warning("starting a new subserver process for %s", w, extra=about(w))
        self._spawn(w)

    def alive(self) -> dict[str, bool]:
        if self._procs:
            return {w: p.is_alive() for w, p in self._procs.items()}
        return {w: t.is_alive() for w, t in self._threads.items()}

    def pids(self) -> dict[str, int]:
        return {w: p.pid for w, p in self._procs.items()}

    def stop(self, timeout: float = 10.0) -> None:
        """Wait for the subservers to end (after the frontend sent shutdown), forcing them
        when they do not."""
        deadline = time.monotonic() + timeout
        for w, p in self._procs.items():
            p.join(max(0.1, deadline - time.monotonic()))
            if p.is_alive():
                log.warning("subserver %s did not stop; terminating it", w, extra=about(w))
                p.terminate()
                p.join(3)
            if p.is_alive():
                p.kill()
                p.join(3)
        for t in self._threads.values():
            t.join(max(0.1, deadline - time.monotonic()))
        if self.opts.addresses is None:
            cleanup_ipc(self.addresses)
        if self.ledger is not None:
            self.ledger.close()
        if self.ctx is not None and not any(t.is_alive() for t in self._threads.values()):
            stop_authenticator(self.ctx)
            self.ctx.term()
            self.ctx = None


def _kill(p) -> None:
    if p.is_alive():
        p.kill()
        p.join(5)


async def open_runtime(program: ir.Program, opts: LaunchOptions | None = None, timeout: float = 180.0,
                       **liveness) -> tuple[Launcher, Frontend]:
    """Start the subservers of `program` and a connected `Frontend` in the running loop.
    `liveness`: heartbeat_timeout_s, stall_window_s, max_restarts, on_fatal (see `Frontend`)."""
    launcher = Launcher(program, opts).start()
    longer = [c.start_timeout_s for w in launcher.local if (c := capabilities(program, w)).start_timeout_s]
    timeout = max([timeout, *longer])
    fe = Frontend(program.start if program.start in launcher.specs else launcher.local[0],
                  launcher.addresses, ctx=launcher.ctx, alive=launcher.alive,
                  restart=launcher.restart if launcher.opts.mode == "process" else None,
                  security=launcher.security, pids=launcher.pids, **liveness)
    launcher.watch_exits(asyncio.get_running_loop(), fe.watch.exited)
    try:
        await fe.start(timeout)
    except BaseException:
        await fe.close()
        await asyncio.get_running_loop().run_in_executor(None, launcher.stop, 5.0)
        raise
    return launcher, fe


async def close_runtime(launcher: Launcher, fe: Frontend) -> None:
    await fe.close()
    await asyncio.get_running_loop().run_in_executor(None, launcher.stop)
