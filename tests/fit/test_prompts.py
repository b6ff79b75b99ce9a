"""The shipped prompt set: at least 300 prompts of five kinds, a held-out part disjoint from training."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from tokenrouter.prompts import read_prompts

DATA = Path(__file__).resolve().parents[2] / "data" / "prompts"


def test_shipped_prompts_are_many_varied_and_split():
    train, held = read_prompts(str(DATA / "train.jsonl")), read_prompts(str(DATA / "heldout.jsonl"))
    assert len(train) + len(held) >= 300 and len(held) >= 50
    texts = [r["prompt"] for r in train + held]
    assert len(set(texts)) == len(texts), "a prompt appears twice"
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in held}
    kinds = Counter(r["kind"] for r in train + held)
    assert set(kinds) == {"question", "instruction", "code", "arithmetic", "story"}
    assert min(kinds.values()) >= 40
    assert set(Counter(r["kind"] for r in held)) == set(kinds)
    first_words = Counter(t.split()[0] for t in texts)
    assert first_words.most_common(1)[0][1] < 0.3 * len(texts), "too templated"
