"""A request's sampling parameters, typed, and the one default `max_tokens`.

Kept free of torch so that the HTTP side (which validates requests and builds these) and
the wire format can use them without loading it; the sampler itself is `sampler.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

#: `max_tokens` of a request that gives none: over HTTP (`tokenrouter serve
#: --default-max-tokens`), in the offline API and on the wire.
DEFAULT_MAX_TOKENS = 256


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # 0: no limit
    top_p: float = 1.0
    seed: int | None = None  # None: fresh randomness each draw
    max_tokens: int = DEFAULT_MAX_TOKENS
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self):
        if not (self.temperature >= 0.0):
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1
