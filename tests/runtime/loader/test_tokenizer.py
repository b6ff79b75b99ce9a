"""The SmolLM2 tokenizer rebuilt from the embedded GGUF's metadata against two references: a slow
pure-Python encoder following llama.cpp's "smollm" rules, and transformers' own GGUF tokenizer
(which does not isolate digits, so it is compared on digit-free text only)."""

import json

import pytest

from tests.helpers.checkpoints import CHATML, SPECIALS, reference_encode, tiny_tokenizer_json, tiny_vocab
from tokenrouter.runtime.loader import LoadError, Tokenizer
from tokenrouter.runtime.loader.builtin.registry import embedded_gguf
from tokenrouter.runtime.loader.gguf_loader import read_metadata
from tokenrouter.runtime.loader.gguf_tokenizer import tokenizer_from_gguf

STRINGS = [
    "Hello world",
    "  two leading spaces and trailing   ",
    "tabs\tand\nnewlines\n\n\nend",
    "whitespace runs:      done",
    "I'm sure we'll see they've can't",
    "def f(x):\n    return x**2  # square",
    "café naïve résumé Ελληνικά Привет",
    "日本語のテキストと中文",
    "emoji 🙂👍🏽 and symbols ©®™ ∑∫√",
    "In 2024, 3.14159 and 1,000,000 people",
    "x1y22z333 ½ Ⅻ ٣",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>text<jupyter_code>print(1)<empty_output>",
    "",
]


@pytest.fixture(scope="module")
def smollm():
    meta = read_metadata(embedded_gguf())
    return tokenizer_from_gguf(meta), meta


@pytest.mark.slow
@pytest.mark.real_weights
@pytest.mark.parametrize("text", STRINGS)
def test_matches_reference_encoder(smollm, text):
    tok, meta = smollm
    tokens = meta["tokenizer.ggml.tokens"]
    specials = [t for t, ty in zip(tokens, meta["tokenizer.ggml.token_type"]) if ty == 3]
    expected = reference_encode(text, tokens, meta["tokenizer.ggml.merges"], specials)
    assert tok.encode(text) == expected
    assert tok.decode(tok.encode(text)) == text


@pytest.mark.slow
@pytest.mark.real_weights
def test_matches_transformers_on_digit_free_text(smollm, tmp_path):
    from transformers import AutoTokenizer
    tok, _ = smollm
    path = embedded_gguf()
    ref = AutoTokenizer.from_pretrained(path.rsplit("/", 1)[0], gguf_file=path.rsplit("/", 1)[1])
    checked = 0
    for text in STRINGS:
        if not any(c.isnumeric() for c in text):
            assert tok.encode(text) == ref.encode(text, add_special_tokens=False), text
            checked += 1
    assert checked >= 9


@pytest.mark.real_weights
def test_smollm_facts(smollm):
    tok, _ = smollm
    assert tok.vocab_size == 49152
    assert tok.eos_token_ids == (2,) and tok.bos_token_id == 1 and not tok.add_bos_token
    assert tok.encode("<|im_start|><|im_end|>") == [1, 2]
    assert [tok.decode([i]) for i in tok.encode("2024")] == ["2", "0", "2", "4"]


@pytest.mark.real_weights
def test_chat_template_matches_transformers(smollm, tmp_path):
    from transformers import PreTrainedTokenizerFast
    tok, _ = smollm
    tok.save(str(tmp_path))
    ref = PreTrainedTokenizerFast.from_pretrained(str(tmp_path))
    conversations = [
        [{"role": "user", "content": "What is 2+2?"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
         {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}],
    ]
    for messages in conversations:
        for gen in (True, False):
            assert tok.apply_chat_template(messages, add_generation_prompt=gen) == \
                ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
    assert tok.apply_chat_template(conversations[0]) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.real_weights
def test_save_and_reload_keeps_everything(smollm, tmp_path):
    tok, _ = smollm
    tok.save(str(tmp_path))
    again = Tokenizer.from_dir(str(tmp_path))
    assert again.fingerprint == tok.fingerprint
    assert again.eos_token_ids == tok.eos_token_ids and again.bos_token_id == tok.bos_token_id
    assert again.chat_template == tok.chat_template
    for text in STRINGS:
        assert again.encode(text) == tok.encode(text)


def test_fingerprint_tells_vocabularies_apart(tmp_path):
    tiny_tokenizer_json(str(tmp_path))
    a = Tokenizer.from_dir(str(tmp_path))
    b = Tokenizer.from_dir(str(tmp_path))
    assert a.fingerprint == b.fingerprint
    # the same vocabulary with one token renamed is a different vocabulary
    data = json.loads((tmp_path / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    tid = vocab.pop("Ġthe")
    vocab["Ġthe_"] = tid
    data["model"]["merges"] = [m for m in data["model"]["merges"] if m not in (["Ġt", "he"], "Ġt he")]
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    assert Tokenizer.from_dir(str(tmp_path)).fingerprint != a.fingerprint


def test_tiny_vocab_against_reference(tmp_path):
    tiny_tokenizer_json(str(tmp_path))
    tok = Tokenizer.from_dir(str(tmp_path))
    tokens, merges, _ = tiny_vocab()
    for text in ["the world", " the other world", "hello<|im_end|>", "in order 12"]:
        assert tok.encode(text) == reference_encode(text, tokens, merges, SPECIALS, split_digits=False)


def test_chat_template_errors(tmp_path):
    tiny_tokenizer_json(str(tmp_path))
    tok = Tokenizer.from_dir(str(tmp_path))
    assert tok.chat_template == CHATML
    with pytest.raises(LoadError, match="list of"):
        tok.apply_chat_template("just a string")
    tok.chat_template = "{{ raise_exception('roles must alternate') }}"
    with pytest.raises(LoadError, match="roles must alternate"):
        tok.apply_chat_template([{"role": "user", "content": "x"}])
    tok.chat_template = "{% for %}"
    with pytest.raises(LoadError, match="does not parse"):
        tok.apply_chat_template([{"role": "user", "content": "x"}])
    tok.chat_template = None
    with pytest.raises(LoadError, match="no chat template"):
        tok.apply_chat_template([{"role": "user", "content": "x"}])
