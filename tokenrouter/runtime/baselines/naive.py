"""The naive deployment and the ablations: this runtime's subservers with other policies.

Each is a choice of `subserver/policies.py` (and of B_i), so the baselines run exactly the code the
runtime runs except for what they change:

- `naive`: independent servers plus a dispatcher. Transport `relay`: subservers never
  talk to each other; a departing request goes back to the frontend, which plays the
  dispatcher and forwards it to the next model's server. Retention `rematch`: a departing
  request is not kept pending; its KV goes into a prefix cache, the whole context travels
  with every handoff, and the receiving server matches the longest cached prefix as it
  would for any new request (the cache bookkeeping the TokenRouter paper measures at 95%
  of a step), then extends from there. And no delayed batching (B = 1 everywhere: a stock
  server launches a step at once).
- `no_pending`: peer to peer, but retention `rematch`.
- `no_delay`: this runtime with B = 1 everywhere.
"""

from __future__ import annotations

import dataclasses

from tokenrouter.compiler import ir
from tokenrouter.runtime.launch import LaunchOptions, served_writers


def naive_options(program: ir.Program, base: LaunchOptions | None = None) -> LaunchOptions:
    base = base or LaunchOptions()
    return dataclasses.replace(base, transport="relay", retention="rematch",
                               batch={w: 1 for w in served_writers(program)})


def no_pending_options(program: ir.Program, base: LaunchOptions | None = None) -> LaunchOptions:
    """Peer-to-peer subservers, but a returning request is re-matched as a new one (the
    ablation 'without pending handoffs')."""
    base = base or LaunchOptions()
    return dataclasses.replace(base, retention="rematch")


def no_delay_options(program: ir.Program, base: LaunchOptions | None = None) -> LaunchOptions:
    """This runtime without delayed batching (B = 1 everywhere)."""
    base = base or LaunchOptions()
    return dataclasses.replace(base, batch={w: 1 for w in served_writers(program)})
