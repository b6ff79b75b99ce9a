"""`evaluate`: everything `tokenrouter eval` does, callable from Python.

    from tokenrouter.eval.evaluate import evaluate
    summary = evaluate("examples/demo.route", "out/", sweep="tau=0.3:0.6:4", max_tokens=32)

Order of work: read and check every input (tasks, parameters, sweep values, prompt lengths)
before any model runs; then run small alone, large alone, the routed program and each sweep
point; then write `summary.json`, `frontier.png` and `report.html` together. Any error
raises `EvalError` and leaves `out` as it was (no partial report).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from typing import Any, Sequence

from tokenrouter.eval.analysis import score, summarize
from tokenrouter.eval.configs import EvalError, alone, load, small_and_large
from tokenrouter.eval.report import frontier_png, render_html
from tokenrouter.eval.reuse import declaration, load_baselines
from tokenrouter.eval.run import check_fit, context_length, encode_prompts, run_program
from tokenrouter.eval.tasks import SHIPPED_TASKS, TaskError, load_all
from tokenrouter.runtime.host import host_info
from tokenrouter.runtime.loader import program_tokenizer


def parse_sweep(text: str) -> tuple[str, list[float]]:
    """'tau=0.3:0.6:4' -> ('tau', [0.3, 0.4, 0.5, 0.6]): N evenly spaced values, ends included."""
    name, eq, rng = text.partition("=")
    parts = rng.split(":")
    if not eq or not name.strip() or len(parts) != 3:
        raise EvalError(f"--sweep expects NAME=LO:HI:N, got {text!r}")
    try:
        lo, hi, n = float(parts[0]), float(parts[1]), int(parts[2])
    except ValueError:
        raise EvalError(f"--sweep expects NAME=LO:HI:N with numbers LO, HI and a whole N, got {text!r}") from None
    if n < 1:
        raise EvalError(f"--sweep N must be >= 1, got {n}")
    vals = [lo] if n == 1 else [lo + (hi - lo) * i / (n - 1) for i in range(n)]
    return name.strip(), [float(f"{v:.6g}") for v in vals]


def spread(items: list, n: int) -> list:
    """`n` items evenly spaced over `items` (all of them when there are not more), in order:
    a subset that keeps every category of a task file in proportion."""
    if n >= len(items):
        return list(items)
    return [items[(i * len(items)) // n] for i in range(n)]


def evaluate(path: str, out: str, prompts: Sequence[str] | None = None, params: dict[str, str] | None = None,
             sweep: str | None = None, concurrency: int | Sequence[int] = 8, max_tokens: int = 32,
             limit: int | None = None,
             small: str | None = None, large: str | None = None, chat: bool = True, launch=None,
             model_paths: dict[str, str] | None = None, use_tqdm: bool = True, log=print,
             reuse: str | None = None, command: str | None = None) -> dict[str, Any]:
    """Run the evaluation and write its report into `out`; returns the summary. With several
    concurrencies every configuration is timed at each (the first is the headline figure);
    `limit` keeps that many prompts spread evenly over the task files."""
    concurrency = [concurrency] if isinstance(concurrency, int) else list(concurrency)
    if not concurrency or min(concurrency) < 1:
        raise EvalError(f"--concurrency must be >= 1, got {concurrency}")
    if max_tokens < 1:
        raise EvalError(f"--max-tokens must be >= 1, got {max_tokens}")
    try:
        tasks = load_all(prompts or [SHIPPED_TASKS])
    except TaskError as exc:
        raise EvalError(str(exc)) from None
    if limit is not None:
        if limit < 1:
            raise EvalError(f"--limit must be >= 1, got {limit}")
        tasks = spread(tasks, limit)
    params = dict(params or {})
    program = load(path, params, model_paths)
    sweep_name, sweep_vals = parse_sweep(sweep) if sweep else (None, [])
    sweep_programs = [load(path, {**params, sweep_name: f"{v:g}"}, model_paths) for v in sweep_vals]
    names = small_and_large(program, small, large)

    tokenizer = program_tokenizer(program)
    ids = encode_prompts(tokenizer, tasks, chat)
    check_fit(tasks, ids, context_length(program, getattr(launch, "max_model_len", None)))

    def run(prog, label):
        return run_program(prog, label, ids, tasks, max_tokens, concurrency, launch, use_tqdm)

    reused = {}
    if reuse:
        reused = load_baselines(reuse, program, names, tasks, max_tokens, chat, concurrency)
        log(f"reusing {', '.join(sorted(reused)) or 'nothing'} from {reuse}")
    t0 = time.time()
    small_run = reused.get("small") or run(alone(program, names[0]), f"small alone ({names[0]})")
    large_run = reused.get("large") or run(alone(program, names[1]), f"large alone ({names[1]})")
    routed_run = run(program, "routed")
    points = []
    for v, prog in zip(sweep_vals, sweep_programs):
        r = run(prog, f"{sweep_name}={v:g}")
        points.append({"value": v, **score(tasks, r, large_run, names[1])})
    summary = summarize(tokenizer, tasks, small_run, large_run, routed_run, names)
    summary["sweep"] = None if not sweep_name else {
        "param": sweep_name, "values": sweep_vals, "points": points,
        "small": summary["configs"]["small"], "large": summary["configs"]["large"]}
    summary["meta"] = {
        "program": os.fspath(path), "command": command, "small": names[0], "large": names[1], "writers": list(program.writers()),
        "models": {m.name: declaration(m) for m in program.models}, "model_paths": model_paths or {},
        "reused": {k: os.path.abspath(reuse) for k in reused},
        "params": params, "bound_params": {p.name: {"value": p.value, "origin": p.origin} for p in program.params},
        "prompts": [os.fspath(p) for p in (prompts or [SHIPPED_TASKS])],
        "n_prompts": len(tasks), "n_answered": sum(t.answer is not None for t in tasks),
        "max_tokens": max_tokens, "concurrency": concurrency[0], "concurrencies": concurrency, "greedy": True, "chat_template": chat,
        "seconds": round(time.time() - t0, 1), "host": host_info(bandwidth=True),
        "threads_note": "subservers divide the host's cores among themselves (see the launcher)"}
    summary = {k: summary[k] for k in ("meta", "configs", "diff", "sweep", "prompts")}
    write_report(summary, out)
    log(f"wrote {os.path.join(out, 'summary.json')}, report.html and frontier.png")
    return summary


def write_report(summary: dict[str, Any], out: str) -> None:
    """Write summary.json, frontier.png and report.html into `out`, all or nothing: they are
    written next to it first and moved in once complete."""
    out = os.path.abspath(out)
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".eval-", dir=parent)
    try:
        png = frontier_png(summary)
        files = {"summary.json": json.dumps(summary, indent=1, ensure_ascii=False).encode(),
                 "frontier.png": png, "report.html": render_html(summary, png).encode()}
        for name, data in files.items():
            with open(os.path.join(tmp, name), "wb") as f:
                f.write(data)
        os.makedirs(out, exist_ok=True)
        for name in files:
            os.replace(os.path.join(tmp, name), os.path.join(out, name))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


__all__ = ["evaluate", "parse_sweep", "EvalError", "write_report"]
