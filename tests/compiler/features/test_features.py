"""The step features' declarations (`compiler/features/`), each checked on its own, so that a
feature added to the catalog is tested without a test of its own: the helper its batched
computation names (`protocol/features.py`) computes what its reference computation does,
on random rows with the edge cases (NaN, +inf, -inf, all -inf, ties); each computation
reads only what the feature declares it reads; the tables derived from the declarations
(the language's functions and router inputs, the IR) hold every feature, the docs name it.
A feature declared outside the catalog goes through the checker, the IR, the code
generator, the interpreter, explain and fit (`test_a_feature_is_its_declaration`)."""

from __future__ import annotations

import dataclasses
import itertools
import subprocess
import sys
import textwrap
import typing

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from tests.compiler.conftest import REPO, make_batch
from tokenrouter.compiler import builtins, ir
from tokenrouter.compiler.backend.interpreter import Interpreter, RequestStep
from tokenrouter.compiler.features import (EMBEDDING, FEATURES, HEAD_ROW, HIDDEN, LOGITS, STEP_NAMES, Int, Word,
                                           feature_of)
from tokenrouter.compiler.needs import input_needs
from tokenrouter.compiler.text import expr_text, input_text
from tokenrouter.compiler.weights.nets import load_head
from tokenrouter.protocol import features as helpers
from tokenrouter.protocol.step import StepTensors

WIDTH = 16  # the conftest's hidden width where a program does not declare one


def examples(decl, head_file: str) -> list:
    """Nodes of the feature `decl` with the argument values worth trying."""
    values = []
    for f in dataclasses.fields(decl.node):
        if f.name in ("span", "kind"):
            continue
        arg = next((a for a in decl.args if a.field == f.name), None)
        if isinstance(arg, Word):
            vals = list(arg.choices.values())
        elif isinstance(arg, Int):
            vals = [-1, 0, 2] if arg.layer else [arg.lo, arg.lo + 2]
        elif f.name == "model":
            vals = ["slm"]
        elif f.name == "file":
            vals = [head_file]
        elif not decl.scalar and f.name == decl.value.width:
            vals = [WIDTH]
        elif f.type == "bool":
            vals = [True, False]
        else:
            raise AssertionError(f"no example value for {decl.name}.{f.name}: teach examples() its type")
        values.append([(f.name, v) for v in vals])
    return [decl.node(**dict(combo)) for combo in itertools.product(*values)]


@pytest.fixture
def all_examples(tmp_path):
    head = tmp_path / "head.safetensors"
    g = torch.Generator().manual_seed(3)
    save_file({"weight": torch.randn(WIDTH, generator=g), "bias": torch.randn(1, generator=g)}, str(head))
    return [(decl, node) for decl in FEATURES.values() for node in examples(decl, str(head))]


def _program(nodes) -> ir.Program:
    """slm and llm; a router that declares every vector example, so that the random batches
    hold hidden states and embeddings of its widths."""
    vectors = tuple(n for n in nodes if not feature_of(n).scalar)
    routers = (ir.RouterNet("r", "slm", "r.safetensors", vectors),) if vectors else ()
    return ir.Program("t.route", 1, (ir.Model("slm", "x"), ir.Model("llm", "y")), "slm", routers=routers)


def _declared_only(decl, node, step: StepTensors, rows: list[RequestStep]):
    """The batch and rows with all the feature does not declare it reads taken away."""
    layers = set(decl.hidden_layers(node))
    keep = lambda h: {k: v for k, v in h.items() if k in layers}  # noqa: E731
    step = dataclasses.replace(step, logits=step.logits if LOGITS in decl.reads else None, hidden=keep(step.hidden),
                               token_embedding=step.token_embedding if EMBEDDING in decl.reads else None)
    rows = [dataclasses.replace(r, logits=r.logits if LOGITS in decl.reads else None, hidden=keep(r.hidden),
                                token_embedding=r.token_embedding if EMBEDDING in decl.reads else None)
            for r in rows]
    return step, rows


def _batched(decl, node, step: StepTensors, base_dir: str) -> np.ndarray:
    """The feature on the batch, in float64, as generated code computes it: its helper,
    given what the step gives that the feature declares it reads."""
    given = {"step": step, "dtype": torch.float64}
    if LOGITS in decl.reads:
        given.update(zip(("x", "p", "bad"), helpers.dist(step.logits, torch.float64)))
    if HEAD_ROW in decl.reads:
        given["row"] = load_head(node, WIDTH, base_dir, dtype=torch.float64)
    args = [given[a] if a in STEP_NAMES else getattr(node, a) for a in decl.batched.args]
    return getattr(helpers, decl.batched.fn)(*args).numpy()


