"""`tokenrouter check` and `tokenrouter fmt`: exit statuses and output streams, run as the
real console command in a subprocess once, in-process otherwise."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tokenrouter.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
GOLDEN = EXAMPLES.parent / "tests" / "dsl" / "golden"


def test_check_examples_exits_0_and_says_ok_for_each_unless_quiet(capsys):
    files = list(map(str, sorted(EXAMPLES.glob("*.route"))))
    assert main(["check", *files]) == 0
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [f"{f}: ok" for f in files] and captured.out == ""
    assert main(["check", "-q", *files]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""


def test_check_exit_statuses(capsys):
    assert main(["check", str(GOLDEN / "w001_ping_pong.route")]) == 0  # warnings only
    err = capsys.readouterr().err
    assert "warning[W001]" in err and err.endswith("w001_ping_pong.route: ok, 1 warning\n")
    assert main(["check", str(EXAMPLES / "r2r.route"), str(GOLDEN / "e404_handoff_to_itself.route")]) == 1
    err = capsys.readouterr().err
    assert "error[E404]" in err and "1 error, 0 warnings" in err
    assert main(["check", "/nonexistent.route"]) == 2
    assert "cannot read '/nonexistent.route'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["check"])
    assert exc.value.code == 2


def test_check_emit_ir(capsys):
    assert main(["check", "--emit", "ir", str(EXAMPLES / "bench.route")]) == 0
    from tokenrouter.compiler import ir
    assert ir.Program.from_json(capsys.readouterr().out).start == "small"


def test_fmt_modes(tmp_path, capsys):
    messy = tmp_path / "m.route"
    messy.write_text('tokenrouter 1\nmodel a="smollm2-135m"  model b = "smollm2-135m-small"\n'
                     'route{start a a->b when top_prob(a)<0.5 rewrite visit b max 1 then a}\n')
    original = messy.read_text()
    assert main(["fmt", str(messy)]) == 0
    formatted = capsys.readouterr().out
    assert formatted.startswith("tokenrouter 1\nmodel a = ") and messy.read_text() == original
    assert main(["fmt", "--check", str(messy)]) == 1
    assert "would reformat" in capsys.readouterr().err and messy.read_text() == original
    assert main(["fmt", "--write", str(messy)]) == 0
    assert messy.read_text() == formatted
    assert main(["fmt", "--check", str(messy)]) == 0
    bad = tmp_path / "bad.route"
    bad.write_text("tokenrouter 1\nroute {")
    assert main(["fmt", "--write", str(bad)]) == 1
    assert "error[E003]" in capsys.readouterr().err and bad.read_text() == "tokenrouter 1\nroute {"
    with pytest.raises(SystemExit) as exc:
        main(["fmt", "--check", "--write", str(messy)])
    assert exc.value.code == 2


def test_console_command_reports_on_stderr():
    exe = shutil.which("tokenrouter") or f"{sys.executable} -m tokenrouter.cli"
    proc = subprocess.run([*exe.split(), "check", str(GOLDEN / "e102_undefined_writer.route")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stdout == ""
    assert "error[E102]: undefined model or ensemble 'lm'" in proc.stderr and "Traceback" not in proc.stderr


def test_check_format_json(capsys):
    """One JSON object per diagnostic and line, on stdout, with the documented keys."""
    import json

    bad = GOLDEN / "e001_several_syntax_errors.route"
    assert main(["check", "--format", "json", str(bad), str(EXAMPLES / "rstitch.route"),
                 "--set", "tau=0.3"]) == 1
    captured = capsys.readouterr()
    assert captured.err == ""
    objs = [json.loads(line) for line in captured.out.splitlines()]
    assert len(objs) == 5 and {o["code"] for o in objs} == {"E001"}
    first = objs[0]
    assert set(first) == {"code", "severity", "file", "line", "col", "end", "message", "hints", "notes"}
    assert (first["file"], first["line"], first["col"], first["end"]) == (str(bad), 3, 11, {"line": 3, "col": 16})
    assert first["severity"] == "error" and first["message"] == "unexpected 'float'" and first["hints"] == ["expected ':'"]
    assert main(["check", "--format", "json", str(EXAMPLES / "rstitch.route"), "--set", "nosuch=1"]) == 1
    (obj,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert obj["code"] == "E704" and obj["line"] is None and obj["file"].endswith("rstitch.route")
    assert main(["check", "--format", "json", str(GOLDEN / "w001_ping_pong.route")]) == 0
    (obj,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert obj["severity"] == "warning" and obj["notes"][0]["line"] >= 1
    assert main(["check", "--format", "json", "--emit", "ir", str(EXAMPLES / "rstitch.route")]) == 2
