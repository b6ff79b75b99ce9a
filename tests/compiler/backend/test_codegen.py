"""Code generation: golden modules, determinism, the seeded hash, needs, checks of the IR."""

from __future__ import annotations

import ast
import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.compiler.conftest import EXAMPLES, PROGRAMS, REPO, UPDATE_GOLDEN, get_program, write_random_weights
from tokenrouter.protocol import features, handoff, router
from tokenrouter.compiler import ir
from tokenrouter.protocol.step import FeatureNeeds, StepTensors
from tokenrouter.compiler.backend.codegen import CodegenError, generate_module
from tokenrouter.compiler.backend.compiled import load_module, load_routers

GOLDEN = REPO / "tests" / "compiler" / "backend" / "golden"
KEYS = [f"example:{n}" for n in EXAMPLES] + sorted(PROGRAMS)


@pytest.mark.parametrize("key", KEYS)
def test_golden_module(key, tmp_path):
    """The generated module of every program, byte for byte; TOKENROUTER_UPDATE_GOLDEN=1 rewrites."""
    source = generate_module(get_program(key, tmp_path))
    path = GOLDEN / (key.replace("example:", "example_") + ".py.txt")
    if UPDATE_GOLDEN:
        path.write_text(source)
    assert path.exists(), f"no golden file {path.name}: run with TOKENROUTER_UPDATE_GOLDEN=1"
    assert source == path.read_text(), f"{path.name} changed: review, then TOKENROUTER_UPDATE_GOLDEN=1"


@pytest.mark.parametrize("key", KEYS)
def test_module_is_deterministic_and_survives_ir_json(key, tmp_path):
    program = get_program(key, tmp_path)
    again = ir.Program.from_json(program.to_json())
    assert generate_module(program) == generate_module(program) == generate_module(again)


def test_every_rule_is_commented_with_its_line(tmp_path):
    program = get_program("example:rstitch", tmp_path)
    source = generate_module(program)
    for t in program.transitions:
        assert f"# rstitch.route:{t.span.line}: {t.source} -> {t.dest} when" in source
    comments = [ln for ln in source.splitlines() if ln.strip().startswith("# rstitch.route:")]
    assert len(comments) == len(program.transitions)


def test_needs_follow_the_rules(tmp_path):
    routers = {}
    for key in ("r2r", "citer", "co_llm", "rstitch"):
        program = PROGRAMS[key]()
        write_random_weights(program, tmp_path)
        routers[key] = load_routers(program, base_dir=str(tmp_path))
    assert routers["r2r"]["slm"].needs == FeatureNeeds((-1,), True)
    assert routers["citer"]["slm"].needs == FeatureNeeds((2,), False)
    assert routers["co_llm"]["slm"].needs == FeatureNeeds((-1,), False)
    for key in routers:
        assert routers[key]["llm"].needs == FeatureNeeds((), False)
        assert [r.index for r in routers[key].values()] == [0, 1]


def _step(logits, visit, seeds=None, positions=None):
    b = logits.shape[0]
    return StepTensors(logits=logits, sampled=torch.zeros(b, dtype=torch.int64),
                       visit_tokens=torch.as_tensor(visit, dtype=torch.int64),
                       position=torch.as_tensor(positions if positions is not None else [0] * b),
                       request_seed=torch.as_tensor(seeds if seeds is not None else [0] * b))


def test_route_on_hand_made_batch():
    """R-Stitch at tau 0.3 on rows whose entropies are known: uniform (1.0), one-hot (0),
    NaN (stays), and the large model's bound of 6 tokens."""
    routers = load_routers(PROGRAMS["rstitch"]())
    v = 8
    logits = torch.zeros(4, v)
    logits[1, 1:] = float("-inf")  # one-hot
    logits[2, 3] = float("nan")
    logits[3, :] = torch.tensor([9.0, 0, 0, 0, 0, 0, 0, 0])  # H ~ 0.0087 nats, normalised 0.004
    slm = routers["slm"].route(_step(logits, [1, 1, 1, 1]))
    assert slm.tolist() == [[1, 0, 0, 0], [0, 1, 1, 1]]  # only the uniform row leaves, rewriting
    llm = routers["llm"].route(_step(logits, [1, 1, 1, 6]))
    assert llm.tolist() == [[1, 0, 1, 0], [1, 1, 1, 1]]  # low entropy goes back keeping; NaN stays
    llm = routers["llm"].route(_step(logits[:1], [6]))
    assert llm.tolist() == [[0], [1]]  # the bound forces the way back, keeping the token