def test_each_feature_computes_on_the_batch_what_its_reference_computes(all_examples, tmp_path):
    program = _program([n for _, n in all_examples])
    interp = Interpreter(program, base_dir=str(tmp_path))
    needs = input_needs(n for _, n in all_examples if not feature_of(n).scalar)
    needs = dataclasses.replace(needs, hidden_layers=tuple(sorted({*needs.hidden_layers, -1})))
    rng = np.random.default_rng(7)
    seen = set()
    for _ in range(6):
        step, rows = make_batch(program, "slm", needs, rng, 24)
        step = dataclasses.replace(step, logits=step.logits.double(), token_embedding=step.token_embedding.double(),
                                   hidden={k: v.double() for k, v in step.hidden.items()})
        for decl, node in all_examples:
            s, r = _declared_only(decl, node, step, rows)
            got = _batched(decl, node, s, str(tmp_path))
            want = np.array([interp.value("slm", row, node) for row in r], dtype=np.float64)
            np.testing.assert_allclose(got, want.reshape(got.shape), rtol=1e-9, atol=1e-12, equal_nan=True,
                                       err_msg=f"{decl.name}: {node}")
            seen.add(decl.name)
    assert seen == set(FEATURES)


def test_the_tables_hold_every_feature_as_its_declaration_says():
    docs = (REPO / "docs" / "language.md").read_text()
    for decl in FEATURES.values():
        assert decl.batched.fn in helpers.__all__, decl.name
        assert all(a in STEP_NAMES or a in decl.node.__dataclass_fields__ for a in decl.batched.args), decl.name
        assert getattr(ir, decl.node.__name__) is decl.node and ir.FEATURE_NODES[decl.node.__name__] is decl.node
        union = ir.Expr if decl.scalar else ir.RouterInput
        assert decl.node in typing.get_args(union), decl.name
        if decl.written == "call":
            assert builtins.FUNCTIONS[decl.name] == decl.signature()
            assert builtins.ROUTER_INPUTS[decl.name] == decl.input_signature()
            assert f"`{decl.name}(" in docs or f"`{decl.name}`" in docs, f"docs/language.md does not name {decl.name}"
        assert (HIDDEN in decl.reads) == (decl.layer is not None), decl.name
    assert list(builtins.FUNCTIONS) == ["entropy", "top_prob", "margin", "bernoulli", "hidden", "token_embedding",
                                        "topk_logits"]


def test_needs_are_what_the_features_read(all_examples):
    for decl, node in all_examples:
        inp = node if not decl.scalar else ir.InputScalar(node)
        needs = input_needs([inp])
        assert needs.hidden_layers == decl.hidden_layers(node)
        assert needs.token_embedding == (EMBEDDING in decl.reads)


def test_the_printer_writes_what_the_checker_reads(tmp_path):
    """A condition and a router input printed by `text.py` check back to the same IR."""
    from tokenrouter.compiler.pipeline import check_source

    source = textwrap.dedent("""\
        tokenrouter 1
        model slm = "smollm2-135m-small"
        model llm = "smollm2-135m"
        router r on slm = "w.safetensors" { inputs = [hidden(-1), token_embedding, topk_logits(4),
                                                       entropy(raw), top_prob, margin] }
        route {
          start slm
          slm -> llm when entropy(slm, normalized) > 0.3 and not (margin(slm) * 2 < 0.1 or r > 0.9) rewrite
          slm -> llm when 1 - top_prob(slm) >= 0.5 or visit_tokens > 3 and bernoulli(0.25, 7) keep
          llm -> slm when entropy(llm, raw) / (1 + margin(llm)) <= 2 keep
        }
        """)
    program, diags = check_source(source, str(tmp_path / "p.route"))
    assert program is not None, diags
    (router,) = program.routers
    assert [input_text(i) for i in router.inputs] == ["hidden(-1)", "token_embedding", "topk_logits(4)",
                                                      "entropy(raw)", "top_prob", "margin"]
    printed = source.split("route {")[0] + "route {\n  start slm\n" + "".join(
        f"  {t.source} -> {t.dest} when {expr_text(t.when)} {t.action}\n" for t in program.transitions) + "}\n"
    again, diags = check_source(printed, str(tmp_path / "p.route"))
    assert again is not None, (printed, diags)
    assert [_no_spans(t) for t in again.transitions] == [_no_spans(t) for t in program.transitions]


def _no_spans(obj):
    """The IR as JSON data without its spans (where a node was written)."""
    if isinstance(obj, dict):
        return {k: _no_spans(v) for k, v in obj.items() if k != "span"}
    if isinstance(obj, list):
        return [_no_spans(x) for x in obj]
    return _no_spans(ir.to_jsonable(obj)) if dataclasses.is_dataclass(obj) else obj


