"""A task set: its tasks, how each one is asked, and how an answer is judged.

Two kinds, each in its own module:

- answer tasks (`tasks.py`, `AnswerTaskSet`): JSONL files; an answer is right when it matches
  the task's answer (exact, number, regex); metric `accuracy`;
- HumanEval (`humaneval.py`, `HumanEval`): code problems; an answer passes when its code passes
  the problem's tests, run in the sandbox; metric `pass@1`.

What `evaluate` asks of either (`TaskSet`): `tasks` (each with an `id` and the `prompt` the
report shows), `message(task)` (the user message sent, in the chat template), a
`response_prefix` (text the assistant's turn starts with, part of the prompt), `stop` strings,
`default_max_tokens`, `judge(texts)` (a `Verdict` per answer, in order), `fields(task)` (what
a prompt's record in summary.json carries besides its outputs), `subset(n)` and `describe()`
(for `meta.task_set`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence


@dataclass(frozen=True)
class Verdict:
    """Whether one answer is right (None: the task carries no answer to judge it by), and
    why, in a line, where the judge says more than right or wrong (a failed test's error)."""

    correct: bool | None
    detail: str | None = None


class TaskSet(Protocol):
    name: str
    metric: str  # "accuracy" or "pass@1": what `correct / answered` is called
    tasks: list
    response_prefix: str
    stop: tuple[str, ...]
    default_max_tokens: int

    def message(self, task) -> str: ...

    def judge(self, texts: Sequence[str], label: str, use_tqdm: bool = True) -> list[Verdict]: ...

    def fields(self, task) -> dict[str, Any]: ...

    def subset(self, n: int) -> "TaskSet": ...

    def describe(self) -> dict[str, Any]: ...


def spread(items: list, n: int) -> list:
    """`n` items evenly spaced over `items` (all of them when there are not more), in order:
    a subset that keeps every category of a task file in proportion."""
    if n >= len(items):
        return list(items)
    return [items[(i * len(items)) // n] for i in range(n)]
