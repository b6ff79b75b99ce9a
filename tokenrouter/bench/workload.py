"""The benchmark workload: deterministic prompts and greedy, fixed-length sampling.

Greedy decoding with the stop tokens ignored makes every request write exactly
`max_tokens` tokens in every configuration, so tokens/s compare like with like and the
routed configurations must produce identical outputs (a schedule never changes tokens).
Every deployment gives request i of a measurement the route seed i (the seed of the
program's coin flips), so the configurations route alike too.
"""

from __future__ import annotations

from tokenrouter.prompts import read_prompts
from tokenrouter.protocol.sampling import SamplingParams

TOPICS = ("the history of the printing press", "how vaccines train the immune system", "why the sky is blue",
          "the rules of chess", "how a compiler works", "the water cycle", "the causes of inflation",
          "how bees communicate", "the theory of plate tectonics", "how a transistor works",
          "the life of a star", "how to bake bread", "the origins of jazz", "how tides work",
          "the structure of DNA", "how a bicycle stays upright")


def prompts(n: int) -> list[str]:
    """n distinct prompts of similar length (no shared prefix beyond the template words)."""
    return [f"Variant {i}: write a short explanation of {TOPICS[i % len(TOPICS)]}." for i in range(n)]


def chat_prompts(path: str, tok, n: int) -> list[str]:
    """n prompts from a .jsonl of {"prompt": ...} (cycled when it holds fewer), each asked as
    one user message through the program's chat template. A file that is not a prompt set
    is a `PromptsError` naming the file and line (`tokenrouter.prompts`)."""
    asks = [row["prompt"] for row in read_prompts(path)]
    return [tok.apply_chat_template([{"role": "user", "content": asks[i % len(asks)]}], add_generation_prompt=True)
            for i in range(n)]


def sampling(max_tokens: int) -> SamplingParams:
    """Greedy, no stop tokens: every request writes `max_tokens`."""
    return SamplingParams(temperature=0.0, max_tokens=int(max_tokens))


def requests_for(concurrency: int, base: int) -> int:
    """Requests per measurement at a concurrency level: at least two full waves, so the
    closed loop reaches its steady state, and at least `base`."""
    return max(base, 2 * concurrency)
