"""Fuzzed request bodies: JSON that parses, with every field of either endpoint given values
of every type, nested, huge, empty, unknown fields, message keys and content parts of every
shape, chat template variables, stop ids past the limit once the server adds its
end-of-sequence id. `body(rng, chat)` makes one; `bodies(seed, n)` the run of n that
test_http_fuzz.py sends (and benchmarks/contention.py, against `tokenrouter serve`)."""

from __future__ import annotations

import random

from tokenrouter.protocol.sampling import MAX_STOP_IDS

N_BODIES = 2400
SEED = 29
FIELDS = ["model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed", "stream",
          "stream_options", "stop", "stop_token_ids", "ignore_eos", "n", "logprobs", "echo", "best_of",
          "presence_penalty", "frequency_penalty", "tools", "tool_choice", "functions", "function_call",
          "response_format", "logit_bias", "user", "suffix", "request_id", "return_token_ids",
          "return_tokens_as_token_ids", "add_special_tokens", "chat_template_kwargs", "documents", "reasoning_effort",
          "return_prompt_text", "priority", "prompt_embeds", "min_tokens", "store",
          "messages", "prompt", "structured_outputs", "top_logprobs"]  # either endpoint gets the other's too


def _value(rng: random.Random, depth: int = 0):
    kind = rng.randrange(16 if depth < 3 else 11)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.choice([0, 1, -1, 2, 7, 255, 256, 258, 259, 1 << 31, -(1 << 63), (1 << 63) - 1, 1 << 64, 10 ** 30])
    if kind == 3:
        return rng.choice([0.0, -0.5, 0.5, 1.0, 1.5, 1e308, -1e-308, 100.0, 101.0])
    if kind == 4:
        return rng.choice(["", "x", "test", "\u00e9\u4e2d", "a" * 5000, "\ud800", "NaN", "Infinity", "null"])
    if kind == 5:
        return [rng.randrange(-5, 300) for _ in range(rng.randrange(0, 6))]
    if kind == 6:
        return [rng.randrange(0, 259) for _ in range(rng.choice([MAX_STOP_IDS - 1, MAX_STOP_IDS, MAX_STOP_IDS + 1]))]
    if kind == 7:
        return {"type": rng.choice(["text", "image_url", "json_object", None, 5])}
    if kind == 8:
        return {"include_usage": rng.choice([True, 1, "yes", None])}
    if kind == 9:
        return [[1, 2], [3]]
    if kind == 10:
        return ["a", "b"]
    if kind == 11:
        return [_value(rng, depth + 1) for _ in range(rng.randrange(0, 4))]
    if kind == 12:
        return {rng.choice(FIELDS + ["x", ""]): _value(rng, depth + 1) for _ in range(rng.randrange(0, 4))}
    if kind == 13:
        return [[[[[]]]]]
    if kind == 14:
        return {"type": "text", "text": _value(rng, depth + 1)}
    return rng.choice(["hello", [5, 6, 7]])


def _part(rng: random.Random):
    return rng.choice([{"type": "text", "text": "hi"}, {"type": "text", "text": _value(rng, 1)},
                       {"type": "text"}, {"type": "image_url", "image_url": {"url": "x"}}, {"text": "no type"},
                       {"type": _value(rng, 1), "text": "x"}, {}])


def _message(rng: random.Random):
    m = {"role": rng.choice(["user", "system", "assistant", "tool", "developer", "robot", 5, None]),
         "content": rng.choice(["hi", None, "", [_part(rng) for _ in range(rng.randrange(0, 3))], _value(rng, 1)])}
    if rng.random() < 0.2:
        m.pop(rng.choice(["role", "content"]))
    if rng.random() < 0.1:
        m[rng.choice(["name", "tool_call_id", "reasoning", "task", "tool_calls", "refusal"])] = _value(rng, 1)
    return m


def body(rng: random.Random, chat: bool) -> dict:
    b = {"max_tokens": rng.randrange(1, 4), "temperature": 0}
    if chat:
        b["messages"] = rng.choice([[{"role": "user", "content": "hi"}]] * 3
                                   + [[_message(rng) for _ in range(rng.randrange(1, 4))], [], _value(rng)])
    else:
        b["prompt"] = rng.choice(["hello", "hello", [5, 6, 7], ["a"], [[1, 2]], "", [], _value(rng)])
    for f in rng.sample(FIELDS, rng.choice([0, 0, 1, 1, 2, 4, 6])):
        b[f] = _value(rng)
    if rng.random() < 0.1:
        del b[rng.choice(list(b))]
    b["stream"] = rng.random() < 0.5 if "stream" not in b or rng.random() < 0.5 else b["stream"]
    return b




def bodies(seed: int = SEED, n: int = N_BODIES) -> list[tuple[str, dict]]:
    """(path, body) for n bodies, chat and completions in turn."""
    rng = random.Random(seed)
    return [("/v1/chat/completions" if i % 2 else "/v1/completions", body(rng, bool(i % 2))) for i in range(n)]
