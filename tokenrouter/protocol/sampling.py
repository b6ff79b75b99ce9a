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

`DEFAULT_MAX_TOKENS` is the one default `max_tokens`; `with_eos` is the one
end-of-sequence rule (HTTP and the offline API); `invalid_because` says in one line why
parameters were refused (pydantic's `ValidationError`, a ValueError). Free of torch, so the HTTP side and the
wire format use it without loading the engine.
"""

from __future__ import annotations

from typing import Annotated, Any, Iterable

from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError

__all__ = ["DEFAULT_MAX_TOKENS", "INT64", "MAX_STOP_IDS", "MAX_TOKENS", "SamplingParams", "TOKEN_ID_MAX",
           "invalid_because"]

#: `max_tokens` of a request that gives none: over HTTP (`tokenrouter serve
#: --default-max-tokens`), in the offline API and on the wire.
DEFAULT_MAX_TOKENS = 256

MAX_TOKENS = 1 << 20  # the most tokens a list (prompt, suffix) or `max_tokens` may hold
MAX_STOP_IDS = 1024
TOKEN_ID_MAX = (1 << 31) - 1
INT64 = 1 << 63  # seeds are signed 64-bit integers: -INT64 <= seed < INT64

TokenId = Annotated[int, Strict(), Field(ge=0, le=TOKEN_ID_MAX)]
Seed = Annotated[int, Field(ge=-INT64, lt=INT64)]


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

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

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


def invalid_because(exc: ValidationError) -> tuple[str, str]:
    """(field, one-line reason) of the first error that refused sampling parameters."""
    first = exc.errors()[0]
    where = ".".join(str(x) for x in first.get("loc", ())) or "sampling"
    got = f", got {first['input']!r}" if "input" in first and not isinstance(first["input"], dict) else ""
    return where, f"{where}: {first['msg']}{got}"
