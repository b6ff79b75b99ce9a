"""What passes between a `VllmWriter` and its logits processor inside vLLM: each chunk's
arguments on the way in (`chunk_args`), the route decision on the way out, in-band
through vLLM's own output path.

Inside vLLM, our logits processor decides for a row (sampled token, next writer, keep or
rewrite) and then forces one token: the sampled one while the request stays here, or the
park token that ends its chunk. The other logits become -inf and the forced one takes the
value `encode(token, dest, keep)`: with the engine's `logprobs_mode="processed_logits"`
and `logprobs=0` on the request, vLLM returns that value with the token, from whichever
process and tensor-parallel rank ran the processor. Logits are float32 by then, whose
integers are exact below 2**24 (`fits`).
"""

from __future__ import annotations

from tokenrouter.runtime.subserver.request import Request

EXACT = 1 << 24  # float32 holds every integer below this exactly
KEY = "tokenrouter"  # in the engine's additional_config and in each request's extra_args


def chunk_args(r: Request) -> dict:
    """What the processor needs of `r` for the chunk added now: where the request stands
    (JSON-safe: it may cross to worker processes)."""
    st = r.state
    return {KEY: {"n_out": r.n_out, "n_tokens": len(st.tokens), "visit": st.visit_tokens,
                  "route_seed": st.route_seed, "sampling": r.params.model_dump(mode="json")}}


def encode(token: int, dest: int, keep: int, writers: int) -> float:
    return float((token * writers + dest) * 2 + keep)


def decode(value: float, writers: int) -> tuple[int, int, int]:
    """(token, dest writer index, keep) from an encoded value."""
    code = int(value)
    if code != value or code < 0:
        raise ValueError(f"{value!r} is not a route decision: the processor did not decide this row")
    keep, code = code % 2, code // 2
    return code // writers, code % writers, keep


def fits(vocab_size: int, writers: int) -> bool:
    """Whether every decision of this vocabulary and program is exact in float32."""
    return (vocab_size * writers) * 2 < EXACT
