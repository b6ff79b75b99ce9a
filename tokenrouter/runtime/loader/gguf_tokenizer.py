"""A `tokenizers.Tokenizer` rebuilt from a GGUF file's metadata (tokens, merges, token types).

GGUF keeps no tokenizer.json, only the vocabulary and the name of llama.cpp's pre-tokenizer
(`tokenizer.ggml.pre`). We map that name onto the same splitting rules in the `tokenizers`
library: for SmolLM2 ("smollm") every digit is its own piece, then the GPT-2 split applies.
Only byte-level BPE vocabularies (`tokenizer.ggml.model == "gpt2"`: Llama-3, Qwen, SmolLM)
are supported; SentencePiece ones raise a clear error.
"""

from __future__ import annotations

from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from tokenrouter.runtime.loader.errors import UnsupportedArchitecture
from tokenrouter.runtime.loader.tokenizer import Tokenizer

# llama.cpp pre-tokenizer names -> how the text is split before byte-level BPE.
_DIGITS_THEN_GPT2 = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"}
_GPT2 = {"gpt2", "gpt-2", "default", "mpt", "olmo", "jais"}
_LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPLIT_REGEX = {
    **{name: _LLAMA3_REGEX for name in ("llama-bpe", "llama3", "llama-v3", "smaug-bpe", "falcon3", "dbrx")},
    **{name: _QWEN2_REGEX for name in ("qwen2", "deepseek-r1-qwen", "megrez")},
}
_CONTROL, _USER_DEFINED = 3, 4


def _pre_tokenizer(pre: str):
    if pre in _DIGITS_THEN_GPT2:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    if pre in _GPT2:
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in SPLIT_REGEX:
        return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(SPLIT_REGEX[pre]), behavior="isolated"),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    known = sorted(_DIGITS_THEN_GPT2 | _GPT2 | set(SPLIT_REGEX))
    raise UnsupportedArchitecture(
        f"GGUF pre-tokenizer {pre!r} is not supported (known: {', '.join(known)}); "
        "use the model's Hugging Face folder with its tokenizer.json instead")


def tokenizer_from_gguf(meta: dict[str, Any]) -> Tokenizer:
    """`meta` maps GGUF keys (`tokenizer.ggml.tokens`, ...) to their decoded values."""
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise UnsupportedArchitecture(
            f"GGUF tokenizer model {kind!r} is not supported (only byte-level BPE, 'gpt2'); "
            "use the model's Hugging Face folder with its tokenizer.json instead")
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    types = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    vocab = {tok: i for i, tok in enumerate(tokens)}
    backend = HFTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    backend.pre_tokenizer = _pre_tokenizer(meta.get("tokenizer.ggml.pre", "default"))
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t, ty in zip(tokens, types) if ty == _CONTROL])
    backend.add_tokens([AddedToken(t, special=False, normalized=False)
                        for t, ty in zip(tokens, types) if ty == _USER_DEFINED])
    eos = [meta[k] for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                             "tokenizer.ggml.eom_token_id") if k in meta]
    return Tokenizer(backend, chat_template=meta.get("tokenizer.chat_template"),
                     bos_token_id=meta.get("tokenizer.ggml.bos_token_id"), eos_token_ids=eos,
                     add_bos_token=bool(meta.get("tokenizer.ggml.add_bos_token", False)))
