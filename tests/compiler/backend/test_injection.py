"""Nothing a .route file (or a hand-crafted IR) says can become code in the generated module."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest
import torch

from tests.compiler.conftest import write_random_weights
from tokenrouter.compiler import ir
from tokenrouter.protocol.step import StepTensors
from tokenrouter.compiler.backend.codegen import CodegenError, generate_module
from tokenrouter.compiler.backend.compiled import load_routers

EVIL = [
    "slm'); import os; os.system('touch /tmp/pwned'); ('",
    'slm"""\nimport os\nos.system("touch /tmp/pwned")\n"""',
    "a\\\nimport os",
    "{{ 7*7 }}{% for x in range(3) %}x{% endfor %}",
    "x\r__import__('os').system('id')",
    "x\u2028import os\u2029y\x0c\x00",
    "#\n" * 3,
    "\\N{LATIN SMALL LETTER A}' + __import__('os').getcwd() + '",
]
FORBIDDEN = {"os", "system", "__import__", "eval", "exec", "open", "getcwd", "subprocess"}


def _evil_program(name_a: str, name_b: str, file_name: str, router: str) -> ir.Program:
    span = ir.Span(file_name, 3, 1, 3, 9)
    net = ir.RouterNet(router, name_a, "w.safetensors", inputs=(ir.InputHidden(-1, 4),), span=span)
    return ir.Program(
        source=file_name, language_version=1, start=name_a, routers=(net,),
        models=(ir.Model(name_a, "x", span=span), ir.Model(name_b, "y", span=span)),
        transitions=(ir.Transition(name_a, name_b, ir.Compare(">", ir.RouterProb(router), ir.Const(0.5)),
                                   "rewrite", span),
                     ir.Transition(name_b, name_a, ir.Compare("<=", ir.Entropy(name_b, True), ir.Const(0.5)),
                                   "keep", span)),
        bounds=(ir.VisitBound(name_b, 1, 4, name_a, span),),
        ensembles=(ir.Ensemble(name_a + name_b, (name_a, name_b), (0.5, 0.5), span=span),))


def _names_in(tree: ast.AST) -> set[str]:
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Attribute):
            out.add(n.attr)
    return out


def _blank_strings(tree: ast.AST) -> str:
    for n in ast.walk(tree):
        if isinstance(n, ast.Constant) and isinstance(n.value, str):
            n.value = ""
        if isinstance(n, ast.JoinedStr):  # f-strings of error messages: same shape either way
            n.values = []
    return ast.dump(tree)


@pytest.mark.parametrize("i", range(len(EVIL)))
def test_crafted_names_stay_string_literals(i, tmp_path):
    evil = EVIL[i]
    program = _evil_program(evil, evil + "2", evil + ".route", evil + "r")
    source = generate_module(program)
    tree = ast.parse(source)
    assert not (_names_in(tree) & FORBIDDEN)
    # the same code as for a benign program, once string constants are blanked out
    benign = ast.parse(generate_module(_evil_program("a", "a2", "a.route", "ar")))
    assert _blank_strings(tree) == _blank_strings(benign)
    # every line of the source is either code we wrote or a comment; the names survive
    # exactly, as data
    write_random_weights(program, tmp_path)
    routers = load_routers(program, base_dir=str(tmp_path))
    assert list(routers) == list(program.writers())
    b = 3
    step = StepTensors(logits=torch.randn(b, 6), sampled=torch.zeros(b, dtype=torch.int64),
                       visit_tokens=torch.ones(b, dtype=torch.int64), position=torch.arange(b),
                       request_seed=torch.arange(b), hidden={-1: torch.randn(b, 4)})
    assert routers[evil].route(step).shape == (2, b)
    for line in source.splitlines():
        assert "\r" not in line and "\x0c" not in line


@pytest.mark.slow
def test_generated_module_never_runs_injected_code(tmp_path):
    """End to end in a fresh interpreter: load the routers of the crafted program and route."""
    marker = tmp_path / "pwned"
    evil = f"a'); open({str(marker)!r}, 'w'); ('"
    program = _evil_program(evil, "b\nopen(" + repr(str(marker)) + ", 'w')", "x.route", "r")
    write_random_weights(program, tmp_path)
    code = (
        "import sys, torch\n"
        "from tokenrouter.compiler import ir\n"
        "from tokenrouter.compiler.backend.compiled import load_routers\n"
        f"p = ir.Program.from_json(sys.stdin.read())\n"
        f"r = load_routers(p, base_dir={str(tmp_path)!r})\n"
        "print(sorted(r) == sorted(p.writers()))\n")
    out = subprocess.run([sys.executable, "-c", code], input=program.to_json(), capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"
    assert not marker.exists()


@pytest.mark.parametrize("bad", [
    ir.Const("1) ; import os ; (1"),  # type: ignore[arg-type]
    ir.Const(True),  # type: ignore[arg-type]
    ir.Bernoulli(0.5, "3; import os"),  # type: ignore[arg-type]
    ir.Bernoulli("0.5 or __import__('os')", 1),  # type: ignore[arg-type]
    ir.Compare("; import os;", ir.Const(1), ir.Const(2)),  # type: ignore[arg-type]
    ir.Arith("+__import__('os')+", ir.Const(1), ir.Const(2)),  # type: ignore[arg-type]
    ir.Logic("and not __import__('os') or", (ir.Const(1),)),  # type: ignore[arg-type]
])
def test_crafted_values_are_rejected(bad):
    program = ir.Program(source="x.route", language_version=1, models=(ir.Model("a", "x"), ir.Model("b", "y")),
                         start="a", transitions=(ir.Transition("a", "b", bad, "keep"),))
    with pytest.raises(CodegenError):
        generate_module(program)


@pytest.mark.parametrize("field, value", [
    ("max_tokens", "3\nimport os"), ("min_tokens", 1.5), ("max_tokens", True),
])
def test_crafted_bounds_are_rejected(field, value):
    bound = ir.VisitBound("b", then="a", **{field: value})
    program = ir.Program(source="x.route", language_version=1, models=(ir.Model("a", "x"), ir.Model("b", "y")),
                         start="a", bounds=(bound,))
    with pytest.raises(CodegenError):
        generate_module(program)


def test_crafted_ensemble_and_router_values_are_rejected():
    models = (ir.Model("a", "x"), ir.Model("b", "y"))
    for ens in (ir.Ensemble("e", ("a", "b"), (0.5, "0.5+1")),  # type: ignore[arg-type]
                ir.Ensemble("e", ("a", "b"), (0.5, 0.5), topk_union="2; x"),  # type: ignore[arg-type]
                ir.Ensemble("e", ("a", "b"), (0.5, 0.5), seed="0 or 1")):  # type: ignore[arg-type]
        with pytest.raises(CodegenError):
            generate_module(ir.Program(source="x", language_version=1, models=models, start="a", ensembles=(ens,)))
    net = ir.RouterNet("r", "a", "w", inputs=(ir.InputHidden("-1) or (1", 4),))  # type: ignore[arg-type]
    with pytest.raises(CodegenError):
        generate_module(ir.Program(source="x", language_version=1, models=models, start="a", routers=(net,),
                                   transitions=(ir.Transition("a", "b", ir.RouterProb("r"), "keep"),)))
    with pytest.raises(CodegenError):
        generate_module(ir.Program(source="x", language_version=1, models=(ir.Model(7, "x"),), start=7))  # type: ignore[arg-type]
