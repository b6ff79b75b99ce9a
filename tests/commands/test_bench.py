"""`tokenrouter bench --prompts FILE`: a file that is not a prompt set is one line naming
the file (and the line), exit status 2, before anything starts: the program, whose models
do not exist here, is not even loaded, and no output folder is made."""

from __future__ import annotations

import pytest

from tokenrouter import cli

ROUTE = """tokenrouter 1
model small = "{root}/no-small"
model large = "{root}/no-large"
route {{
  start small
  small -> large when bernoulli(0.25, 7) rewrite
  visit large max 1 then small
}}
"""


@pytest.fixture
def route(tmp_path):
    path = tmp_path / "missing-models.route"
    path.write_text(ROUTE.format(root=tmp_path))
    return path


def bench(route, prompts, out, capsys) -> tuple[int, str]:
    status = cli.main(["bench", str(route), "--prompts", str(prompts), "--out", str(out), "--configs", "tokenrouter",
                       "--concurrency", "1", "--requests", "2", "--no-progress"])
    return status, capsys.readouterr().err


@pytest.mark.parametrize("text,where", [
    (None, ": no such prompts file"),
    ('{"prompt": "a"}\n{"prompt": "b"\n', ":2: not valid JSON"),
    ('\n{"prompt": "a"}\n{"question": "b"}\n', ':3: expected an object with a non-empty "prompt" string'),
])
def test_bad_prompts_are_one_line_naming_file_and_line_and_nothing_starts(route, tmp_path, capsys, text, where):
    prompts = tmp_path / "p.jsonl"
    if text is not None:
        prompts.write_text(text, encoding="utf-8")
    status, err = bench(route, prompts, tmp_path / "out", capsys)
    assert status == 2
    assert err.strip() == err.strip().splitlines()[0] and "Traceback" not in err, err
    assert f"{prompts}{where}" in err, err
    assert "no-small" not in err and "no-large" not in err  # the program was not loaded
    assert not (tmp_path / "out").exists()


def test_good_prompts_pass_the_check_and_the_program_is_loaded_next(route, tmp_path, capsys):
    """The control: with a prompt set that reads, the run goes on and fails on the missing models."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "a"}\n', encoding="utf-8")
    status, err = bench(route, prompts, tmp_path / "out", capsys)
    assert status != 0 and "no-small" in err and str(prompts) not in err, err
