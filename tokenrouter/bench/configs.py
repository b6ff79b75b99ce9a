"""The configurations `tokenrouter bench` compares, and how each is deployed.

Keys (also those of `summary.json`):

- `tokenrouter`: async subservers, pending handoffs, delayed batching with the tuned B_i;
- `no_delay`: the same deployment with B_i = 1 everywhere (set at run time with the
  runtime's `configure` message, so it shares `tokenrouter`'s processes);
- `no_pending`: tuned B_i, but a returning request is re-prefix-matched as a new one
  (the runtime's `rematch` KV retention, `runtime/subserver/policies.py`);
- `lockstep`: every model stepped together in one loop (`runtime.baselines.lockstep`);
- `naive`: independent servers plus a dispatcher that resends the context on every
  handoff (`runtime.baselines.naive`);
- `large_only` / `small_only`: one model serving every token (the cost bounds);
- `llamacpp_std`: the paper's standard serving: one stock llama.cpp server per model and a
  dispatcher routing one token at a time (`bench/llamacpp.py`);
- `llamacpp_large`: the large model alone on one stock llama.cpp server (no routing);
- `official`: the algorithms' own serving loop, CITER's, in `transformers` (`bench/official.py`);
- `tokenrouter_vllm`: `tokenrouter` with the large writer served by vLLM (`engine = vllm`,
  `runtime/vllm/`), the same B_i (`tokenrouter_ENGINE`: the large writer on that
  registered engine, `on_engine`);
- `vllm_large`: the large model alone on one stock vLLM server (`bench/vllm_peers.py`);
- `vllm_std`: standard serving from stock vLLM: a vLLM server per model with prefix caching
  and the per-token dispatcher (`bench/vllm_peers.py`, `bench/dispatch.py`);
- `bound`: not a deployment but the profile's upper bound for the steps `tokenrouter` took:
  each at its cheapest batch (<= N), nothing waiting, the models side by side as far as
  co-location allows (`results.bound`, as `tuner.bounds`).
"""

from __future__ import annotations

import dataclasses

from tokenrouter import engines
from tokenrouter.compiler import ir
from tokenrouter.runtime.baselines.naive import naive_options, no_pending_options
from tokenrouter.runtime.launch import served_writers

CONFIGS = ("tokenrouter", "no_delay", "no_pending", "lockstep", "naive", "large_only", "small_only",
           "llamacpp_std", "llamacpp_large", "official", "tokenrouter_vllm", "vllm_large", "vllm_std", "bound")
#: configurations that run the routing program on our engine (their outputs must agree token for token)
ROUTED = ("tokenrouter", "no_delay", "no_pending", "lockstep", "naive")
#: peers that run the routing program on other kernels: their agreement with ours is measured
PEERS_ROUTED = ("llamacpp_std", "official", "tokenrouter_vllm", "vllm_std")
#: the configurations that need the `vllm` extra (`--configs vllm`: these and tokenrouter)
VLLM = ("tokenrouter_vllm", "vllm_large", "vllm_std")
#: peers started once per concurrency level (`--parallel` = N)
PER_LEVEL = ("llamacpp_std", "llamacpp_large")
#: computed from the profile and the tokenrouter run, not measured
DERIVED = ("bound",)
#: configurations that run other projects' code: they need the `bench` extra (`tokenrouter.extras`)
NEED_BENCH_EXTRA = ("llamacpp_std", "llamacpp_large", "official")
#: `--quick`: what fits 15 minutes with >= 30 s a configuration a round
QUICK = ("tokenrouter", "naive", "large_only", "small_only", "llamacpp_std", "llamacpp_large", "official", "bound")


def parse_configs(text: str | None) -> list[str]:
    """A comma-separated subset of CONFIGS (None or "all": every one but the vLLM ones; "quick":
    QUICK; an engine's name, such as vllm: tokenrouter on the default engine and on that one,
    and the stock peers of that project, `ENGINE_*`), in CONFIGS order."""
    if not text or text == "all":
        return [c for c in CONFIGS if c not in VLLM]
    if text == "quick":
        return [c for c in CONFIGS if c in QUICK]
    if engine_config(text) in CONFIGS:
        return [c for c in CONFIGS if c in ("tokenrouter", engine_config(text)) or c.startswith(f"{text}_")]
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [n for n in names if n not in CONFIGS]
    if bad:
        raise ValueError(f"unknown configuration(s) {', '.join(bad)}; choose from {', '.join(CONFIGS)}")
    return [c for c in CONFIGS if c in names]


def small_and_large(program: ir.Program) -> tuple[str, str]:
    """The program's small and large model: roles when declared, else start = small and
    the other model large. Only two-model programs have both bounds."""
    models = [m.name for m in program.models]
    if len(models) != 2:
        raise ValueError(f"the bench compares a pair of models; this program has {len(models)}")
    roles = {m.role: m.name for m in program.models}
    if "small" in roles and "large" in roles:
        return roles["small"], roles["large"]
    small = program.start if program.start in models else models[0]
    return small, next(m for m in models if m != small)


def single_model(program: ir.Program, name: str) -> ir.Program:
    """The program reduced to one model writing every token (no routing)."""
    m = program.model(name)
    sched = ir.Schedule(threads=tuple((k, v) for k, v in program.schedule.threads if k == name),
                        placement=tuple((k, v) for k, v in program.schedule.placement if k == name))
    return dataclasses.replace(program, models=(m,), start=name, transitions=(), bounds=(), ensembles=(),
                               routers=(), schedule=sched)


def engine_config(engine: str) -> str:
    """The configuration that serves the large writer on `engine`."""
    return f"tokenrouter_{engine}"


def config_engine(name: str) -> str | None:
    """The engine configuration `name` serves the large writer on (`tokenrouter_ENGINE`), or None."""
    engine = name.removeprefix("tokenrouter_")
    return engine if name != engine and engine in engines.names() else None


def on_engine(program: ir.Program, name: str, engine: str) -> ir.Program:
    """The program with model `name` served by `engine`."""
    return dataclasses.replace(program, models=tuple(dataclasses.replace(m, engine=engine) if m.name == name else m
                                                      for m in program.models))


def writers(program: ir.Program) -> list[str]:
    return served_writers(program)


def launch_options(name: str, program: ir.Program, base):
    """LaunchOptions of a runtime configuration (None for lockstep, which is in-process)."""
    if name in ("tokenrouter", "no_delay", "large_only", "small_only", "tokenrouter_vllm"):
        return base
    if name in PER_LEVEL or name in DERIVED or name in ("official", "vllm_large", "vllm_std"):
        return None
    if name == "no_pending":
        return no_pending_options(program, base)
    if name == "naive":
        return naive_options(program, base)
    if name == "lockstep":
        return None
    raise ValueError(f"unknown configuration {name!r}")


def thresholds_for(name: str, program: ir.Program, tuned: dict[str, int]) -> dict[str, int] | None:
    """B_i a runtime configuration runs with at one concurrency level (None: leave as launched)."""
    ws = writers(program)
    if name in ("tokenrouter", "no_pending", "tokenrouter_vllm"):
        return {w: int(tuned.get(w, 1)) for w in ws}
    if name in ("no_delay", "naive"):
        return {w: 1 for w in ws}
    return None
