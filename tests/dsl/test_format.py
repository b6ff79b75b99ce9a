"""`fmt`: one canonical layout, comments kept, idempotent, and parse(fmt(x)) == parse(x)."""

from __future__ import annotations

import pytest

from tokenrouter.dsl.format import format_source
from tokenrouter.dsl.parser import parse_source

from .conftest import EXAMPLES

GOLDEN = EXAMPLES.parent / "tests" / "dsl" / "golden"
SOURCES = sorted(EXAMPLES.glob("*.route")) + sorted(GOLDEN.glob("*.route"))


def parses(path):
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return None
    tree, _ = parse_source(text, str(path))
    return (text, tree) if tree is not None else None


CASES = [p for p in SOURCES if parses(p)]


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_round_trip_and_idempotence(path):
    text, tree = parses(path)
    once, diags = format_source(text)
    assert diags == []
    again, _ = format_source(once)
    assert again == once
    tree2, _ = parse_source(once)
    assert tree2 == tree
    assert [c.text for c in tree2.comments] == [c.text for c in tree.comments]


def test_examples_are_already_formatted():
    for path in EXAMPLES.glob("*.route"):
        text = path.read_text()
        assert format_source(text)[0] == text, path.name


MESSY = '''# top
tokenrouter   1
model slm="smollm2-135m-small"{role=small dtype=float32}# after the block
model llm = "smollm2-135m"   # the large one


route{start slm
 # why we hand off
 slm->llm when(entropy(slm,normalized)>0.3 and top_prob(slm)<0.5)or margin(slm)<=0.1 rewrite
 llm -> slm when not(entropy(llm,normalized)>0.3)and -1*-visit_tokens<=-(2-1) keep
 # last words
}
serve{batch llm=auto max_wait=20ms graph_batch_sizes=[1,2,4]}
'''

CANONICAL = '''# top
tokenrouter 1
model slm = "smollm2-135m-small" {  # after the block
  role = small
  dtype = float32
}
model llm = "smollm2-135m"  # the large one

route {
  start slm
  # why we hand off
  slm -> llm when entropy(slm, normalized) > 0.3 and top_prob(slm) < 0.5 or margin(slm) <= 0.1 rewrite
  llm -> slm when not (entropy(llm, normalized) > 0.3) and -1 * -visit_tokens <= -(2 - 1) keep
  # last words
}
serve {
  batch llm = auto
  max_wait = 20ms
  graph_batch_sizes = [1, 2, 4]
}
'''


def test_canonical_layout():
    out, _ = format_source(MESSY)
    assert out == CANONICAL
    assert parse_source(out)[0] == parse_source(MESSY)[0]


@pytest.mark.parametrize("expr", ["a - (b - c)", "(a or b) and c", "a or b and c", "-(a + b) * c", "a / (b * c)",
                                  "not (a and b)", "(a > b) == (c > d)", "a - -b"])
def test_parentheses_only_where_needed_and_meaning_kept(expr):
    text = f"tokenrouter 1\nroute {{\n  x -> y when {expr} keep\n}}\n"
    out, _ = format_source(text)
    assert parse_source(out)[0] == parse_source(text)[0]
    assert f"when {expr} keep" in out  # each of these is already minimal


def test_syntax_error_is_reported_not_formatted():
    out, diags = format_source("tokenrouter 1\nroute {")
    assert out is None and diags[0].code == "E003"


def test_docs_list_every_diagnostic_code():
    from tokenrouter.dsl.diagnostics import CODES

    doc = (EXAMPLES.parent / "docs" / "language.md").read_text()
    for code, (severity, title) in CODES.items():
        assert f"| `{code}` | {severity} | {title} |" in doc


MESSY_PARAMS = '''tokenrouter 1
param   tau :float=0.3 in[0,1]   # the threshold
param k:int
param wait : duration = 20ms in [ 1ms , 1s ]
param w:path="weights/r.safetensors"
model slm="smollm2-135m-small"
model llm{role=large}
model spare
router r on slm=w{inputs=[hidden(-1)]}
route{start slm slm->llm when entropy(slm,normalized)>tau or r>-(-tau) rewrite visit llm max k then slm}
serve{max_wait=wait}
'''

CANONICAL_PARAMS = '''tokenrouter 1
param tau: float = 0.3 in [0, 1]  # the threshold
param k: int
param wait: duration = 20ms in [1ms, 1s]
param w: path = "weights/r.safetensors"
model slm = "smollm2-135m-small"
model llm {
  role = large
}
model spare
router r on slm = w {
  inputs = [hidden(-1)]
}
route {
  start slm
  slm -> llm when entropy(slm, normalized) > tau or r > --tau rewrite
  visit llm max k then slm
}
serve {
  max_wait = wait
}
'''


def test_parameters_and_unbound_models_format_canonically_and_round_trip():
    out, diags = format_source(MESSY_PARAMS)
    assert diags == [] and out == CANONICAL_PARAMS
    assert parse_source(out)[0] == parse_source(MESSY_PARAMS)[0]
    assert format_source(out)[0] == out
