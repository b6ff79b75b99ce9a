"""Lowering to the IR: each example means what its paper says, paths resolve relative to
the .route file, model_paths points programs at tiny models, and every failure is a
RouteError or a diagnostic, never a traceback."""

from __future__ import annotations

import json

import pytest

from tokenrouter.compiler import ir
from tokenrouter.compiler.pipeline import RouteError, check_file, check_source, load_program
from tokenrouter.compiler.builtins import BUILTIN_MODELS
from tokenrouter.runtime.loader import model_facts

from .conftest import EXAMPLES, write_model_folder

ALL = sorted(EXAMPLES.glob("*.route"))


def const(x):
    return ir.Const(float(x))


def strip(expr):
    """An IR expression without spans, for comparison with an expected tree."""
    import dataclasses

    if isinstance(expr, tuple):
        return tuple(strip(e) for e in expr)
    if not dataclasses.is_dataclass(expr):
        return expr
    changes = {f.name: strip(getattr(expr, f.name)) for f in dataclasses.fields(expr) if f.name != "span"}
    if any(f.name == "span" for f in dataclasses.fields(expr)):
        changes["span"] = None
    return dataclasses.replace(expr, **changes)


def test_every_example_checks_clean():
    assert {p.stem for p in ALL} >= {"r2r", "citer", "co_llm", "rstitch", "ensemble", "demo", "bench"}
    for path in ALL:
        program, diags = check_file(path, model_facts=model_facts)
        assert diags == [], (path, diags)
        assert program is not None and program.source == str(path)
        assert ir.Program.from_json(program.to_json()) == program


def rule(program, i):
    t = program.transitions[i]
    return t.source, t.dest, strip(t.when), t.action


def test_r2r_means_what_the_paper_says():
    p, _ = check_file(EXAMPLES / "r2r.route", model_facts=model_facts)
    assert p.start == "slm" and [m.path for m in p.models] == ["smollm2-135m-small", "smollm2-135m"]
    assert [(m.name, m.role) for m in p.models] == [("slm", "small"), ("llm", "large")]
    assert rule(p, 0) == ("slm", "llm", ir.Compare(">=", ir.RouterProb("r2r"), const(0.406)), "rewrite")
    assert p.bounds == (ir.VisitBound("llm", 1, 1, "slm", p.bounds[0].span),)
    (router,) = p.routers
    assert router.model == "slm" and router.file == str(EXAMPLES / "weights" / "r2r_router.safetensors")
    assert [type(i) for i in router.inputs] == [ir.InputHidden, ir.InputTokenEmbedding, ir.InputTopkLogits]
    assert router.inputs[0].layer == -1 and router.inputs[2].k == 100
    assert dict(p.schedule.batch) == {"slm": 1, "llm": "auto"}
    assert dict(p.schedule.max_wait_ms) == {"slm": 20.0, "llm": 20.0}


def test_citer_co_llm_and_rstitch_thresholds_point_the_papers_way():
    citer, _ = check_file(EXAMPLES / "citer.route", model_facts=model_facts)
    assert rule(citer, 0) == ("slm", "llm", ir.Compare("<", ir.RouterProb("citer"), const(0.5)), "rewrite")
    co, _ = check_file(EXAMPLES / "co_llm.route", model_facts=model_facts)
    head = ir.HeadLogit("slm", str(EXAMPLES / "weights" / "co_llm_defer_head.safetensors"), True)
    assert rule(co, 0) == ("slm", "llm", ir.Compare(">", head, const(0.5)), "rewrite")
    assert co.bounds[0].max_tokens == 1 and co.bounds[0].then == "slm"
    rs, _ = check_file(EXAMPLES / "rstitch.route", model_facts=model_facts)
    assert rule(rs, 0) == ("slm", "llm", ir.Compare(">", ir.Entropy("slm", True), const(0.02)), "rewrite")
    assert rule(rs, 1) == ("llm", "slm", ir.Compare("<=", ir.Entropy("llm", True), const(0.02)), "keep")
    assert rs.bounds == ()


