"""The choices of one HTTP request: a request with `n` choices, or a completion request with
a list of prompts, runs as independent requests (prompt i's choice j is choice `i * n + j`),
each with its own sampling state. The choices of one prompt compute it once: choice j > 0
is submitted naming choice 0 (`fork_of`), and the start writer forks choice 0's prompt KV
for it (`subserver/forks.py`). With a `seed`, choice j > 0 draws with a seed derived from
(seed, j) (`choice_seed`), so the choices differ; choice 0 uses the seed itself, so n = 1
is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenrouter.protocol.sampling import INT64, SamplingParams

__all__ = ["Choice", "choice_seed", "expand"]

_MIX = 0x9E3779B97F4A7C15


def choice_seed(seed: int | None, j: int) -> int | None:
    """The seed of choice j of a request seeded `seed` (j = 0: the seed itself)."""
    if seed is None or j == 0:
        return seed
    x = ((seed + INT64) * _MIX + j) % (1 << 64)
    return x - INT64


@dataclass
class Choice:
    """One independent request of an HTTP request."""

    index: int
    prompt: list[int]
    params: SamplingParams
    route_seed: int | None
    prompt_index: int = 0  # the prompt it continues (a completion request's list of prompts)
    echo: str = ""  # text before the output (completions' `echo`)
    stop_ids: frozenset[int] = frozenset()  # the client's own stop ids (for `stop_reason`)


def expand(body, prompt_index: int, ids: list[int], params, first: int, echo: str = "") -> list[Choice]:
    """The `n` choices of one prompt, indexed from `first`; choice j > 0 of a seeded request
    gets its own seed (`choice_seed`) for the sampler and the coins alike."""
    stop_ids = frozenset(body.stop_token_ids or ())
    out = []
    for j in range(body.n or 1):
        seed = choice_seed(body.seed, j)
        out.append(Choice(first + j, ids, params if j == 0 else params.replace(seed=seed), seed, prompt_index,
                          echo, stop_ids))
    return out
