"""`compiler.needs` (what a writer reads of its step besides the logits) and `ir.walk`.

`writer_needs` is the one answer generated modules declare (`Router.needs`), the
single-request reference computes for its interpreter, and the serving plan lists;
`input_needs` is what `fit` collects for a router's inputs.
"""

from __future__ import annotations

import pytest

from tests.compiler.conftest import EXAMPLES, PROGRAMS, get_program
from tokenrouter.compiler import ir
from tokenrouter.compiler.backend.codegen import generate_module
from tokenrouter.compiler.backend.compiled import load_module
from tokenrouter.compiler.needs import input_needs, writer_needs
from tokenrouter.protocol.step import FeatureNeeds

KEYS = [f"example:{n}" for n in EXAMPLES] + sorted(PROGRAMS)


def _reads_head(program: ir.Program, writer: str) -> bool:
    return any(isinstance(e, ir.HeadLogit) for t in program.transitions_from(writer) for e in ir.walk(t.when))


@pytest.mark.parametrize("key", KEYS)
def test_every_writer_reads_its_routers_inputs_and_its_heads_final_state(key, tmp_path):
    """On every example and hand-built program: the generated module declares `writer_needs`,
    and (every router there being used by a rule of the model it reads) that is the inputs
    of the routers on the model plus layer -1 for a head row: what the reference computed."""
    program = get_program(key, tmp_path)
    module = load_module(generate_module(program))
    for cls in module.ROUTERS:
        needs = writer_needs(program, cls.NAME)
        assert cls().needs == needs
        on_model = input_needs([i for r in program.routers if r.model == cls.NAME for i in r.inputs])
        layers = set(on_model.hidden_layers) | ({-1} if _reads_head(program, cls.NAME) else set())
        assert needs == FeatureNeeds(tuple(sorted(layers)), on_model.token_embedding), (key, cls.NAME)


def _program(routers, when, writer="slm"):
    models = (ir.Model("slm", "a"), ir.Model("llm", "b"))
    return ir.Program(source="t.route", language_version=1, models=models, start="slm", routers=tuple(routers),
                      transitions=(ir.Transition(writer, "llm" if writer == "slm" else "slm", when, "rewrite"),))


def test_only_the_routers_a_writers_rules_use_are_read():
    used = ir.RouterNet("used", "slm", "u.safetensors", (ir.InputHidden(3, 8), ir.InputTopkLogits(4)))
    unused = ir.RouterNet("unused", "slm", "v.safetensors", (ir.InputHidden(1, 8), ir.InputTokenEmbedding(8)))
    program = _program([used, unused], ir.Compare(">", ir.RouterProb("used"), ir.Const(0.5)))
    assert writer_needs(program, "slm") == FeatureNeeds((3,), False)
    assert writer_needs(program, "llm") == FeatureNeeds((), False)


def test_a_head_row_reads_the_final_hidden_state_in_a_rule_or_a_routers_input():
    head = ir.HeadLogit("slm", "h.safetensors", True)
    program = _program([], ir.Logic("not", (ir.Compare("<", head, ir.Const(0.5)),)))
    assert writer_needs(program, "slm") == FeatureNeeds((-1,), False)
    router = ir.RouterNet("r", "slm", "r.safetensors", (ir.InputHidden(2, 8), ir.InputScalar(head)))
    program = _program([router], ir.Compare(">", ir.RouterProb("r"), ir.Const(0.5)))
    assert writer_needs(program, "slm") == FeatureNeeds((-1, 2), False)


def test_input_needs_of_the_papers_layouts():
    r2r = (ir.InputHidden(-1, 16), ir.InputTokenEmbedding(16), ir.InputTopkLogits(100))
    citer = (ir.InputHidden(-1, 16),)
    scalars = (ir.InputScalar(ir.Entropy("slm", True)), ir.InputScalar(ir.TopProb("slm")))
    assert input_needs(r2r) == FeatureNeeds((-1,), True)
    assert input_needs(citer) == FeatureNeeds((-1,), False)
    assert input_needs(scalars) == FeatureNeeds((), False)
    assert input_needs((ir.InputHidden(5, 8), ir.InputHidden(0, 8), ir.InputHidden(5, 8))) == FeatureNeeds((0, 5))


def test_walk_visits_a_node_before_its_operands_left_to_right():
    a, b, c = ir.TopProb("a"), ir.Margin("b"), ir.Const(1.0)
    left = ir.Arith("+", a, b)
    cmp = ir.Compare("<", left, c)
    tree = ir.Logic("or", (cmp, ir.VisitTokens()))
    assert list(ir.walk(tree)) == [tree, cmp, left, a, b, c, ir.VisitTokens()]
    assert list(ir.walk(c)) == [c]
