"""One tokenizer type for every model: a `tokenizers.Tokenizer` plus what serving needs around it
(stop tokens, the chat template rendered with Jinja2, a fingerprint of the vocabulary).

It is built from a Hugging Face folder (`tokenizer.json`, `tokenizer_config.json`) or from a GGUF
file's metadata (see `gguf_tokenizer.py`), and saves itself as such a folder, which is how the
cache stores the tokenizer of a converted GGUF.
"""

from __future__ import annotations

import hashlib
import json
import os
from functools import cached_property
from typing import Any, Iterable, Sequence

from tokenizers import Tokenizer as HFTokenizer

from tokenrouter.runtime.loader.errors import LoadError, MissingFile


def _token_text(value: Any) -> str | None:
    """tokenizer_config.json writes special tokens as a string or as an AddedToken dict."""
    if isinstance(value, dict):
        return value.get("content")
    return value


class Tokenizer:
    """Text <-> token ids for one vocabulary."""

    def __init__(self, backend: HFTokenizer, *, chat_template: str | None = None,
                 bos_token_id: int | None = None, eos_token_ids: Sequence[int] = (),
                 add_bos_token: bool = False):
        self.backend = backend
        self.chat_template = chat_template
        self.bos_token_id = bos_token_id
        self.eos_token_ids = tuple(dict.fromkeys(int(i) for i in eos_token_ids))
        self.add_bos_token = add_bos_token

    # -- construction ---------------------------------------------------------------------------

    @classmethod
    def from_dir(cls, path: str, *, eos_token_ids: Iterable[int] = ()) -> "Tokenizer":
        """Read `tokenizer.json` (required) and `tokenizer_config.json` / `chat_template.jinja`
        (optional) from a Hugging Face checkpoint folder. `eos_token_ids` (from config.json or
        generation_config.json) are added to the tokenizer's own eos token."""
        tj = os.path.join(path, "tokenizer.json")
        if not os.path.isfile(tj):
            raise MissingFile(f"{path}: no tokenizer.json (a checkpoint folder needs one)")
        try:
            backend = HFTokenizer.from_file(tj)
        except Exception as exc:  # the library raises a bare Exception on bad JSON
            raise LoadError(f"{tj}: cannot read the tokenizer: {exc}") from None
        cfg: dict[str, Any] = {}
        cfg_path = os.path.join(path, "tokenizer_config.json")
        if os.path.isfile(cfg_path):
            with open(cfg_path, encoding="utf-8") as f:
                cfg = json.load(f)
        template = cfg.get("chat_template")
        if isinstance(template, list):  # named templates: take the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        jinja_path = os.path.join(path, "chat_template.jinja")
        if template is None and os.path.isfile(jinja_path):
            with open(jinja_path, encoding="utf-8") as f:
                template = f.read()

        def tid(key: str) -> int | None:
            text = _token_text(cfg.get(key))
            return backend.token_to_id(text) if text else None

        eos = [i for i in (tid("eos_token"),) if i is not None] + list(eos_token_ids)
        eos += cfg.get("eos_token_ids", [])  # written by `save`
        return cls(backend, chat_template=template, bos_token_id=tid("bos_token"),
                   eos_token_ids=eos, add_bos_token=bool(cfg.get("add_bos_token", False)))

    def save(self, path: str) -> None:
        """Write tokenizer.json and tokenizer_config.json so `from_dir` (and transformers'
        AutoTokenizer) read the same tokenizer back."""
        self.backend.save(os.path.join(path, "tokenizer.json"))
        cfg = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "add_bos_token": self.add_bos_token,
            "bos_token": self._text(self.bos_token_id),
            "eos_token": self._text(self.eos_token_ids[0]) if self.eos_token_ids else None,
            "eos_token_ids": list(self.eos_token_ids),
            "chat_template": self.chat_template,
        }
        with open(os.path.join(path, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(cfg, f, ensure_ascii=False, indent=1)

    # -- text <-> ids ---------------------------------------------------------------------------

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`. Special tokens written in the text (`<|im_start|>`) become their
        ids. `add_special_tokens` adds the BOS the model expects, if it expects one."""
        ids = self.backend.encode(text, add_special_tokens=False).ids
        if add_special_tokens and self.add_bos_token and self.bos_token_id is not None:
            if not ids or ids[0] != self.bos_token_id:
                ids = [self.bos_token_id] + ids
        return ids

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        """The token's string in the vocabulary (a byte-level token as the vocabulary writes it)."""
        return self.backend.id_to_token(token_id)

    def _text(self, token_id: int | None) -> str | None:
        return None if token_id is None else self.backend.id_to_token(token_id)

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included (the model's vocab may be padded larger)."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    @cached_property
    def fingerprint(self) -> str:
        """A hash of the id -> token table: two models route together only when it is equal."""
        vocab = self.backend.get_vocab(with_added_tokens=True)
        table = sorted(vocab.items(), key=lambda kv: kv[1])
        return hashlib.sha256(json.dumps(table, ensure_ascii=False).encode()).hexdigest()[:16]

    # -- chat ------------------------------------------------------------------------------------

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                            **extra: Any) -> str:
        """Render the model's chat template (Jinja2, sandboxed as transformers does); `extra`
        are more variables of the template, and may set `bos_token` and `eos_token` (as
        transformers lets them)."""
        if not self.chat_template:
            raise LoadError("this model has no chat template; run without --chat")
        from tokenrouter.runtime.loader.chat_template import render
        special = {"bos_token": self._text(self.bos_token_id) or "",
                   "eos_token": self._text(self.eos_token_ids[0]) if self.eos_token_ids else ""}
        return render(self.chat_template, messages, add_generation_prompt=add_generation_prompt,
                      **{**special, **extra})
