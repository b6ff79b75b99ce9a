"""Golden diagnostics: `tokenrouter check` on each bad program in golden/ must print exactly
the stored stderr (and exit status). Regenerate with TOKENROUTER_UPDATE_GOLDEN=1 and review
the diff. Together the programs cover every diagnostic code `check` can emit."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tokenrouter.cli import main
from tokenrouter.dsl.diagnostics import CODES

GOLDEN = Path(__file__).parent / "golden"
PROGRAMS = sorted(GOLDEN.glob("*.route"))
UPDATE = os.environ.get("TOKENROUTER_UPDATE_GOLDEN") == "1"
# E006 needs a multi-megabyte file and E308/E309 real model folders: test_frontend.py has them;
# W004 needs fingerprinted model folders.
NOT_IN_GOLDENS = {"E006", "E308", "E309", "W004"}


def extra_args(program: Path) -> list[str]:
    """A golden whose first line is `# check: ARGS` is checked with those arguments (the
    deployment's --set and --model)."""
    first = program.read_bytes().split(b"\n", 1)[0].decode("utf-8", "replace")
    return first[len("# check:"):].split() if first.startswith("# check:") else []


def run_check(program: Path, capsys, monkeypatch) -> str:
    monkeypatch.chdir(GOLDEN)  # relative paths in the output, the same on every machine
    status = main(["check", program.name, *extra_args(program)])
    captured = capsys.readouterr()
    assert captured.out == ""
    return captured.err + f"exit status: {status}\n"


@pytest.mark.parametrize("program", PROGRAMS, ids=[p.stem for p in PROGRAMS])
def test_golden(program: Path, capsys, monkeypatch):
    got = run_check(program, capsys, monkeypatch)
    expected_file = program.with_suffix(".stderr")
    if UPDATE:
        expected_file.write_text(got, encoding="utf-8")
    assert expected_file.exists(), f"no golden for {program.name}: run with TOKENROUTER_UPDATE_GOLDEN=1"
    assert got == expected_file.read_text(encoding="utf-8")


def test_enough_programs_and_every_code_covered():
    assert len(PROGRAMS) >= 30
    seen = set()
    for golden in GOLDEN.glob("*.stderr"):
        text = golden.read_text(encoding="utf-8")
        seen |= {code for code in CODES if f"[{code}]" in text}
    assert set(CODES) - NOT_IN_GOLDENS - seen == set()


def test_golden_name_matches_its_first_code():
    """e405_*.route must produce E405 (w001_* W001): the file names document the goldens."""
    for program in PROGRAMS:
        code = program.stem.split("_")[0].upper()
        if code in CODES:
            assert f"[{code}]" in program.with_suffix(".stderr").read_text(encoding="utf-8"), program.name