def test_ensemble_and_bench():
    p, _ = check_file(EXAMPLES / "ensemble.route", model_facts=model_facts)
    (e,) = p.ensembles
    assert (e.name, e.members, e.weights, e.mode, e.topk_union) == ("duo", ("llm", "aux"), (0.8, 0.2), "average", 20)
    assert rule(p, 0)[1] == "duo" and p.bounds[0].writer == "duo"
    assert {m.name: m.role for m in p.models} == {"slm": "small", "llm": "member", "aux": "member"}
    b, _ = check_file(EXAMPLES / "bench.route", model_facts=model_facts)
    assert rule(b, 0) == ("small", "large", ir.Bernoulli(0.05, 1234), "rewrite")
    assert dict(b.schedule.batch) == {"large": "auto"}
    assert {m.path for m in b.models} <= set(BUILTIN_MODELS)


def test_mixture_lowering_and_arith():
    text = """tokenrouter 1
model a = "smollm2-135m"
model b = "smollm2-135m-small"
ensemble m = mixture(a: 0.25, b: 0.75) { seed = 9 }
route {
  start m
  m -> a when top_prob(a) - margin(b) * 2 > 0.1 and not visit_tokens < 3 keep
  visit a min 2 max 4 then m
}
serve { graph_batch_sizes = [1, 2, 4]  graph_tokens = [1, 4]  place a = "cuda:0"  threads b = 2 }
"""
    p, diags = check_source(text, "mem.route", model_facts=model_facts)
    assert diags == []
    assert p.ensembles[0].mode == "mixture" and p.ensembles[0].seed == 9 and p.ensembles[0].weights == (0.25, 0.75)
    cond = strip(p.transitions[0].when)
    want = ir.Logic("and", (
        ir.Compare(">", ir.Arith("-", ir.TopProb("a"), ir.Arith("*", ir.Margin("b"), const(2))), const(0.1)),
        ir.Logic("not", (ir.Compare("<", ir.VisitTokens(), const(3)),))))
    assert cond == want
    assert p.bounds[0] == ir.VisitBound("a", 2, 4, "m", p.bounds[0].span)
    s = p.schedule
    assert s.graph_batch_sizes == (1, 2, 4) and s.graph_tokens == (1, 4)
    assert s.placement == (("a", "cuda:0"),) and s.threads == (("b", 2),)


def test_load_program_fills_router_widths_from_tiny_models(tiny_pair):
    # the shipped router weights fit the embedded models, not these (E310): not read here
    p = load_program(EXAMPLES / "r2r.route", model_paths=tiny_pair, check_weights=False, model_facts=model_facts)
    assert [m.path for m in p.models] == [tiny_pair["slm"], tiny_pair["llm"]]
    hidden, emb, topk = p.routers[0].inputs
    assert (hidden.dim, emb.dim, topk.k) == (24, 24, 100)  # the small model's hidden size, not the large one's


def test_load_program_checks_layers_and_tokenizers(tmp_path, tiny_pair):
    src = tmp_path / "deep.route"
    src.write_text((EXAMPLES / "r2r.route").read_text().replace("hidden(-1)", "hidden(3)"))
    with pytest.raises(RouteError) as err:
        load_program(src, model_paths=tiny_pair, model_facts=model_facts)
    assert "E306" in str(err.value) and "has 2 layers" in str(err.value)
    other = write_model_folder(tmp_path / "other", 24, 2, ["<unk>", "x", "y"])
    with pytest.raises(RouteError) as err:
        load_program(EXAMPLES / "rstitch.route", model_paths={**tiny_pair, "llm": other}, model_facts=model_facts)
    assert "E309" in str(err.value) and "do not share a tokenizer" in str(err.value)
    with pytest.raises(RouteError) as err:
        load_program(EXAMPLES / "rstitch.route", model_paths={**tiny_pair, "llm": str(tmp_path / "none")}, model_facts=model_facts)
    assert "E308" in str(err.value)
    with pytest.raises(RouteError) as err:
        load_program(EXAMPLES / "rstitch.route", model_paths={"nope": "x"}, model_facts=model_facts)
    assert "E707" in str(err.value) and "no model 'nope'" in str(err.value)


