"""From three configurations' outputs to the figures of `summary.json`: per-prompt records,
per-configuration scores, and the 2x2 diffs that show churn behind equal totals.

A 2x2 diff of the routed program against a baseline counts, over the prompts that carry an
answer: both right, fixed (routed right, baseline wrong), broken (routed wrong, baseline
right) and both wrong. The four cells add up to the number of answered prompts. Whether an
output is right is the task set's verdict (`ConfigRun.verdicts`), given before this module runs.
"""

from __future__ import annotations

from typing import Any, Sequence


CELLS = ("both_right", "fixed", "broken", "both_wrong")


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first output position where two token sequences differ (the shorter one's length
    when one is a prefix of the other), or None when they are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def token_pieces(tokenizer, ids: Sequence[int]) -> list[str]:
    """The text each token adds to the decoded output (special tokens add none). A token
    that ends inside a multi-byte character adds nothing; the token completing it adds it, and
    the last token adds what never completes. The pieces join to the decoded output."""
    pieces, done = [], ""
    for i in range(len(ids)):
        text = tokenizer.decode(list(ids[: i + 1]), skip_special_tokens=True)
        if text.endswith("\ufffd") or not text.startswith(done):
            pieces.append("")
            continue
        pieces.append(text[len(done):])
        done = text
    full = tokenizer.decode(list(ids), skip_special_tokens=True)
    if pieces and full.startswith(done):
        pieces[-1] += full[len(done):]
    elif pieces:  # a decode that rewrote earlier text: one piece per token, the rest on the last
        pieces = [tokenizer.decode([t], skip_special_tokens=True) for t in ids]
        pieces[-1] += full[len("".join(pieces)):] if full.startswith("".join(pieces)) else ""
    return pieces


def diff2x2(tasks: Sequence, routed: Sequence[bool | None], other: Sequence[bool | None]) -> dict[str, Any]:
    """Counts and prompt ids of each cell, over the prompts with an answer."""
    out: dict[str, Any] = {c: 0 for c in CELLS}
    ids: dict[str, list[str]] = {c: [] for c in CELLS}
    for t, r, o in zip(tasks, routed, other):
        if r is None or o is None:
            continue
        cell = ("both_right" if o else "fixed") if r else ("broken" if o else "both_wrong")
        out[cell] += 1
        ids[cell].append(t.id)
    out["prompts"] = ids
    return out


def handoffs(writers: Sequence[str]) -> int:
    """How many times the writer changes along one output."""
    return sum(a != b for a, b in zip(writers, writers[1:]))


def correct(run) -> list[bool | None]:
    return [v.correct for v in run.verdicts]


def score(tasks: Sequence, run, large_run, large: str) -> dict[str, Any]:
    """One configuration's figures: accuracy (the task set's metric: correct / answered),
    exact_match_with_large, large_share, handoffs_per_request, fixed_vs_large and
    broken_vs_large (the 2x2 against large alone), tokens_per_s (at each concurrency)."""
    right = correct(run)
    answered = [c for c in right if c is not None]
    total = run.tokens
    by_large = sum(o.tokens_by_model.get(large, 0) for o in run.outputs)
    exact = sum(o.token_ids == lo.token_ids for o, lo in zip(run.outputs, large_run.outputs))
    vs_large = diff2x2(tasks, right, correct(large_run))
    return {"accuracy": (sum(answered) / len(answered)) if answered else None,
            "correct": sum(answered), "answered": len(answered),
            "exact_match_with_large": exact / len(tasks) if tasks else None,
            "large_share": by_large / total if total else 0.0,
            "handoffs_per_request": (sum(handoffs(o.token_writers) for o in run.outputs) / len(run.outputs)
                                     if run.outputs else 0.0),
            "fixed_vs_large": vs_large["fixed"], "broken_vs_large": vs_large["broken"],
            "tokens": total, "tokens_per_s": run.tokens_per_s, "wall_s": run.wall_s,
            "tokens_per_s_at": {str(c): r for c, r in run.rates.items()}, "same_tokens_at_every_concurrency": run.consistent}


def _output(o, verdict) -> dict[str, Any]:
    out = {"text": o.text, "token_ids": list(o.token_ids), "finish_reason": o.finish_reason,
           "tokens_by_model": dict(o.tokens_by_model), "correct": verdict.correct}
    if verdict.detail is not None:
        out["detail"] = verdict.detail
    return out


def prompt_records(tokenizer, task_set, small, large, routed) -> list[dict[str, Any]]:
    """One record per prompt: the three outputs, who wrote each routed token, where routed
    and large-only part, whether they match, and correctness per configuration."""
    recs = []
    for i, t in enumerate(task_set.tasks):
        s, lg, r = small.outputs[i], large.outputs[i], routed.outputs[i]
        rec = {"id": t.id, "prompt": t.prompt, **task_set.fields(t), "small": _output(s, small.verdicts[i]),
               "large": _output(lg, large.verdicts[i]), "routed": _output(r, routed.verdicts[i])}
        rec["routed"]["writers"] = list(r.token_writers)
        rec["routed"]["pieces"] = token_pieces(tokenizer, r.token_ids)
        rec["large"]["pieces"] = token_pieces(tokenizer, lg.token_ids)
        rec["first_divergence"] = first_divergence(r.token_ids, lg.token_ids)
        rec["exact_match_with_large"] = r.token_ids == lg.token_ids
        recs.append(rec)
    return recs


def summarize(tokenizer, task_set, small, large, routed, names: tuple[str, str]) -> dict[str, Any]:
    """`configs`, `diff` and `prompts` of summary.json (the sweep is added by the caller)."""
    tasks = task_set.tasks
    configs = {k: score(tasks, run, large, names[1]) for k, run in (("small", small), ("large", large),
                                                                     ("routed", routed))}
    return {"configs": configs,
            "diff": {"vs_large": diff2x2(tasks, correct(routed), correct(large)),
                     "vs_small": diff2x2(tasks, correct(routed), correct(small))},
            "prompts": prompt_records(tokenizer, task_set, small, large, routed)}
