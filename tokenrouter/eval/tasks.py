"""Evaluation prompts: a JSONL task file, and whether an output answers a task correctly.

One JSON object per line:

    {"id": "arith-001", "prompt": "What is 7 + 5? Reply with the number only.",
     "answer": "12", "match": "number", "category": "arithmetic"}

`prompt` is required; `id` defaults to the file's stem and line number; `kind` (the field
the fitting prompts in data/prompts/ use) stands for `category`. A task without
`answer` still counts for agreement with the large model, not for accuracy. Match rules
(all case-insensitive; "first line" is the output's first non-empty line):

- `exact`: the answer appears in the first line as a whole word or phrase
  ("Paris." and "The capital of France is Paris." match "Paris"; "Parisian" does not);
- `number`: the last number in the first line equals the answer ("7 + 5 = 12", "12 apples";
  thousands separators and a leading minus sign are understood; equality within 1e-6);
- `regex`: the answer is a Python regular expression searched in the whole output.

Blank lines and lines starting with `#` are skipped. Any other malformed line is a
`TaskError` naming the file and line, raised before anything runs.

`AnswerTaskSet` is these files as a task set (`taskset.py`): each prompt sent as it is, each
output judged by its task's rule, metric `accuracy`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from tokenrouter.eval.taskset import Verdict, spread

MATCH_RULES = ("exact", "number", "regex")
SHIPPED_TASKS = os.path.join(os.path.dirname(__file__), "tasks.jsonl")
_NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?")
_KNOWN_FIELDS = {"id", "prompt", "answer", "match", "category", "kind"}  # kind: the fitting prompts' category


class TaskError(ValueError):
    """A task file that cannot be used; the message names the file and line."""


@dataclass(frozen=True)
class Task:
    id: str
    prompt: str
    answer: str | None = None
    match: str = "exact"
    category: str | None = None


def load_tasks(path: str) -> list[Task]:
    """Every task in a JSONL file, validated (see the module docstring)."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise TaskError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise TaskError(f"{path}: not UTF-8 text ({exc.reason})") from None
    stem = os.path.splitext(os.path.basename(path))[0]
    tasks: list[Task] = []
    seen: dict[str, int] = {}
    for n, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"{path}:{n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TaskError(f"{where}: not a JSON object: {exc.msg} at column {exc.colno}") from None
        tasks.append(_task(obj, where, f"{stem}-{n}"))
        if tasks[-1].id in seen:
            raise TaskError(f"{where}: id {tasks[-1].id!r} already used on line {seen[tasks[-1].id]}")
        seen[tasks[-1].id] = n
    if not tasks:
        raise TaskError(f"{path}: no tasks (expected one JSON object per line)")
    return tasks


def _task(obj, where: str, default_id: str) -> Task:
    if not isinstance(obj, dict):
        raise TaskError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    unknown = sorted(set(obj) - _KNOWN_FIELDS)
    if unknown:
        raise TaskError(f"{where}: unknown field {unknown[0]!r} (fields: {', '.join(sorted(_KNOWN_FIELDS))})")
    prompt = obj.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise TaskError(f"{where}: 'prompt' must be a non-empty string")
    for key in ("id", "answer", "category", "kind"):
        if key in obj and not isinstance(obj[key], str):
            raise TaskError(f"{where}: {key!r} must be a string, got {json.dumps(obj[key])}")
    match = obj.get("match", "exact")
    if match not in MATCH_RULES:
        raise TaskError(f"{where}: 'match' must be one of {', '.join(MATCH_RULES)}, got {json.dumps(match)}")
    answer = obj.get("answer")
    if answer is None and "match" in obj:
        raise TaskError(f"{where}: 'match' given without an 'answer'")
    if answer is not None:
        if not answer.strip():
            raise TaskError(f"{where}: 'answer' is empty")
        if match == "number" and _parse_number(answer.strip()) is None:
            raise TaskError(f"{where}: answer {answer!r} is not a number (match rule 'number')")
        if match == "regex":
            try:
                re.compile(answer)
            except re.error as exc:
                raise TaskError(f"{where}: answer is not a valid regular expression: {exc}") from None
    return Task(id=obj.get("id", default_id), prompt=prompt, answer=answer, match=match,
                category=obj.get("category", obj.get("kind")))


def load_all(paths: Iterable[str]) -> list[Task]:
    """Tasks of several files, in order; ids must be unique across them."""
    out: list[Task] = []
    where: dict[str, str] = {}
    for p in paths:
        for t in load_tasks(p):
            if t.id in where:
                raise TaskError(f"{p}: id {t.id!r} is also used in {where[t.id]}")
            where[t.id] = p
            out.append(t)
    return out


def _first_line(text: str) -> str:
    return next((ln for ln in text.splitlines() if ln.strip()), "")


def _parse_number(s: str) -> float | None:
    if not _NUMBER.fullmatch(s):
        return None
    return float(s.replace(",", ""))


def is_correct(task: Task, output: str) -> bool | None:
    """Whether `output` answers `task` (None when the task carries no answer)."""
    if task.answer is None:
        return None
    if task.match == "regex":
        return re.search(task.answer, output, re.IGNORECASE) is not None
    line = _first_line(output)
    if task.match == "number":
        found = _NUMBER.findall(line)
        if not found:
            return False
        got, want = float(found[-1].replace(",", "")), float(task.answer.strip().replace(",", ""))
        return math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-9)
    phrase = r"\s+".join(re.escape(w) for w in task.answer.split())
    return re.search(rf"(?<!\w){phrase}(?!\w)", line, re.IGNORECASE) is not None


DEFAULT_MAX_TOKENS = 32  # short answers: a number, a name, a line


@dataclass(frozen=True)
class AnswerTaskSet:
    """Task files as a task set (see the module docstring)."""

    paths: tuple[str, ...]
    tasks: list
    name: str = "answers"
    metric: str = "accuracy"
    response_prefix: str = ""
    stop: tuple[str, ...] = ()
    default_max_tokens: int = DEFAULT_MAX_TOKENS

    @classmethod
    def load(cls, paths: Sequence[str] | None = None) -> "AnswerTaskSet":
        paths = tuple(paths or [SHIPPED_TASKS])
        return cls(paths, load_all(paths))

    def message(self, task: Task) -> str:
        return task.prompt

    def judge(self, texts: Sequence[str], label: str, use_tqdm: bool = True) -> list[Verdict]:
        return [Verdict(is_correct(t, x)) for t, x in zip(self.tasks, texts)]

    def fields(self, task: Task) -> dict[str, Any]:
        return {"answer": task.answer, "match": task.match if task.answer else None, "category": task.category}

    def subset(self, n: int) -> "AnswerTaskSet":
        return dataclasses.replace(self, tasks=spread(self.tasks, n))

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "metric": self.metric, "files": [os.fspath(p) for p in self.paths]}
