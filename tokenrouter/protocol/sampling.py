"""A request's sampling parameters: one type from the HTTP body to the sampler and the wire.

`SamplingParams` is a frozen pydantic model. It is built (and validated) once, where a
request enters (`runtime/http/validation.py`, the offline API, the bench's workload, a
`submit` or `handoff` frame parsed by `runtime/transport/wire.py`), and from then on only
read: the subserver's `Request` holds it, `RouteState.sampling` and `PeerMessage.sampling`
carry it to the peers, and the sampler (`runtime/engine/sampler.py`) reads its attributes
every step without validating again.

Validation is strict and bounded, because the same type parses frames from other hosts: a
string is never taken for a number (`"max_tokens": "5"` is refused, not coerced), every
number has a range, and at most `MAX_STOP_IDS` stop ids. Its `seed` seeds the sampler's
draws (None: fresh randomness each draw); the seed of the program's coin flips is the
request's route seed (`state.RouteState.route_seed`), another thing.

What each group of fields is read by:

| fields | read by |
|---|---|
| `temperature`, `top_k`, `top_p`, `min_p`, `seed` | the sampler (`runtime/engine/sampler.py`) |
| `presence_penalty`, `frequency_penalty`, `repetition_penalty`, `logit_bias`, `min_tokens`, `structured` | every writer's logits processing before the sampler (`runtime/engine/logits.py`), so every writer applies them alike |
| `max_tokens`, `stop_token_ids` | the step runner, which ends a request at them (`end_reason`, also asked by the frontend's recovery and vLLM's logits processor) |
| `stop`, `include_stop_str_in_output` | the frontend, on the detokenised text of every writer's tokens in order (`runtime/frontend/text.py`) |
| `logprobs` | the step runner: the log-probabilities of each token under its writer's distribution |

`DEFAULT_MAX_TOKENS` is the one default `max_tokens`; `with_eos` is the one
end-of-sequence rule (HTTP and the offline API); `end_reason` the one end-of-request rule; `invalid_because` says in one line why
parameters were refused (pydantic's `ValidationError`, a ValueError). Free of torch, so the HTTP side and the
wire format use it without loading the engine.
"""

from __future__ import annotations

from typing import Annotated, Any, Iterable, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError

__all__ = ["DEFAULT_MAX_TOKENS", "INT64", "MAX_LOGIT_BIAS", "MAX_LOGPROBS", "MAX_STOP_IDS", "MAX_STOP_STRINGS",
           "MAX_TOKENS", "SamplingParams", "Structured", "TOKEN_ID_MAX", "end_reason", "invalid_because"]

#: `max_tokens` of a request that gives none: over HTTP (`tokenrouter serve
#: --default-max-tokens`), in the offline API and on the wire.
DEFAULT_MAX_TOKENS = 256

MAX_TOKENS = 1 << 20  # the most tokens a list (prompt, suffix) or `max_tokens` may hold
MAX_STOP_IDS = 1024
TOKEN_ID_MAX = (1 << 31) - 1
INT64 = 1 << 63  # seeds are signed 64-bit integers: -INT64 <= seed < INT64
MAX_STOP_STRINGS = 64
MAX_STOP_CHARS = 1024  # the longest stop string
MAX_LOGPROBS = 20  # top log-probabilities a token may report (OpenAI's and vLLM's limit)
MAX_LOGIT_BIAS = 4096  # entries of logit_bias
MAX_GRAMMAR_CHARS = 1 << 20  # a JSON schema, regex or grammar

TokenId = Annotated[int, Strict(), Field(ge=0, le=TOKEN_ID_MAX)]
Seed = Annotated[int, Field(ge=-INT64, lt=INT64)]