@settings(max_examples=300, derandomize=True, database=None, deadline=None)
@given(seed=st.integers(0, 2**64 - 1), rs=st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=8),
       pos=st.integers(0, 2**40))
def test_seeded_hash_matches_ir(seed, rs, pos):
    """The int64-tensor splitmix64 the modules import equals ir.bernoulli_uniform bit for bit."""
    module = _hash_module()
    assert module.uniform is features.uniform
    c = ir.splitmix64(seed)
    c = c - (1 << 64) if c >= 1 << 63 else c
    positions = [pos + i for i in range(len(rs))]
    got = module.uniform(c, torch.tensor(rs), torch.tensor(positions)).tolist()
    assert got == [ir.bernoulli_uniform(seed, r, p) for r, p in zip(rs, positions)]


_HASH = {}


def _hash_module():
    if "m" not in _HASH:
        _HASH["m"] = load_module(generate_module(PROGRAMS["bench"]()))
    return _HASH["m"]


def test_bernoulli_rate_and_independence_of_batch_layout():
    """The coin comes up at its rate, and a request's draw depends on (seed, position) only."""
    routers = load_routers(PROGRAMS["bench"]())
    n = 20_000
    logits = torch.zeros(n, 4)
    seeds = torch.arange(n) * 7919 - 10**12
    out = routers["slm"].route(_step(logits, [1] * n, seeds, torch.arange(n)))
    rate = (out[0] == 1).float().mean().item()
    assert abs(rate - 0.2) < 0.015
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(0))
    shuffled = routers["slm"].route(_step(logits, [1] * n, seeds[perm], torch.arange(n)[perm]))
    assert torch.equal(shuffled, out[:, perm])


def test_mixture_member_frequencies():
    """mixture(a: 1, b: 2, c: 1): each member's log-probs are returned at its rate."""
    program = PROGRAMS["mixture"]()
    r = load_routers(program)["mix"]
    n, v = 12_000, 5
    member = [torch.full((n, v), 0.0) for _ in range(3)]
    for i in range(3):
        member[i][:, i] = 5.0  # member i puts its mass on token i
    step = StepTensors(logits=None, sampled=torch.zeros(n, dtype=torch.int64),
                       visit_tokens=torch.ones(n, dtype=torch.int64), position=torch.arange(n),
                       request_seed=torch.full((n,), 42), member_logits=tuple(member))
    chosen = r.combine(step).argmax(-1)
    freq = torch.bincount(chosen, minlength=3).float() / n
    assert torch.allclose(freq, torch.tensor([0.25, 0.5, 0.25]), atol=0.015)


def test_average_with_topk_union_by_hand():
    """average(a: 1, b: 3) over 4 tokens, top-1 union (ties included)."""
    program = ir.Program(source="t.route", language_version=1, models=(ir.Model("a", "x"), ir.Model("b", "y")),
                         start="e", ensembles=(ir.Ensemble("e", ("a", "b"), (1.0, 3.0), topk_union=1),))
    r = load_routers(program)["e"]
    la = torch.log(torch.tensor([[0.4, 0.4, 0.1, 0.1]], dtype=torch.float64))
    lb = torch.log(torch.tensor([[0.1, 0.2, 0.3, 0.4]], dtype=torch.float64))
    step = StepTensors(logits=None, sampled=torch.zeros(1, dtype=torch.int64), visit_tokens=torch.ones(1, dtype=torch.int64),
                       position=torch.zeros(1, dtype=torch.int64), request_seed=torch.zeros(1, dtype=torch.int64),
                       member_logits=(la, lb))
    # mixture p = 0.25 a + 0.75 b = [0.175, 0.25, 0.25, 0.325]; union of top-1s = {0, 1, 3}
    p = torch.tensor([0.175, 0.25, 0.0, 0.325])
    expected = p / p.sum()
    torch.testing.assert_close(r.combine(step).exp()[0].float(), expected)


