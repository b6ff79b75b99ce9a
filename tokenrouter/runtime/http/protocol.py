"""The OpenAI protocol as this server speaks it: request bodies, errors and their JSON form.

Extensions to the OpenAI schema: `top_k`, `stop_token_ids`, `ignore_eos` in requests.
Fields the server does not support are parsed so that a request using them gets a 400
naming them (`validation.py`) rather than being silently ignored.
"""

from __future__ import annotations

import json
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
    return JSONResponse({"error": {"message": message, "type": type_, "param": param, "code": code}},
                        status_code=status, headers=headers)


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


class CommonRequest(BaseModel):
    """The fields completions and chat completions share."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    max_tokens: int | None = Field(default=None)
    temperature: float = Field(default=1.0, ge=0.0, le=100.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0, le=(1 << 31) - 1)
    seed: int | None = Field(default=None, ge=-(1 << 63), lt=1 << 63)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = Field(default=None, max_length=1024)
    ignore_eos: bool = False
    n: int = 1
    logprobs: Any = None
    echo: bool = False
    best_of: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # not supported: refused with a 400 rather than silently ignored
    tools: Any = None
    tool_choice: Any = None
    functions: Any = None
    function_call: Any = None
    response_format: Any = None
    logit_bias: Any = None


class CompletionRequest(CommonRequest):
    prompt: str | list[int] | list[str] | list[list[int]]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None


class ChatRequest(CommonRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None