def test_paths_resolve_relative_to_the_route_file(tmp_path):
    (tmp_path / "sub").mkdir()
    folder = write_model_folder(tmp_path / "sub" / "m", 8, 1)
    src = tmp_path / "sub" / "p.route"
    src.write_text('tokenrouter 1\nmodel a = "./m"\nmodel b = "smollm2-135m"\n'
                   'router r on a = "w/r.safetensors" { inputs = [token_embedding, entropy(raw)] }\n'
                   'route { start a  a -> b when r > 0.5 rewrite  visit b max 1 then a }\n')
    p, diags = check_file(src, model_facts=model_facts)
    assert diags == []
    assert p.models[0].path == folder and p.models[1].path == "smollm2-135m"
    assert p.routers[0].file == str(tmp_path / "sub" / "w" / "r.safetensors")
    assert p.routers[0].inputs[0].dim == 8  # a checkpoint folder is read even by check_file
    assert strip(p.routers[0].inputs[1].expr) == ir.Entropy("a", False)


def test_load_program_error_is_rendered(tmp_path):
    src = tmp_path / "bad.route"
    src.write_text("tokenrouter 1\nmodel a = \"smollm2-135m\"\nroute { start b }\n")
    with pytest.raises(RouteError) as err:
        load_program(src, model_facts=model_facts)
    text = str(err.value)
    assert f"{src}:3:15: error[E102]: undefined model or ensemble 'b'" in text
    assert " 3 | route { start b }" in text and err.value.diagnostics[0].code == "E102"


@pytest.mark.parametrize("data", [b"", b"\x00\x01\x02\xff" * 100, b"tokenrouter 1\n" + b"(" * 10_000,
                                  b"tokenrouter 1\nroute { start a a -> b when " + b"not " * 10_000 + b"x keep }",
                                  b"tokenrouter 1\nroute { start a a -> b when x" + b" or x" * 10_000 + b" keep }",
                                  b"tokenrouter 1\nroute {" * 3000, b"\"" * 5000, b"tokenrouter 1\n" + b"#" * 100_000])
def test_hostile_inputs_give_diagnostics(tmp_path, data):
    src = tmp_path / "x.route"
    src.write_bytes(data)
    program, diags = check_file(src, model_facts=model_facts)
    assert program is None and diags and all(d.is_error for d in diags[:1])
    with pytest.raises(RouteError):
        load_program(src, model_facts=model_facts)


def test_ten_megabytes_is_refused_quickly(tmp_path):
    src = tmp_path / "big.route"
    src.write_bytes(b"tokenrouter 1\n" + b"model a = \"smollm2-135m\"\n" * 400_000)
    program, diags = check_file(src, model_facts=model_facts)
    assert program is None and [d.code for d in diags] == ["E006"]


def test_missing_file():
    program, diags = check_file("/nonexistent/x.route", model_facts=model_facts)
    assert program is None and diags[0].code == "E004" and "cannot read" in diags[0].message


def test_ir_json_round_trip_keeps_spans():
    p, _ = check_file(EXAMPLES / "r2r.route", model_facts=model_facts)
    data = json.loads(p.to_json())
    assert data["transitions"][0]["span"]["line"] == p.transitions[0].span.line
    assert ir.Program.from_json(p.to_json()).transitions[0].span == p.transitions[0].span


def test_every_syntax_error_stays_fast_on_hostile_input():
    """The recovering parse is bounded: runs of bad characters are one diagnostic each, at
    most MAX_SYNTAX_ERRORS are reported, and a file over RECOVER_LIMIT reports its first."""
    import time

    from tokenrouter.dsl.parser import MAX_SYNTAX_ERRORS, RECOVER_LIMIT, parse_source

    cases = {"run": "tokenrouter 1\n" + "@" * 50_000, "spaced": "tokenrouter 1\n" + "@ " * 20_000,
             "lines": "tokenrouter 1\n" + "model a = x\n" * 2000,
             "large": "tokenrouter 1\n" + 'model a = "smollm2-135m"\n' * (RECOVER_LIMIT // 20) + "route {"}
    counts = {}
    for name, text in cases.items():
        t = time.perf_counter()
        tree, diags = parse_source(text)
        assert tree is None and time.perf_counter() - t < 20, name
        counts[name] = len(diags)
    assert counts == {"run": 1, "spaced": MAX_SYNTAX_ERRORS, "lines": MAX_SYNTAX_ERRORS, "large": 1}
