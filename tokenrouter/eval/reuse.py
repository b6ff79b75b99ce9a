"""Reuse the small-alone and large-alone runs of an earlier evaluation (`--reuse DIR`).

Evaluating several programs on one model pair runs the same two single-model configurations
every time; on a busy CPU they are most of the cost. A baseline is reused only when it is the
same computation: the same model declaration (path, dtype, quantisation: everything but the
source position and the role), the same task set (its kind, response prefix and stop
strings), the same prompts (ids and text), the same `max_tokens`, chat setting and
concurrencies. Greedy outputs are then identical by construction; the throughput
figures are the earlier run's (a different moment of a shared machine), so the summary names
the run they came from (`meta.reused`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from tokenrouter.compiler import ir
from tokenrouter.eval.configs import EvalError, load
from tokenrouter.eval.run import ConfigRun
from tokenrouter.runtime.offline import RequestOutput


def declaration(model: ir.Model) -> dict[str, Any]:
    """What makes a model compute what it computes (not where it was declared or its role)."""
    d = {k: v for k, v in dataclasses.asdict(model).items() if k not in ("span", "role", "name")}
    return json.loads(json.dumps(d))


def _recorded_models(meta: dict[str, Any]) -> dict[str, Any]:
    if "models" in meta:
        return meta["models"]
    # summaries written before the declarations were recorded: rebuild them from the program
    prog = load(meta["program"], meta.get("params") or None, meta.get("model_paths") or None)
    return {m.name: declaration(m) for m in prog.models}


def read_summary(folder: str, flag: str) -> dict[str, Any]:
    """The summary.json of an earlier eval's folder; EvalError naming `flag` when unreadable."""
    path = os.path.join(folder, "summary.json")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as exc:
        raise EvalError(f"{flag} {folder}: cannot read {path}: {exc}") from None


def computation(task_set_meta: dict[str, Any] | None) -> tuple:
    """What of a task set decides the tokens generated (summaries without `task_set` were
    answer tasks, sent as they are)."""
    t = task_set_meta or {"name": "answers"}
    return t["name"], t.get("response_prefix", ""), tuple(t.get("stop", ()))


def as_model(run: ConfigRun, name: str) -> ConfigRun:
    """A one-model run with that model named `name` (how another program of the same pair
    calls it): its tokens, all written by `name`."""
    outs = [dataclasses.replace(o, tokens_by_model={name: len(o.token_ids)}, token_writers=[name] * len(o.token_ids))
            for o in run.outputs]
    return dataclasses.replace(run, outputs=outs)


def load_baselines(folder: str, program: ir.Program, names: tuple[str, str], task_set,
                   max_tokens: int, chat: bool, concurrency: list[int], speed: int | None = None
                   ) -> dict[str, ConfigRun]:
    """{'small': ConfigRun, 'large': ConfigRun} for the baselines of `folder` that match (see
    the module docstring); the ones that do not match are left out. Their verdicts are not
    read: the caller judges their outputs again."""
    old = read_summary(folder, "--reuse")
    if "runs" in old.get("meta", {}):  # a comparison of several programs: its first program's run
        return load_baselines(os.path.join(folder, old["meta"]["runs"][0]["folder"]), program, names, task_set,
                              max_tokens, chat, concurrency, speed)
    meta = old["meta"]
    tasks = task_set.tasks
    same_run = (computation(meta.get("task_set")) == computation(task_set.describe())
                and meta["max_tokens"] == max_tokens and bool(meta.get("chat_template", True)) == chat
                and meta.get("concurrencies", [meta["concurrency"]]) == concurrency
                and (speed is None or meta.get("speed_prompts", len(old["prompts"])) == speed)
                and [(r["id"], r["prompt"]) for r in old["prompts"]] == [(t.id, t.prompt) for t in tasks])
    if not same_run:
        return {}
    recorded = _recorded_models(meta)
    out: dict[str, ConfigRun] = {}
    for key, name in zip(("small", "large"), names):
        old_name = meta[key]
        if recorded.get(old_name) != declaration(program.model(name)):
            continue
        cfg = old["configs"][key]
        outs = [RequestOutput(r["prompt"], [], r[key]["token_ids"], r[key]["text"], r[key]["finish_reason"])
                for r in old["prompts"]]
        rates = {int(c): v for c, v in cfg.get("tokens_per_s_at", {}).items()} or {concurrency[0]: cfg["tokens_per_s"]}
        out[key] = as_model(ConfigRun(f"{key} alone ({name}, reused)", outs, cfg["wall_s"], rates,
                                      cfg.get("same_tokens_at_every_concurrency", True)), name)
    return out
