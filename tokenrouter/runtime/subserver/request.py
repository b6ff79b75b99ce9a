"""One request as a subserver (or the lockstep baseline) holds it.

A `Request` joins what the parts of a subserver need to know about one request:

    state   the route state the compiled router reads and writes (`protocol.state.RouteState`:
            the tokens known here, whose turn it is, the visit's token count, how far
            each peer has read, who wrote how many tokens, the route seed, the sampling
            parameters it carries to the peers)
    seq     its sequence id in this writer's engines, whose KV holds `state.tokens[:fed]`
    params  its `SamplingParams` (the same object as `state.sampling`), read by the
            sampler every step; `max_tokens` and `stop_token_ids` are its stop rules
            (`end_reason`, the one rule: `protocol/sampling.py`)
    grammar its structured-output state here (`engine/grammar.GrammarState`), made at its
            first step when its parameters ask for structured output

Its scheduling state (waiting, running, pending, returning) is the scheduler's, keyed by
the request id, because the scheduler is integers only and tested without models
(`scheduler.py`). The frontend, in another process, keeps its own record of the request's
stream (`frontend/streams.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenrouter.protocol.sampling import SamplingParams, end_reason
from tokenrouter.protocol.state import RouteState
from tokenrouter.runtime.engine.grammar import GrammarState


def unfit(tokens: list[int], max_model_len: int, vocab_size: int) -> str | None:
    """Why these tokens cannot run on a writer (checked per request, so one bad request
    never fails a whole batch in the engine)."""
    if len(tokens) >= max_model_len:
        return f"{len(tokens)} tokens do not fit the context of {max_model_len}"
    bad = next((t for t in tokens if t >= vocab_size), None)
    if bad is not None:
        return f"token id {bad} is outside the vocabulary (0..{vocab_size - 1})"
    return None


@dataclass(eq=False)
class Request:
    state: RouteState
    seq: object
    params: SamplingParams
    stop: frozenset[int] = field(init=False)
    grammar: GrammarState | None = None

    def __post_init__(self):
        self.stop = frozenset(self.params.stop_token_ids)

    @property
    def rid(self) -> str:
        return self.state.rid

    @property
    def n_out(self) -> int:
        """Output tokens committed so far."""
        return len(self.state.tokens) - self.state.prompt_len

    def commit(self, token: int, writer: str) -> None:
        """`writer` wrote `token`: it is the request's next token."""
        st = self.state
        st.tokens.append(token)
        st.visit_tokens += 1
        st.written_by[writer] = st.written_by.get(writer, 0) + 1

    def end_reason(self, token: int, max_model_len: int) -> str | None:
        """Why the request ends after committing `token` ("stop" or "length"), if it does."""
        return end_reason(token, self.n_out, len(self.state.tokens), self.params, max_model_len, self.stop)