TOY = '''
import math, sys
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from tokenrouter.compiler.features import LOGITS, Call, Scalar
from tokenrouter.compiler.features.declare import step_feature
from tokenrouter.dsl.span import Span


def confidence(e, view):
    d = view.dist()
    return max(math.exp(v) for v in d.logp.tolist()) if d.valid else math.nan


@step_feature(value=Scalar(range=lambda e: (0.0, 1.0), words="confidence"), reads=(LOGITS,),
              batched=Call("top_prob", ("p", "bad")), reference=confidence)
@dataclass(frozen=True)
class Confidence:
    """The probability of the most likely token, under another name: a feature declared
    outside the catalog, and nowhere else."""

    model: str
    span: Span | None = None
    kind: Literal["confidence"] = "confidence"


from collections import Counter

from tests.compiler.conftest import check_route_batch, make_batch, write_random_weights
from tokenrouter.compiler import ir
from tokenrouter.compiler.backend.codegen import generate_module
from tokenrouter.compiler.backend.compiled import load_routers
from tokenrouter.compiler.backend.interpreter import Interpreter
from tokenrouter.compiler.explain.describe import describe
from tokenrouter.compiler.pipeline import check_source
from tokenrouter.compiler.weights.files import layout_text
from tokenrouter.fit.collect import assemble

folder = sys.argv[1]
source = """tokenrouter 1
model slm = "smollm2-135m-small"
model llm = "smollm2-135m"
router r on slm = "r.safetensors" { inputs = [confidence, topk_logits(3)] }
route {
  start slm
  slm -> llm when confidence(slm) < 0.4 or r > 0.9 rewrite
  llm -> slm when confidence(llm) >= 0.4 keep
}
"""
program, diags = check_source(source, folder + "/toy.route")
assert program is not None and not [d for d in diags if d.severity == "error"], diags
bad, diags = check_source(source.replace("confidence(slm) < 0.4", "confidence(slm) < 1.5"), folder + "/toy.route")
assert bad is None and [d.code for d in diags] == ["E305"], diags
assert "slm's confidence lies in [0, 1]" in diags[0].hint
assert ir.Program.from_json(program.to_json()) == program
assert isinstance(program.transitions[1].when.left, ir.Confidence)
assert layout_text(program.routers[0]) == "confidence:1,topk_logits(3):3"
assert "llm -> slm when confidence(llm) >= 0.4" in describe(program)
assert "f1 = top_prob(p0, bad0)" in generate_module(program)
write_random_weights(program, __import__("pathlib").Path(folder))
interp, routers = Interpreter(program, base_dir=folder), load_routers(program, dtype=torch.float64, base_dir=folder)
rng, seen = np.random.default_rng(1), Counter()
for writer in program.writers():
    for _ in range(20):
        step, rows = make_batch(program, writer, routers[writer].needs, rng, 32)
        check_route_batch(program, interp, routers, writer, step, rows, torch.float64, 1e-9, seen)
assert seen[("slm", "transition 0")] and seen[("llm", "stay")], seen
step, rows = make_batch(program, "slm", routers["slm"].needs, rng, 16)
x = assemble(program.routers[0].inputs, step.logits, {}, None)
want = [interp.value("slm", row, program.routers[0].inputs[0].expr) for row in rows]
np.testing.assert_allclose(x[:, 0].numpy(), np.array(want, dtype=np.float32), rtol=1e-6, equal_nan=True)
print("ok")
'''


@pytest.mark.slow
def test_a_feature_is_its_declaration(tmp_path):
    """A feature declared by a program outside the catalog, with nothing else written for
    it, is checked (with its range), carried by the IR and its JSON, explained, laid out in
    a router file, generated (agreeing with the interpreter on random batches) and computed
    by fit: adding a feature is its declaration (docs/architecture.md, the recipe)."""
    out = subprocess.run([sys.executable, "-c", TOY, str(tmp_path)], capture_output=True, text=True, timeout=240,
                         cwd=REPO)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


def test_an_argument_outside_its_declaration_is_one_error_where_it_stands(tmp_path):
    from tokenrouter.compiler.pipeline import check_source

    source = textwrap.dedent("""\
        tokenrouter 1
        model slm = "smollm2-135m-small"
        model llm = "smollm2-135m"
        router r on slm = "w.safetensors" { inputs = [entropy(nats), topk_logits(0)] }
        route {
          start slm
          slm -> llm when entropy(slm, nats) > 0.3 or r > 0.5 rewrite
        }
        """)
    _, diags = check_source(source, str(tmp_path / "p.route"))
    got = [(d.code, d.message, d.span.line, d.span.col, d.hint) for d in diags]
    hint = "normalized divides by log(vocabulary size), so it lies in [0, 1]; raw is in nats"
    assert got == [("E306", "entropy(normalized|raw) takes `normalized` or `raw`", 4, 55, hint),
                   ("E306", "topk_logits(K) takes a whole number K >= 1", 4, 74, None),
                   ("E303", "the second argument of entropy is `normalized` or `raw`", 7, 32, hint)], got