# ------------------------------------------------------------------ invalid IR


def _program(**kw):
    base = dict(source="bad.route", language_version=1, models=(ir.Model("slm", "x"), ir.Model("llm", "y")),
                start="slm")
    base.update(kw)
    return ir.Program(**base)


@pytest.mark.parametrize("program, message", [
    (_program(transitions=(ir.Transition("slm", "llm", ir.Compare(">", ir.Entropy("llm", True), ir.Const(0.3)),
                                         "rewrite", ir.Span("bad.route", 4, 1, 4, 9)),)),
     "bad.route:4: the step of 'slm' does not read 'llm'"),
    (_program(start="nobody"), "start writer 'nobody' is not declared"),
    (_program(bounds=(ir.VisitBound("llm", 1, 3, None),)), "sets max but no 'then'"),
    (_program(transitions=(ir.Transition("slm", "llm", ir.RouterProb("ghost"), "rewrite"),)), "unknown router 'ghost'"),
    (_program(transitions=(ir.Transition("slm", "zz", ir.Const(1), "rewrite"),)), "undeclared writer"),
    (_program(ensembles=(ir.Ensemble("e", ("slm", "llm"), (1.0,)),)), "one weight per member"),
])
def test_invalid_ir_is_a_clear_error(program, message):
    with pytest.raises(CodegenError, match=message.replace("(", r"\(").replace(")", r"\)")):
        generate_module(program)


def test_router_of_the_other_model_is_refused():
    router = ir.RouterNet("r", "llm", "w.safetensors", inputs=(ir.InputHidden(-1, 4),))
    program = _program(routers=(router,), transitions=(
        ir.Transition("slm", "llm", ir.Compare(">", ir.RouterProb("r"), ir.Const(0.5)), "rewrite"),))
    with pytest.raises(CodegenError, match="reads 'llm'"):
        generate_module(program)


def _imports(source: str) -> set[str]:
    tree = ast.parse(source)
    imports = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    return imports | {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}


def test_module_imports_only_torch_and_the_protocol(tmp_path):
    """A generated module imports torch and its fixed library, which imports only the protocol."""
    import inspect
    assert _imports(inspect.getsource(features)) == {"__future__", "math", "torch"}
    assert _imports(inspect.getsource(router)) == {"__future__", "torch", "tokenrouter.protocol",
                                                   "tokenrouter.protocol.step"}
    assert _imports(inspect.getsource(handoff)) == {"__future__", "tokenrouter.protocol.state"}
    for key in KEYS:
        imports = _imports(generate_module(get_program(key, tmp_path)))
        assert imports == {"torch", "tokenrouter.protocol.features", "tokenrouter.protocol.router"}, (key, imports)


def test_route_has_no_loop_over_requests(tmp_path):
    """`route` is one tensor program: no for/while in any route body."""
    for key in KEYS:
        tree = ast.parse(generate_module(get_program(key, tmp_path)))
        for fn in ast.walk(tree):
            if isinstance(fn, ast.FunctionDef) and fn.name == "route":
                assert not any(isinstance(n, (ast.For, ast.While, ast.comprehension)) for n in ast.walk(fn)), key


def test_dataclass_replace_keeps_spans_out_of_code(tmp_path):
    """Moving the program to another folder changes no byte of the module (basenames only)."""
    program = get_program("example:r2r", tmp_path)
    moved = dataclasses.replace(program, source="/elsewhere/deep/r2r.route")
    assert generate_module(moved) == generate_module(program)
