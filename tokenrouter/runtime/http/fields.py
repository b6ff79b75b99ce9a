"""The request fields this server does not implement, and what it does with each: none is
dropped without a word.

The request models (`schema.py`) declare the fields that act here; whatever else a body
holds is kept in the model's `model_extra` and judged against vLLM's request schemas
(`CompletionRequest`, `ChatCompletionRequest`, the tokenize requests):

- `UNSUPPORTED`: a field that would change the output or the response, which this server
  does not implement. A request that sets it to anything but a value asking for nothing
  (null, or one of the values its entry lists: false, an empty list, "none", ...) gets a 400
  naming the field and why.
- `NO_EFFECT`: a field that changes nothing on this server (vLLM too ignores it without the
  feature it belongs to): accepted.
- anything else is outside vLLM's schema (OpenAI's `store` or `service_tier`, a typo such as
  `max_token`): accepted, as vLLM accepts it, and named in a warning (the log's repeat
  filter, `logs.py`, writes that warning once a minute at most, with a count).

The keys of a chat message go the same way (`MESSAGE_UNSUPPORTED`; the others that vLLM
gives templates are declared in `schema.ChatMessage`).
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import BaseModel

from tokenrouter.runtime.http.schema import BadRequest

log = logging.getLogger(__name__)


def _tools(name: str) -> str:
    return f"{name} acts on /v1/chat/completions only (tool calling is a chat feature)"


def _functions(name: str) -> str:
    return f"{name} (OpenAI's deprecated function calling) is not supported; use tools and tool_choice"


#: field -> (why it is refused, the values besides null that ask for nothing and are accepted)
UNSUPPORTED: dict[str, tuple[str, tuple[Any, ...]]] = {
    # sampling and decoding
    "best_of": ("best_of > 1 is not supported (vLLM removed it too); use n", (1,)),
    "use_beam_search": ("beam search is not supported", (False,)),
    "prompt_logprobs": ("prompt logprobs are not supported (the engine returns the last position's logits only)", ()),
    "logprob_token_ids": ("logprob_token_ids is not supported", ([],)),
    "allowed_token_ids": ("allowed_token_ids is not supported; use logit_bias or structured_outputs", ([],)),
    "bad_words": ("bad_words is not supported; use logit_bias", ([],)),
    "repetition_detection": ("repetition_detection is not supported (nothing ends a request early on repeats); "
                             "use repetition_penalty or max_tokens", ()),
    "thinking_token_budget": ("thinking_token_budget is not supported (this server has no reasoning parser)", ()),
    "spaces_between_special_tokens": ("spaces_between_special_tokens: false is not supported; special tokens are "
                                      "decoded as the tokenizer decodes them", (True,)),
    "priority": ("priority is not supported (requests run first come, first served): give 0 or nothing", (0,)),
    # the prompt
    "suffix": ("suffix (insertion) is not supported", ()),
    "prompt_embeds": ("prompt_embeds is not supported; send the prompt as text or token ids", ()),
    "truncate_prompt_tokens": ("truncate_prompt_tokens is not supported", ()),
    "chat_template": ("chat_template is not supported: the model's own chat template renders every request "
                      "(vLLM too refuses it unless started with --trust-request-chat-template)", ()),
    "continue_final_message": ("continue_final_message is not supported", (False,)),
    # tools on /v1/completions, and the deprecated functions anywhere: a request may say it uses none
    "tools": (_tools("tools"), ([],)),
    "tool_choice": (_tools("tool_choice"), ("none",)),
    "functions": (_functions("functions"), ([],)),
    "function_call": (_functions("function_call"), ("none",)),
}

#: keys of a chat message refused the same way
MESSAGE_UNSUPPORTED: dict[str, tuple[str, tuple[Any, ...]]] = {
    "function_call": ("messages with a function_call (OpenAI's deprecated function calling) are not supported; "
                      "use tool_calls", ()),
    "tools": ("a message's tools are not supported; give the request's tools", ([],)),
}

#: field -> why it changes nothing here: accepted and ignored
NO_EFFECT: dict[str, str] = {
    "user": "an end user's id for the provider; vLLM ignores it too",
    "session_id": "a tag for routing and logs",
    "stream_interval": "how many tokens a streamed chunk holds at least; the text and tokens streamed are the same",
    "cache_salt": "salts a prefix cache shared between requests, and there is none here",
    "watermarking": "vLLM skips it too unless a watermark is configured",
    "length_penalty": "beam search only, which is refused",
    "truncation_side": "acts with truncate_prompt_tokens only, which is refused",
    "parallel_tool_calls": "acts on /v1/chat/completions with tools only",
    "include_reasoning": "acts with a reasoning parser only, and there is none here (nor in vLLM by default)",
    "vllm_xargs": "arguments of vLLM's custom extensions",
    "kv_transfer_params": "vLLM's disaggregated prefill",
    "ec_transfer_params": "vLLM's disaggregated encoders",
    "routed_experts_prompt_start": "vLLM's routed-experts data, not produced here",
    "return_token_offsets": "vLLM's render endpoints only",
    "mm_payload": "vLLM's render endpoints only",
    "return_mm_kwargs": "vLLM's render endpoints only",
    "media_io_kwargs": "multimodal input only, which is refused",
    "mm_processor_kwargs": "multimodal input only, which is refused",
}


def check(body: BaseModel) -> None:
    """Refuse (400) a body that sets a field, or a message key, this server does not
    implement; warn about the fields nobody defined (all of them, in one line). Only what
    the body's schema declares is read as typed: a field it does not define (`messages` on
    /v1/completions) is an unknown value of any type, never iterated."""
    unknown = _refuse(body.model_extra or {}, UNSUPPORTED, "")
    messages = body.messages if "messages" in type(body).model_fields else None
    for m in messages or ():
        unknown += [n for n in _refuse(m.model_extra or {}, MESSAGE_UNSUPPORTED, "messages") if n not in unknown]
    if unknown:
        log.warning("request fields ignored (not in vLLM's request schema): %s", ", ".join(unknown))


def _refuse(extra: dict[str, Any], unsupported: dict[str, tuple[str, tuple[Any, ...]]], where: str) -> list[str]:
    """Raise BadRequest for the first field of `extra` that `unsupported` names and that asks
    for something; the names (prefixed with `where`) neither table knows."""
    unknown = []
    for name, value in extra.items():
        if name in unsupported:
            why, nothing = unsupported[name]
            if value is not None and not any(value == v and isinstance(value, bool) == isinstance(v, bool)
                                             for v in nothing):
                raise BadRequest(why, f"{where}.{name}" if where else name)
        elif where or name not in NO_EFFECT:
            unknown.append(f"{where}[].{name}" if where else name)
    return unknown
