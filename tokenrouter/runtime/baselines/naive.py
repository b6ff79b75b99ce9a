"""The naive deployment: independent servers plus a dispatcher that re-sends the context.

It runs on the same subservers with two switches (see `subserver.py`):
- `relay`: subservers never talk to each other; a departing request goes back to the
  frontend, which plays the dispatcher and forwards it to the next model's server;
- `rematch`: a departing request is not kept pending; its KV goes into a prefix cache,
  the whole context travels with every handoff, and the receiving server matches the
  longest cached prefix as it would for any new request (the cache bookkeeping the
  TokenRouter paper measures at 95% of a step), then extends from there;
and no delayed batching (B = 1 everywhere: a stock server launches a step at once).
"""

from __future__ import annotations

import dataclasses

from tokenrouter.compiler import ir
from tokenrouter.runtime.launcher import LaunchOptions, served_writers


def naive_options(program: ir.Program, base: LaunchOptions | None = None) -> LaunchOptions:
    base = base or LaunchOptions()
    return dataclasses.replace(base, relay=True, rematch=True,
                               batch={w: 1 for w in served_writers(program)})


def no_pending_options(program: ir.Program, base: LaunchOptions | None = None) -> LaunchOptions:
    """Peer-to-peer subservers, but a returning request is re-matched as a new one (the
    ablation 'without pending handoffs')."""
    base = base or LaunchOptions()
    return dataclasses.replace(base, rematch=True)


def no_delay_options(program: ir.Program, base: LaunchOptions | None = None) -> LaunchOptions:
    """This runtime without delayed batching (B = 1 everywhere)."""
    base = base or LaunchOptions()
    return dataclasses.replace(base, batch={w: 1 for w in served_writers(program)})
