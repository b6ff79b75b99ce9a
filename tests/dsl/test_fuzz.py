"""Property tests: random bytes and random mutations of the examples (tokens and lines
deleted, duplicated, swapped) only ever produce the language's own diagnostics."""

from __future__ import annotations

import re

from hypothesis import HealthCheck, given, settings, strategies as st

from tokenrouter.compiler.pipeline import check_source
from tokenrouter.dsl.diagnostics import CODES, render_all
from tokenrouter.dsl.format import format_source
from tokenrouter.dsl.parser import parse_bytes, parse_source
from tokenrouter.runtime.loader import model_facts

from .conftest import EXAMPLES

TEXTS = [p.read_text() for p in sorted(EXAMPLES.glob("*.route"))]
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FEWER = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def assert_own_diagnostics(program, diags, text):
    assert program is not None or any(d.is_error for d in diags)
    for d in diags:
        assert d.code in CODES
        assert d.message and "Traceback" not in d.message
    render_all(diags, text)  # rendering never fails either


@SETTINGS
@given(st.binary(max_size=400))
def test_random_bytes(data):
    tree, diags, text = parse_bytes(data, "fuzz.route")
    if tree is None:  # every syntax error, each in the language's codes and inside the text
        assert diags and all(d.code in CODES for d in diags)
        lines = text.split("\n")
        for d in diags:
            assert d.span is None or not text or 1 <= d.span.line <= len(lines), d
        assert diags == sorted(diags, key=lambda d: d.sort_key())
        render_all(diags, text)
        return
    assert_own_diagnostics(*check_source(text, "fuzz.route", base_dir="/nonexistent", model_facts=model_facts), text)


def tokens(text):
    return re.findall(r'"[^"\n]*"|#[^\n]*|\w+|->|<=|>=|==|!=|\S|\s+', text)


@st.composite
def mutated(draw):
    text = draw(st.sampled_from(TEXTS))
    by_lines = draw(st.booleans())
    parts = text.split("\n") if by_lines else tokens(text)
    for _ in range(draw(st.integers(1, 4))):
        if not parts:
            break
        i = draw(st.integers(0, len(parts) - 1))
        op = draw(st.sampled_from(["delete", "duplicate", "swap"]))
        if op == "delete":
            del parts[i]
        elif op == "duplicate":
            parts.insert(i, parts[i])
        else:
            j = draw(st.integers(0, len(parts) - 1))
            parts[i], parts[j] = parts[j], parts[i]
    return ("\n" if by_lines else "").join(parts)


@SETTINGS
@given(mutated())
def test_mutated_examples(text):
    program, diags = check_source(text, "mutant.route", base_dir=str(EXAMPLES), model_facts=model_facts)
    assert_own_diagnostics(program, diags, text)
    tree, _ = parse_source(text)
    if tree is not None:  # whatever parses also formats, round-trips and is idempotent
        out, _ = format_source(text)
        assert parse_source(out)[0] == tree
        assert format_source(out)[0] == out


@st.composite
def two_broken_lines(draw):
    """An example with a stray ')' at the end of two different code lines."""
    text = draw(st.sampled_from(TEXTS))
    lines = text.split("\n")
    code = [i for i, l in enumerate(lines) if l.strip() and not l.lstrip().startswith("#")]
    a, b = sorted(draw(st.lists(st.sampled_from(code), min_size=2, max_size=2, unique=True)))
    for i in (a, b):
        lines[i] = lines[i].split("#")[0].rstrip() + " )"
    return "\n".join(lines), (a + 1, b + 1)


@FEWER
@given(two_broken_lines())
def test_every_syntax_error_is_reported(case):
    """Two separate mistakes give (at least) two diagnostics, one on each line."""
    text, lines = case
    tree, diags = parse_source(text, "two.route")
    assert tree is None
    assert {d.span.line for d in diags} >= set(lines), (lines, [str(d.span) for d in diags])
    assert all(d.code in ("E001", "E003") for d in diags)


_NAMES = st.sampled_from(["tau", "threshold", "handoff", "nosuch", "slm", "k", "t"])
_VALUES = st.one_of(st.text(max_size=12), st.floats(allow_nan=True, allow_infinity=True).map(str),
                    st.integers(-10**12, 10**12).map(str), st.sampled_from(["20ms", "1s", "-0", "1e400", "0x1", ""]))


@FEWER
@given(st.sampled_from(sorted(EXAMPLES.glob("*.route"))), st.dictionaries(_NAMES, _VALUES, max_size=3),
       st.dictionaries(_NAMES, st.sampled_from(["smollm2-135m", "./x", ""]), max_size=2))
def test_random_settings_and_bindings(path, params, models):
    """Whatever --set and --model say, the result is a program or the language's own
    diagnostics, and a program's parameters are exactly what was set or defaulted."""
    text = path.read_text()
    program, diags = check_source(text, str(path), params=params, model_paths=models or None, model_facts=model_facts)
    assert_own_diagnostics(program, diags, text)
    if program is not None:
        assert set(params) <= {p.name for p in program.params}
        for p in program.params:
            assert p.origin == ("set" if p.name in params else "default")
            assert p.lo is None or p.lo <= p.value <= p.hi


_LITS = st.sampled_from(["0", "1", "0.3", "-0.5", "2.5", "20ms", "1s", '"x"', '"w.safetensors"', "8", "[0, 1]"])


@st.composite
def param_programs(draw):
    """Random parameter declarations (any type word, default, range) and uses of them in a
    rule, a visit bound, the serve block and a weights file."""
    names = draw(st.lists(st.sampled_from(["tau", "k", "wait", "w", "where", "raw"]), min_size=1, max_size=4))
    lines = ["tokenrouter 1"]
    for n in names:
        t = draw(st.sampled_from(["float", "int", "duration", "path", "string", "flaot"]))
        d = f" = {draw(_LITS)}" if draw(st.booleans()) else ""
        r = f" in [{draw(_LITS)}, {draw(_LITS)}]" if draw(st.booleans()) else ""
        lines.append(f"param {n}: {t}{d}{r}")
    use = lambda: draw(st.sampled_from(names + ["0.5", "3", "20ms"]))  # noqa: E731
    weights = draw(st.sampled_from(names + ['"r.safetensors"']))
    lines += ['model slm = "smollm2-135m-small"', "model llm { role = large }",
              f"router r on slm = {weights} {{ inputs = [hidden(-1)] }}",
              "route {", "  start slm", f"  slm -> llm when entropy(slm, normalized) > {use()} or r > {use()} rewrite",
              f"  visit llm max {use()} then slm", "}", f"serve {{ max_wait = {use()}  place llm = {use()} }}"]
    return "\n".join(lines) + "\n", draw(st.dictionaries(st.sampled_from(names), _LITS, max_size=2))


@FEWER
@given(param_programs())
def test_random_parameter_programs(case):
    text, given_values = case
    program, diags = check_source(text, "p.route", base_dir="/nonexistent", params=given_values,
                                  model_paths={"llm": "smollm2-135m"}, model_facts=model_facts)
    assert_own_diagnostics(program, diags, text)
    tree, _ = parse_source(text)
    out, _ = format_source(text)
    assert parse_source(out)[0] == tree and format_source(out)[0] == out
