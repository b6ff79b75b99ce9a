"""The frontend's text of a request: incremental detokenisation and stop strings, held back
while they may still match, on the tiny byte-level tokenizer (multi-byte characters split
over several tokens)."""

from __future__ import annotations

import pytest

from tests.helpers import tiny
from tokenrouter.runtime.frontend.text import TextStream
from tokenrouter.runtime.loader.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    tiny.write_tokenizer(str(d))
    return Tokenizer.from_dir(str(d))


def run(tok, text, **kw):
    s = TextStream(tok, **kw)
    pieces = [s.push(t) for t in tok.encode(text, add_special_tokens=False)]
    return s, pieces


@pytest.mark.parametrize("text", ["plain ascii", "ü é 漢字 and more", "ends in a split char 漢"])
def test_pieces_join_to_the_decoded_text(tok, text):
    s, pieces = run(tok, text)
    assert "".join(pieces) + s.finish() == text


@pytest.mark.parametrize("text, stop, want", [
    ("hello world, bye", ["world"], "hello "),
    ("hello world, bye", ["zzz", ", b"], "hello world"),
    ("a 漢字 b", ["字 "], "a 漢"),  # a match inside a multi-byte character's tokens
    ("abcabd", ["abd"], "abc"),  # a partial match first
])
def test_a_stop_string_is_withheld_and_ends_the_text(tok, text, stop, want):
    s = TextStream(tok, stop=stop)
    out, n = "", 0
    for t in tok.encode(text, add_special_tokens=False):
        out += s.push(t)
        n += 1
        if s.matched:
            break
        for st in stop:  # never released while it could still become a match
            assert st not in out
    assert s.matched in stop and out + s.finish() == want
    assert n < len(tok.encode(text, add_special_tokens=False)) or text.endswith(s.matched)


def test_include_stop_str_and_stop_ids(tok):
    s = TextStream(tok, stop=["lo"], include_stop_str=True)
    out = "".join(s.push(t) for t in tok.encode("hello", add_special_tokens=False))
    assert s.matched == "lo" and out == "hello"
    s = TextStream(tok, stop_ids=[tiny.EOS])
    ids = tok.encode("hi", add_special_tokens=False) + [tiny.EOS]
    assert "".join(s.push(t) for t in ids) + s.finish() == "hi"
