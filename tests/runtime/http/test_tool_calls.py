"""Tool calls read from text (`http/tool_output.py`, `http/tool_parsers.py`), without a
server: the Hermes/Qwen format, malformed calls back as text, a stream split anywhere giving
what the whole text gives, the parser chosen from the chat template, and the forcing
grammar accepting exactly what the parser reads."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import tiny
from tokenrouter.protocol.sampling import Structured
from tokenrouter.runtime.engine.grammar import GrammarError, Grammars
from tokenrouter.runtime.http.tool_output import ToolReply, ToolText
from tokenrouter.runtime.http.tool_parsers import Hermes, ToolCall, choose
from tokenrouter.runtime.http.tools import ToolUse
from tokenrouter.runtime.loader.tokenizer import Tokenizer

USE = ToolUse(Hermes(), frozenset({"get_weather", "f"}), "auto")
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
WEATHER = ToolCall("get_weather", '{"city": "Paris"}')


def split(text: str, use: ToolUse = USE, cuts=()) -> list:
    """`text` through ToolText in the pieces `cuts` makes, merged: adjacent text joined."""
    t, out, last = ToolText(use), [], 0
    for c in [*sorted(cuts), len(text)]:
        out += t.feed(text[last:c])
        last = c
    out += t.finish()
    merged: list = []
    for p in out:
        if isinstance(p, str) and merged and isinstance(merged[-1], str):
            merged[-1] += p
        else:
            merged.append(p)
    return merged


@pytest.mark.parametrize("text, expected", [
    (CALL, [WEATHER]),
    ("Let me look.\n" + CALL + "\n", ["Let me look.", WEATHER]),
    (CALL + "\n" + CALL.replace("Paris", "Oslo"), [WEATHER, ToolCall("get_weather", '{"city": "Oslo"}')]),
    ('<tool_call>\n{"name": "f", "arguments": {}}', [ToolCall("f", "{}")]),  # left open at the end
    ('<tool_call>\n{"name": "f", "parameters": {"x": 1}}\n</tool_call>', [ToolCall("f", '{"x": 1}')]),
    ("no call here <tool", ["no call here <tool"]),
    ("text with a trailing newline\n", ["text with a trailing newline\n"]),
    ("", []),
])
def test_hermes_calls_and_the_text_around_them(text, expected):
    assert split(text) == expected


MALFORMED = [
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par\n</tool_call>',  # not JSON
    '<tool_call>\n{"name": "launch_missiles", "arguments": {}}\n</tool_call>',  # not an offered tool
    '<tool_call>\n{"name": "f", "arguments": [1, 2]}\n</tool_call>',  # arguments not an object
    '<tool_call>\n["f", {}]\n</tool_call>',
    '<tool_call>\n{"name": "get_weather", "argu',  # cut off (max_tokens)
]


@pytest.mark.parametrize("text", MALFORMED)
def test_a_malformed_call_comes_back_as_the_text_it_was(text):
    assert split("Sure:\n" + text) == ["Sure:\n" + text]
    reply = ToolReply(USE)
    assert reply.message("Sure:\n" + text) == {"role": "assistant", "content": "Sure:\n" + text}
    assert reply.finish_reason("stop") == "stop"


def test_a_malformed_call_does_not_hide_a_good_one():
    bad = MALFORMED[1]
    assert split(bad + "\n" + CALL) == [bad, WEATHER]


def test_without_parallel_calls_the_second_call_is_text():
    use = ToolUse(Hermes(), USE.names, "auto", parallel=False)
    assert split(CALL + "\n" + CALL, use) == [WEATHER, "\n" + CALL]


def test_the_message_and_the_finish_reason():
    reply = ToolReply(USE)
    msg = reply.message(CALL)
    assert msg["content"] is None and len(msg["tool_calls"]) == 1
    call = msg["tool_calls"][0]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert reply.finish_reason("stop") == "tool_calls" and reply.finish_reason("length") == "length"


BARE = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
OSLO = ToolCall("get_weather", '{"city": "Oslo"}')


@pytest.mark.parametrize("text, expected", [
    (BARE, [WEATHER]),  # as Qwen2.5-Coder 0.5B and 1.5B write a call
    ("\n " + BARE + "\n", [WEATHER]),
    ("```json\n" + BARE + "\n```", [WEATHER]),
    ("```\n" + BARE + "\n```\nDone.", [WEATHER, "Done."]),
    (BARE + "\n" + BARE.replace("Paris", "Oslo"), [WEATHER, OSLO]),
    (BARE + "\nI asked for the weather.", [WEATHER, "I asked for the weather."]),
    (CALL + "\n" + BARE.replace("Paris", "Oslo"), [WEATHER, OSLO]),
    ('{"name": "f", "arguments": {"s": "a } and a \\" and a {"}}', [ToolCall("f", '{"s": "a } and a \\" and a {"}')]),
    ("Here it is: " + BARE, ["Here it is: " + BARE]),  # not where the reply opens: text
    ('{"answer": 42}', ['{"answer": 42}']),  # JSON that is no call
    (BARE.replace("get_weather", "launch_missiles"), [BARE.replace("get_weather", "launch_missiles")]),
    (BARE[:30], [BARE[:30]]),  # cut off (max_tokens)
    ("```python\nprint(1)\n```", ["```python\nprint(1)\n```"]),
    ("```json\n" + BARE + "\nand more", ["```json\n" + BARE + "\nand more"]),  # a fence left open, then text
])
def test_a_bare_json_call_is_read_where_the_reply_opens_with_it(text, expected):
    assert split(text) == expected


def test_a_parser_without_bare_calls_reads_the_object_as_text():
    class Marked(Hermes):
        bare = False
    assert split(BARE, ToolUse(Marked(), USE.names, "auto")) == [BARE]


def test_without_parallel_calls_a_second_bare_call_is_text():
    use = ToolUse(Hermes(), USE.names, "auto", parallel=False)
    second = BARE.replace("Paris", "Oslo")
    assert split(BARE + "\n" + second, use) == [WEATHER, second]
    reply = ToolReply(use)
    assert reply.message(BARE)["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert reply.finish_reason("stop") == "tool_calls"


TEXTS = [BARE, "```json\n" + BARE + "\n```\nok", BARE + "\n" + BARE, '{"answer": 42} then', "``` not json",
         CALL, "Let me look.\n" + CALL + "\n" + CALL, "a <tool_c b <tool_call> c", MALFORMED[0] + "\nok " + CALL,
         "  lead\n\n" + CALL + "\n\n trail  ", "plain text\n with <tool_call", CALL + "<tool_call>\n{"]


@settings(max_examples=200, deadline=None, derandomize=True)
@given(text=st.sampled_from(TEXTS), cuts=st.lists(st.integers(0, 200), max_size=8))
def test_a_stream_split_anywhere_reads_what_the_whole_text_reads(text, cuts):
    assert split(text, cuts=[c for c in cuts if c <= len(text)]) == split(text)


def test_stream_deltas_add_up_to_the_message():
    text = "Let me look.\n" + CALL + "\n" + CALL
    reply, deltas = ToolReply(USE), []
    for i in range(0, len(text), 3):
        deltas.append(reply.delta(text[i:i + 3], last=i + 3 >= len(text)))
    whole = ToolReply(USE).message(text)
    assert "".join(d.get("content", "") for d in deltas) == whole["content"]
    streamed = [c for d in deltas for c in d.get("tool_calls", [])]
    assert [c["index"] for c in streamed] == [0, 1]
    assert [c["function"] for c in streamed] == [c["function"] for c in whole["tool_calls"]]


def test_the_parser_is_chosen_from_the_template_or_by_name():
    assert isinstance(choose("{{ '<tool_call>' }}"), Hermes)
    assert isinstance(choose(None), Hermes) and isinstance(choose("{{ messages }}", "hermes"), Hermes)
    with pytest.raises(ValueError, match="hermes"):
        choose("{{ messages }}", "mistral")


def test_the_forcing_grammar_accepts_what_the_parser_reads_and_nothing_else(tmp_path):
    tiny.write_tokenizer(str(tmp_path))
    tok = Tokenizer.from_dir(str(tmp_path), eos_token_ids=[1])
    grammars = Grammars(tok)
    functions = [("get_weather", {"type": "object", "properties": {"city": {"type": "string"}},
                                  "required": ["city"]}), ("f", {"type": "object"})]

    def accepts(text: str, parallel: bool) -> bool:
        state = grammars.state(Structured(kind="lark", spec=Hermes().grammar(functions, parallel, tok.token_to_id)))
        try:
            state.advance(tok.encode(text, add_special_tokens=False))
        except GrammarError:
            return False
        return state.matcher.is_accepting()  # a whole sentence (more calls may follow)

    two = CALL + "\n" + '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
    assert accepts(CALL, False) and accepts(two, True) and not accepts(two, False)
    assert not accepts(CALL.replace("get_weather", "nope"), True)
    assert not accepts(CALL.replace('{"city": "Paris"}', "{}"), True)  # a required argument missing
    assert split(two) == [WEATHER, ToolCall("f", "{}")]
    assert json.loads(WEATHER.arguments) == {"city": "Paris"}


def test_a_long_bare_object_fed_one_character_at_a_time_is_one_call():
    """The held object's scan goes on from where the last piece stopped (so it reads a long
    object once, not once per piece), and still finds where the object closes."""
    body = '{"name": "f", "arguments": {"s": "' + "x" * 20_000 + '"}}'
    t = ToolText(USE)
    out = [p for c in body for p in t.feed(c)] + t.finish()
    assert out == [ToolCall("f", json.dumps({"s": "x" * 20_000}))]
