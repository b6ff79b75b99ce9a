"""`tokenrouter compile`: module, plan and IR on disk and on stdout; clear errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tokenrouter.cli import main
from tokenrouter.compiler import ir
from tokenrouter.compiler.backend.codegen import generate_module
from tokenrouter.compiler.pipeline import check_file
from tokenrouter.runtime.loader import model_facts

REPO = Path(__file__).resolve().parents[2]


def test_writes_module_plan_and_ir(tmp_path, capsys):
    out = tmp_path / "build"
    assert main(["compile", str(REPO / "examples" / "r2r.route"), "-o", str(out)]) == 0
    program, _ = check_file(REPO / "examples" / "r2r.route", model_facts=model_facts)
    source = (out / "router.py").read_text()
    assert source == generate_module(program)
    compile(source, "router.py", "exec")
    assert ir.Program.from_json((out / "ir.json").read_text()) == program
    plan = json.loads((out / "plan.json").read_text())
    assert [m["name"] for m in plan["models"]] == ["slm", "llm"]
    assert plan["models"][1]["batch"] == "auto" and plan["models"][0]["max_wait_ms"] == 20.0
    assert plan["writers"][0]["needs"] == {"hidden_layers": [-1], "token_embedding": True}
    assert plan["weights"] == [program.routers[0].file]
    import hashlib
    assert plan["module_sha256"] == hashlib.sha256(source.encode()).hexdigest()


def test_emit_python_and_ir(capsys):
    path = str(REPO / "examples" / "rstitch.route")
    assert main(["compile", path, "--emit", "python"]) == 0
    program, _ = check_file(path, model_facts=model_facts)
    assert capsys.readouterr().out == generate_module(program)
    assert main(["compile", path, "--emit", "ir"]) == 0
    assert ir.Program.from_json(capsys.readouterr().out) == program


def test_ir_json_is_accepted_as_input(tmp_path, capsys):
    program, _ = check_file(REPO / "examples" / "ensemble.route", model_facts=model_facts)
    (tmp_path / "p.json").write_text(program.to_json())
    assert main(["compile", str(tmp_path / "p.json"), "--emit", "python"]) == 0
    assert capsys.readouterr().out == generate_module(program)


def test_bad_input_is_a_message_not_a_traceback(tmp_path, capsys):
    bad = tmp_path / "bad.route"
    bad.write_text('tokenrouter 1\nmodel a = "bench-small"\nroute { start b }\n')
    broken = tmp_path / "broken.json"
    broken.write_text('{"ir_version": 1, "models": 3}')
    for args, code in [([str(tmp_path / "missing.route"), "-o", "x"], 2), ([str(broken), "--emit", "python"], 1),
                       ([str(bad)], 2)]:
        assert main(["compile", *args]) == code
        err = capsys.readouterr().err
        assert "error" in err and "Traceback" not in err, (args, err)
    # and once as a real process: a diagnostic on stderr, exit status 1, no traceback
    r = subprocess.run([sys.executable, "-m", "tokenrouter.cli", "compile", str(bad), "--emit", "python"],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 1 and "undefined model or ensemble 'b'" in r.stderr and "Traceback" not in r.stderr