class Structured(BaseModel):
    """Structured output: the text a request writes must match this (`runtime/engine/grammar.py`
    turns it into a token mask). `kind`: `json` (any JSON object; `spec` is empty),
    `json_schema` (`spec`: the schema as JSON), `regex`, `lark` (a Lark grammar), `choice`
    (`spec`: a JSON list of the strings allowed)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    kind: Literal["json", "json_schema", "regex", "lark", "choice"]
    spec: str = Field(default="", max_length=MAX_GRAMMAR_CHARS)


StopString = Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]
Bias = Annotated[float, Field(ge=-100.0, le=100.0, allow_inf_nan=False)]
BiasEntry = Annotated[tuple[TokenId, Bias], Field(strict=False)]  # (token id, bias); JSON gives a list
Penalty = Annotated[float, Field(ge=-2.0, le=2.0, allow_inf_nan=False)]


class SamplingParams(BaseModel):
    """How a request's tokens are drawn, and when it ends (`max_tokens`, `stop_token_ids`)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    temperature: float = Field(default=0.0, ge=0.0, le=100.0, allow_inf_nan=False)  # 0: greedy
    top_k: int = Field(default=0, ge=0, le=TOKEN_ID_MAX)  # 0: no limit
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    seed: Seed | None = None  # the sampler's; None: fresh randomness each draw
    max_tokens: int = Field(default=DEFAULT_MAX_TOKENS, ge=1, le=MAX_TOKENS)
    # a list or a tuple of ints (a JSON array arrives as a list); held as a tuple
    stop_token_ids: tuple[TokenId, ...] = Field(default=(), max_length=MAX_STOP_IDS, strict=False)
    min_p: float = Field(default=0.0, ge=0.0, le=1.0, allow_inf_nan=False)  # 0: off
    # logits processing (engine/logits.py); the defaults change nothing
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    repetition_penalty: float = Field(default=1.0, gt=0.0, le=10.0, allow_inf_nan=False)  # 1: off
    logit_bias: tuple[BiasEntry, ...] = Field(default=(), max_length=MAX_LOGIT_BIAS, strict=False)
    min_tokens: int = Field(default=0, ge=0, le=MAX_TOKENS)  # stop ids are masked before this many tokens
    structured: Structured | None = None
    # the frontend's (frontend/text.py): stop strings on the detokenised text
    stop: tuple[StopString, ...] = Field(default=(), max_length=MAX_STOP_STRINGS, strict=False)
    include_stop_str_in_output: bool = False
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)  # None: none; k: the token's and the top k

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def processes_logits(self) -> bool:
        """Whether the logits are changed before sampling (`engine/logits.py`)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
                    or self.logit_bias or self.min_tokens or self.structured is not None)

    def replace(self, **changes: Any) -> "SamplingParams":
        """A copy with `changes`, validated like a new one."""
        return SamplingParams(**{**dict(self), **changes})

    def with_eos(self, eos_token_ids: Iterable[int], ignore_eos: bool = False) -> "SamplingParams":
        """These parameters with a tokenizer's end-of-sequence ids added to the stop ids
        (those not already there, after them), unless `ignore_eos`: the end-of-sequence rule
        of the HTTP API and the offline API."""
        stop = list(self.stop_token_ids)
        if not ignore_eos:
            stop += [t for t in eos_token_ids if t not in stop]
        return self.replace(stop_token_ids=tuple(stop))


def end_reason(token: int | None, n_out: int, n_tokens: int, params: SamplingParams, max_model_len: int,
               stop: frozenset[int] | None = None) -> str | None:
    """Why a request ends once `token` is committed (None: no token yet), leaving it `n_out`
    output and `n_tokens` tokens in all: "stop" (a stop token, `stop` or the parameters'),
    "length" (`max_tokens` or the context limit), or None. The one end-of-request rule: the
    step runner asks it at each commit (`runtime/subserver/request.py`), vLLM's logits
    processor where a chunk ends, and the frontend's recovery of a request it holds."""
    if token is not None and token in (stop if stop is not None else params.stop_token_ids):
        return "stop"
    if n_out >= params.max_tokens or n_tokens >= max_model_len:
        return "length"
    return None


def invalid_because(exc: ValidationError) -> tuple[str, str]:
    """(field, one-line reason) of the first error that refused sampling parameters."""
    first = exc.errors()[0]
    where = ".".join(str(x) for x in first.get("loc", ())) or "sampling"
    got = f", got {first['input']!r}" if "input" in first and not isinstance(first["input"], dict) else ""
    return where, f"{where}: {first['msg']}{got}"
