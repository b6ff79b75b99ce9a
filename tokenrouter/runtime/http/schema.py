"""The OpenAI request schema as this server speaks it: request bodies, the shape of the response a
request asks for (`Reply`), errors and their JSON form.

The request models declare the fields that act here. Extensions to the OpenAI schema, named
as vLLM names them: `top_k`, `min_p`, `repetition_penalty`, `min_tokens`, `stop_token_ids`,
`include_stop_str_in_output`, `ignore_eos`, `skip_special_tokens`, `add_special_tokens`,
`structured_outputs`, `request_id`, `return_token_ids`, `return_tokens_as_token_ids`, and
for chat `chat_template_kwargs`, `documents`, `reasoning_effort`, `return_prompt_text`.
Chat's `tools`, `tool_choice` and `parallel_tool_calls` and a message's `tool_calls` are
OpenAI's (`tools.py`). A
body's other fields are kept (`extra="allow"`, in `model_extra`) so that none is silently
ignored: `fields.py` refuses those this server does not implement with a 400 naming them,
accepts those that change nothing here, and warns about those vLLM does not define either.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field


class BadRequest(Exception):
    """A request the server refuses: 400 with the OpenAI error body."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.message, self.param = message, param


class Overloaded(Exception):
    """Every admission slot is taken and the wait queue is full."""


class DeadlineExceeded(Exception):
    """The request ran past its deadline (`Limits.request_timeout_s`): 504."""


def error_response(status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                   headers: dict[str, str] | None = None, code: str | None = None):
    """The OpenAI error body. Its message and param may quote the request, which may hold
    text with no UTF-8 form (a lone surrogate): such characters are written escaped."""
    return JSONResponse({"error": {"message": _utf8(message), "type": type_, "param": _utf8(param), "code": code}},
                        status_code=status, headers=headers)


def _utf8(text: str | None) -> str | None:
    return None if text is None else text.encode("utf-8", "backslashreplace").decode("utf-8")


def error_body(status: int, message: str, type_: str, code: str | None = None) -> tuple[int, bytes]:
    return status, json.dumps({"error": {"message": message, "type": type_, "param": None,
                                         "code": code}}).encode()


def check_text(text: str, param: str) -> str:
    """Refuse a string that is not valid Unicode (a lone surrogate such as "\\ud800" is
    valid JSON but has no UTF-8 form, so no tokenizer can read it)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise BadRequest(f"{param} is not valid Unicode: {exc.reason} at position {exc.start}", param) from None
    return text


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class CommonRequest(BaseModel):
    """The fields completions and chat completions share. A field OpenAI allows to be null
    may be null (the default then)."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    max_tokens: int | None = Field(default=None)
    temperature: float | None = Field(default=None, ge=0.0, le=100.0)  # None: 1.0, as OpenAI
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1, le=(1 << 31) - 1)  # -1 and 0: no limit (vLLM's -1)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    seed: int | None = Field(default=None, ge=-(1 << 63), lt=1 << 63)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = Field(default=None, max_length=1024)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: int = Field(default=0, ge=0)
    skip_special_tokens: bool = True
    n: int | None = Field(default=1, ge=1, le=128)
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    request_id: str | None = None  # the response's id ("cmpl-" + it); the X-Request-Id header wins
    return_token_ids: bool | None = None  # the prompt's token ids too (every choice has its `token_ids`)
    return_tokens_as_token_ids: bool | None = None  # logprob tokens as "token_id:N"


class CompletionRequest(CommonRequest):
    prompt: str | list[int] | list[str] | list[list[int]] | None = None  # None: a 400 (`Validator.prompts`)
    logprobs: int | None = Field(default=None, ge=0)
    echo: bool | None = False
    add_special_tokens: bool = True  # a text prompt's BOS, if the model has one


class Function(BaseModel):
    """A tool's function: its name and its arguments' JSON schema (`parameters`)."""

    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["function"] = "function"
    function: Function


class FunctionName(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    """`tool_choice` naming the function the reply must call."""

    type: Literal["function"] = "function"
    function: FunctionName


class CalledFunction(BaseModel):
    name: str = Field(min_length=1)
    arguments: str | dict[str, Any] = "{}"  # OpenAI's: the arguments as JSON text


class ToolCallMessage(BaseModel):
    """A call in an assistant message of the history."""

    model_config = ConfigDict(extra="allow")
    id: str | None = None
    type: Literal["function"] = "function"
    function: CalledFunction


#: the roles OpenAI defines; any other goes to the chat template as it is (as vLLM passes it)
STANDARD_ROLES = ("system", "user", "assistant", "tool", "developer")


class ChatMessage(BaseModel):
    """A message, with the keys vLLM gives the chat template besides its text. A role
    outside `STANDARD_ROLES` is the template's to render (`Validator.chat_prompt`)."""

    model_config = ConfigDict(extra="allow")
    role: str = Field(min_length=1, max_length=64)
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_call_id: str | None = None  # a tool message's
    tool_calls: list[ToolCallMessage] | None = None  # an assistant message's calls
    reasoning: str | None = None  # an assistant message's (also `reasoning_content` to the template)
    task: str | None = None


class ChatRequest(CommonRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = Field(default=None, ge=0)
    echo: bool = False  # vLLM's: the last message's content before the reply (refused)
    add_generation_prompt: bool = True
    add_special_tokens: bool = False  # tokens the tokenizer adds to the rendered template (vLLM's default)
    chat_template_kwargs: dict[str, Any] | None = None  # variables of the chat template
    documents: list[dict[str, str]] | None = None  # the template's `documents` (RAG templates)
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    return_prompt_text: bool | None = None  # the rendered prompt as `prompt_text`
    tools: list[Tool] | None = Field(default=None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None  # None: auto with tools
    parallel_tool_calls: bool | None = True


class TokenizeRequest(BaseModel):
    """`POST /tokenize` (vLLM's): a prompt, or chat messages through the chat template."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None  # None: true for a prompt, false for messages (vLLM's defaults)
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[Tool] | None = Field(default=None, max_length=128)  # given to the chat template
    return_token_strs: bool | None = False  # each token's string as `token_strs`


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    tokens: list[int]


@dataclass(frozen=True)
class Reply:
    """How the response to a request is shaped, as the request asked."""

    chat: bool
    model: str | None = None  # the served name the request gave (None: the first)
    stream: bool = False
    include_usage: bool = False  # a stream's last chunk has the usage
    skip_special_tokens: bool = True
    request_id: str | None = None  # the client's (X-Request-Id, else `request_id`): the response id's tail
    prompt_token_ids: bool = False  # `return_token_ids`: the prompt's token ids too
    prompt_text: str | None = None  # chat's `return_prompt_text`: the rendered prompt
    tokens_as_ids: bool = False  # `return_tokens_as_token_ids`: logprob tokens as "token_id:N"
    tools: Any = None  # chat's tools in use (`tools.ToolUse`): calls are read from the output
