"""Parameters and bindings through the public API and the commands: `params` and
`model_paths` on check_file / check_source / load_program, what the IR records, and
`--set` / `--model` on every command that loads a program."""

from __future__ import annotations

import argparse
import os

import pytest

from tokenrouter.cli import main
from tokenrouter.commands._args import add_binding_args, bindings, pairs
from tokenrouter.compiler import ir
from tokenrouter.compiler.pipeline import RouteError, check_file, check_source, load_program
from tokenrouter.runtime.loader import model_facts

from .conftest import EXAMPLES

RSTITCH = EXAMPLES / "rstitch.route"

TYPED = """tokenrouter 1
param tau: float = 0.3 in [0, 1]
param steps: int = 2 in [1, 8]
param wait: duration = 20ms in [0ms, 1s]
param weights: path = "w/r.safetensors"
param where: string = "cpu"
model slm = "smollm2-135m-small"
model llm { role = large }
router r on slm = weights { inputs = [hidden(-1)] }
route {
  start slm
  slm -> llm when entropy(slm, normalized) > tau or r >= 0.9 rewrite
  visit llm max steps then slm
}
serve {
  max_wait = wait
  place llm = where
}
"""


def codes(diags):
    return [d.code for d in diags]


def thresholds(program):
    return [t.when.right.value for t in program.transitions]


def test_defaults_are_bound_and_recorded():
    p, diags = check_file(RSTITCH, model_facts=model_facts)
    assert diags == []
    (tau,) = p.params
    assert (tau.name, tau.type, tau.value, tau.origin, tau.text, tau.lo, tau.hi) == \
        ("tau", "float", 0.02, "default", "0.02", 0.0, 1.0)
    assert tau.span.line == next(i for i, l in enumerate(RSTITCH.read_text().splitlines(), 1)
                                 if l.startswith("param tau"))
    assert thresholds(p) == [0.02, 0.02]
    assert all(t.when.right.param == "tau" for t in p.transitions)  # each use remembers its parameter


def test_set_overrides_and_the_ir_says_so():
    p, diags = check_file(RSTITCH, params={"tau": "0.3"}, model_facts=model_facts)
    assert diags == [] and thresholds(p) == [0.3, 0.3]
    assert (p.param("tau").value, p.param("tau").origin, p.param("tau").text) == (0.3, "set", "0.3")
    again = ir.Program.from_json(p.to_json())
    assert again == p and again.params == p.params


def test_every_type_and_where_it_is_used(tmp_path):
    src = tmp_path / "typed.route"
    src.write_text(TYPED)
    p, diags = check_file(src, model_paths={"llm": "smollm2-135m"}, model_facts=model_facts)
    assert diags == []
    assert [(q.name, q.type, q.value) for q in p.params] == [
        ("tau", "float", 0.3), ("steps", "int", 2), ("wait", "duration", 20.0),
        ("weights", "path", str(tmp_path / "w" / "r.safetensors")), ("where", "string", "cpu")]
    assert p.bounds[0].max_tokens == 2 and dict(p.schedule.max_wait_ms)["llm"] == 20.0
    assert p.routers[0].file == str(tmp_path / "w" / "r.safetensors")
    assert dict(p.schedule.placement) == {"llm": "cpu"}
    p, diags = check_file(src, model_paths={"llm": "smollm2-135m"},
                          params={"steps": "4", "wait": "1s", "weights": "other.safetensors", "where": "cuda:1",
                                  "tau": "1"}, model_facts=model_facts)
    assert diags == [], diags
    assert p.bounds[0].max_tokens == 4 and dict(p.schedule.max_wait_ms)["slm"] == 1000.0
    assert p.routers[0].file == os.path.abspath("other.safetensors")  # a --set path is relative to the cwd
    assert dict(p.schedule.placement)["llm"] == "cuda:1" and p.transitions[0].when.args[0].right.value == 1.0


