"""A subserver as a thread or a process: the entry points the launcher starts (`run_thread`
in thread mode, `run_process` as a multiprocessing target; `tokenrouter serve --subserver`
runs the latter in the foreground). A start-up failure is reported to the frontend
(`setup.report_startup_failure`); a process logs with its writer's name, bounds its heap
growth (`memory.py`), unwinds on SIGTERM and SIGINT (Ctrl-C at `serve` reaches the whole
process group) and ends with the process that started it.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any, Callable

from tokenrouter.runtime import logs
from tokenrouter.runtime.memory import bound_heap_growth
from tokenrouter.runtime.subserver.setup import LoadedWriter, SubserverSpec, report_startup_failure
from tokenrouter.runtime.subserver.subserver import Subserver

__all__ = ["exit_on_sigterm", "run_process", "run_thread"]


def run_thread(spec: SubserverSpec, ctx=None, load: Callable[..., LoadedWriter] | None = None) -> None:
    """Start and serve; a start-up failure is reported to the frontend. The entry point of a
    subserver thread (thread mode, with the caller's ZeroMQ context), and of a process.
    `load`: see `Subserver`."""
    try:
        sub = Subserver(spec, ctx=ctx, load=load)
    except Exception as exc:
        report_startup_failure(spec, exc, ctx=ctx)
        return
    sub.serve()


def exit_on_sigterm(signum, frame) -> None:
    """A terminated subserver unwinds (`finally` blocks run: a model build in progress removes
    its temporary folder) instead of vanishing mid-write."""
    raise SystemExit(128 + signum)


def run_process(spec_dict: dict[str, Any], load: Callable[..., LoadedWriter] | None = None) -> None:
    """Entry point of a subserver process (multiprocessing target, spawn start method);
    `load` is a module-level function, so it crosses the spawn boundary by name."""
    # progress lines and warnings (TOKENROUTER_LOG); a flood of bad frames is one line with a count
    logs.configure(f"tokenrouter [{spec_dict.get('writer')}]")
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    signal.signal(signal.SIGINT, exit_on_sigterm)  # Ctrl-C at `serve`: unwind quietly, no KeyboardInterrupt traceback
    spec, parent = SubserverSpec(**spec_dict), os.getppid()
    bound_heap_growth()  # RSS flat over hours of changing batch sizes (memory.py)

    def watch_parent() -> None:  # no orphans: end with the process that started us
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch_parent, daemon=True).start()
    run_thread(spec, load=load)
