"""Property tests: random bytes and random mutations of the examples (tokens and lines
deleted, duplicated, swapped) only ever produce the language's own diagnostics."""

from __future__ import annotations

import re

from hypothesis import HealthCheck, given, settings, strategies as st

from tokenrouter.compiler.frontend import check_source
from tokenrouter.dsl.diagnostics import CODES, render_all
from tokenrouter.dsl.format import format_source
from tokenrouter.dsl.parser import parse_bytes, parse_source

from .conftest import EXAMPLES

TEXTS = [p.read_text() for p in sorted(EXAMPLES.glob("*.route"))]
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


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
    if tree is None:
        assert len(diags) == 1 and diags[0].code in CODES
        render_all(diags, text)
        return
    assert_own_diagnostics(*check_source(text, "fuzz.route", base_dir="/nonexistent"), text)


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
    program, diags = check_source(text, "mutant.route", base_dir=str(EXAMPLES))
    assert_own_diagnostics(program, diags, text)
    tree, _ = parse_source(text)
    if tree is not None:  # whatever parses also formats, round-trips and is idempotent
        out, _ = format_source(text)
        assert parse_source(out)[0] == tree
        assert format_source(out)[0] == out
