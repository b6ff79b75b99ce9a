"""The bench's prompts from a file (`workload.chat_prompts`): each asked as one user message
through the program's chat template, cycled to the count asked for; a file that is not a
prompt set is one `PromptsError` naming the file and the line."""

from __future__ import annotations

import pytest

from tests.helpers import tiny
from tokenrouter.bench.workload import chat_prompts
from tokenrouter.prompts import PromptsError
from tokenrouter.runtime.loader.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    tiny.write_tokenizer(str(d))  # ChatML (tiny.CHATML)
    return Tokenizer.from_dir(str(d))


def chatml(ask: str) -> str:
    return f"<|im_start|>user\n{ask}<|im_end|>\n<|im_start|>assistant\n"


def test_each_prompt_is_one_user_message_through_the_template_cycled_to_n(tok, tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "first", "kind": "code"}\n\n  \n{"id": 7, "prompt": "é \\"second\\""}\n',
                    encoding="utf-8")
    assert chat_prompts(str(path), tok, 5) == [chatml(a) for a in ("first", 'é "second"', "first", 'é "second"',
                                                                   "first")]
    assert chat_prompts(str(path), tok, 1) == [chatml("first")]
    assert chat_prompts(str(path), tok, 0) == []


@pytest.mark.parametrize("text,where,what", [
    ('{"prompt": "a"}\n\n{"prompt": "b",\n', ":3:", "not valid JSON"),
    ('{"prompt": "a"}\n{"text": "b"}\n', ":2:", 'expected an object with a non-empty "prompt" string'),
    ('{"prompt": ""}\n', ":1:", 'non-empty "prompt"'),
    ('["a"]\n', ":1:", '"prompt" string'),
    ('{"prompt": 3}\n', ":1:", '"prompt" string'),
    ("\n  \n", ":", "no prompts"),
])
def test_a_file_that_is_not_a_prompt_set_names_file_and_line(tok, tmp_path, text, where, what):
    path = tmp_path / "p.jsonl"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(PromptsError) as e:
        chat_prompts(str(path), tok, 4)
    assert str(e.value).startswith(f"{path}{where}") and what in str(e.value), str(e.value)
    assert "\n" not in str(e.value)


def test_a_missing_or_binary_file_is_named(tok, tmp_path):
    with pytest.raises(PromptsError, match="nope.jsonl: no such prompts file"):
        chat_prompts(str(tmp_path / "nope.jsonl"), tok, 2)
    (tmp_path / "bin.jsonl").write_bytes(b'{"prompt": "\xff"}\n')
    with pytest.raises(PromptsError, match="bin.jsonl: not UTF-8 text"):
        chat_prompts(str(tmp_path / "bin.jsonl"), tok, 2)