@pytest.mark.parametrize("given, code, words", [
    ({"tau": "abc"}, "E702", ["--set tau=abc", "'abc' is not a number", "parameter 'tau'", "[0, 1]"]),
    ({"tau": "1.5"}, "E703", ["--set tau=1.5", "outside the range of parameter 'tau'", "[0, 1]"]),
    ({"tau": "nan"}, "E702", ["not a finite number"]),
    ({"steps": "2.5"}, "E702", ["not a whole number", "'steps'"]),
    ({"steps": "9"}, "E703", ["[1, 8]"]),
    ({"wait": "20"}, "E702", ["needs a unit"]),
    ({"wait": "2s"}, "E703", ["[0ms, 1000ms]"]),
    ({"tua": "0.3"}, "E704", ["no parameter 'tua'"]),
])
def test_bad_values_name_the_parameter_and_the_declaration(tmp_path, given, code, words):
    src = tmp_path / "typed.route"
    src.write_text(TYPED)
    p, diags = check_file(src, model_paths={"llm": "smollm2-135m"}, params=given, model_facts=model_facts)
    assert p is None and codes(diags) == [code]
    d = diags[0]
    text = d.message + " " + (d.hint or "")
    assert all(w in text for w in words), text
    if code == "E704":
        assert d.span is None and d.hint == "did you mean 'tau'?"
    else:  # the declaration's file:line:col
        name = next(iter(given))
        assert d.span.file == str(src) and d.span.line == TYPED.splitlines().index(
            next(l for l in TYPED.splitlines() if l.startswith(f"param {name}"))) + 1


def test_model_declared_by_role_needs_a_binding(tmp_path):
    src = tmp_path / "typed.route"
    src.write_text(TYPED)
    p, diags = check_file(src, model_facts=model_facts)
    assert p is None and codes(diags) == ["E706"] and "--model llm=PATH" in diags[0].hint
    p, diags = check_source(TYPED, str(src), model_paths={"llm": "./models/big"}, model_facts=model_facts)
    assert diags == [] and p.model("llm").path == os.path.abspath("models/big")  # relative to the cwd
    assert p.model("llm").role == "large"


def test_model_paths_still_replace_declared_paths(tmp_path):
    p, diags = check_file(RSTITCH, model_paths={"llm": "smollm2-135m-small", "slm": str(tmp_path)}, model_facts=model_facts)
    assert diags == []
    assert p.model("llm").path == "smollm2-135m-small"  # a built-in name stays a name
    assert p.model("slm").path == str(tmp_path)


def test_load_program_takes_params(tiny_pair):
    p = load_program(RSTITCH, model_paths=tiny_pair, params={"tau": "0.4"}, model_facts=model_facts)
    assert thresholds(p) == [0.4, 0.4] and p.param("tau").origin == "set"
    with pytest.raises(RouteError) as err:
        load_program(RSTITCH, model_paths=tiny_pair, params={"tau": "x"}, model_facts=model_facts)
    assert "E702" in str(err.value) and "rstitch.route:" in str(err.value)


def test_default_is_the_old_literal():
    """The examples' parameters only moved the literals: the defaults give the programs
    they were, the IR equal to one written with the number in place."""
    text = RSTITCH.read_text()
    literal = text.replace("> tau rewrite", "> 0.02 rewrite").replace("<= tau keep", "<= 0.02 keep")
    literal = "\n".join(l for l in literal.splitlines() if not l.startswith("param tau"))
    a, _ = check_source(text, "a.route", model_facts=model_facts)
    b, diags = check_source(literal, "a.route", model_facts=model_facts)
    assert diags == []
    strip = lambda p: [(t.source, t.dest, t.when.op, t.when.right.value, t.action) for t in p.transitions]
    assert strip(a) == strip(b)


# ------------------------------------------------------------------ command line


def parse(argv):
    parser = argparse.ArgumentParser()
    add_binding_args(parser)
    return parser.parse_args(argv)


def test_pairs_and_bindings():
    assert pairs(["a=1", "b=x=y", "c="], "--set") == {"a": "1", "b": "x=y", "c": ""}
    for bad, why in [(["a"], "takes NAME=VALUE"), (["=1"], "takes NAME=VALUE"), (["a b=1"], "is not a name"),
                     (["a=1", "a=2"], "given twice")]:
        with pytest.raises(ValueError, match=why):
            pairs(bad, "--set")
    assert bindings(parse([])) == (None, None)
    assert bindings(parse(["--set", "tau=0.3", "--model", "llm=./m", "--set", "k=2"])) == (
        {"tau": "0.3", "k": "2"}, {"llm": "./m"})
    with pytest.raises(ValueError, match="--model takes NAME=PATH"):
        bindings(parse(["--model", "oops"]))
    with pytest.raises(ValueError, match="needs a path"):
        bindings(parse(["--model", "llm="]))


def test_check_command_set(capsys):
    assert main(["check", str(RSTITCH), "--set", "tau=0.3"]) == 0
    assert capsys.readouterr().err == f"{RSTITCH}: ok\n"
    assert main(["check", str(RSTITCH), "--set", "tau=abc"]) == 1
    err = capsys.readouterr().err
    assert "rstitch.route:" in err and "error[E702]: --set tau=abc" in err and "parameter 'tau'" in err
    assert main(["check", str(RSTITCH), "--set", "nosuch=1"]) == 1
    err = capsys.readouterr().err
    assert "error[E704]: --set nosuch=1: the program has no parameter 'nosuch'" in err
    assert main(["check", str(RSTITCH), "--set", "tau"]) == 2
    assert "--set takes NAME=VALUE" in capsys.readouterr().err
    assert main(["check", "--emit", "ir", str(RSTITCH), "--set", "tau=0.25"]) == 0
    p = ir.Program.from_json(capsys.readouterr().out)
    assert thresholds(p) == [0.25, 0.25] and p.param("tau").origin == "set"


def test_compile_command_set(capsys, tmp_path):
    assert main(["compile", str(RSTITCH), "--emit", "ir", "--set", "tau=0.125"]) == 0
    assert thresholds(ir.Program.from_json(capsys.readouterr().out)) == [0.125, 0.125]
    assert main(["compile", str(RSTITCH), "--emit", "plan", "--set", "tau=0.125"]) == 0
    import json
    assert json.loads(capsys.readouterr().out)["params"] == [
        {"name": "tau", "type": "float", "value": 0.125, "origin": "set"}]
    assert main(["compile", str(RSTITCH), "--emit", "python", "--set", "tau=2"]) == 1
    assert "E703" in capsys.readouterr().err
    assert main(["compile", str(RSTITCH), "--emit", "ir", "--model", "lm=x"]) == 1
    assert "no model 'lm'" in capsys.readouterr().err


def test_serve_and_bench_take_the_same_flags(capsys):
    """Errors in --set/--model come before any model is loaded or server started."""
    assert main(["serve", str(RSTITCH), "--set", "tau=abc", "--port", "1"]) == 1
    assert "E702" in capsys.readouterr().err
    assert main(["serve", str(RSTITCH), "--set", "tau"]) == 2
    assert "--set takes NAME=VALUE" in capsys.readouterr().err
    assert main(["bench", str(RSTITCH), "--set", "tau"]) == 2
    assert "--set takes NAME=VALUE" in capsys.readouterr().err
    assert main(["bench", str(RSTITCH), "--model", "oops", "--quick"]) == 2
    assert "--model takes NAME=PATH" in capsys.readouterr().err


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.route")), ids=lambda p: p.stem)
def test_every_example_takes_its_thresholds_as_parameters(path):
    """Each example declares a parameter; a bad value for it is one diagnostic (no cascade
    where it is used), and a good one checks clean."""
    p, _ = check_file(path, model_facts=model_facts)
    assert p.params, path.name
    for param in p.params:
        q, diags = check_file(path, params={param.name: "not-a-number"}, model_facts=model_facts)
        assert q is None and codes(diags) == ["E702"], (param.name, diags)
        good = str((param.lo + param.hi) / 2) if param.lo is not None else "0.5"
        q, diags = check_file(path, params={param.name: good}, model_facts=model_facts)
        assert diags == [] and q.param(param.name).origin == "set"
