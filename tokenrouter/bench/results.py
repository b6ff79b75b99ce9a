"""From measurements to results: medians over rounds, latency percentiles, token shares,
per-step breakdowns, ratios, `summary.json` (`summary`), and writing it and `details.json`
(`write_json`; runner.py assembles the details).

Pure functions over `Measurement`s, so they are tested without running a model.
"""

from __future__ import annotations

import json
import os
from typing import Any, Iterable

import numpy as np

from tokenrouter.bench.configs import CONFIGS, PEERS_ROUTED, ROUTED
from tokenrouter.tuner.bounds import cheapest_step, overlapped_ms
from tokenrouter.tuner.profile import ProfileError

SUMMARY_B_KEY = "B_i"


def percentile(values: Iterable[float], q: float) -> float | None:
    """The q-th percentile (linear interpolation), None for no values."""
    v = list(values)
    return float(np.percentile(np.asarray(v, dtype=float), q)) if v else None


def lower_median(xs: list, key=None) -> Any:
    """The median of `xs` (by `key`), the lower one of an even count: always one of them."""
    if not xs:
        raise ValueError("no measurements")
    return sorted(xs, key=key)[(len(xs) - 1) // 2]


def median_round(ms: list) -> Any:
    """The round whose throughput is the median (the lower one of an even count), so its
    breakdown is reported with it."""
    return lower_median(ms, key=lambda m: m.tokens_per_s)


def shares(written_by: dict[str, int]) -> dict[str, float]:
    total = sum(written_by.values())
    return {k: v / total for k, v in sorted(written_by.items())} if total else {}


def breakdown(m) -> dict[str, dict[str, Any]]:
    """Per writer: ms per step of each phase and its share of the step."""
    out = {}
    for w, ph in m.phase_s.items():
        steps = m.steps.get(w, 0)
        total = sum(ph.values())
        if steps <= 0:
            continue
        out[w] = {"steps": steps, "ms_per_step": 1000 * total / steps,
                  "mean_batch": (m.batch_sum[w] / steps) if w in m.batch_sum else None,
                  "phases": {p: {"ms_per_step": 1000 * v / steps, "share": v / total if total else 0.0}
                             for p, v in ph.items()}}
    return out


def config_result(ms: list) -> dict[str, Any]:
    """One configuration at one concurrency level, over its rounds."""
    med = median_round(ms)
    lats = [x for m in ms for x in (m.latencies_s or [])]
    rounds = [m.tokens_per_s for m in ms]
    return {"tokens_per_s": med.tokens_per_s, "rounds_tokens_per_s": rounds,
            "spread": {"min": min(rounds), "max": max(rounds),
                       "max_over_min": max(rounds) / min(rounds) if min(rounds) > 0 else None},
            "requests": len(med.outputs), "tokens": med.tokens, "wall_s": med.wall_s,
            "latency_s": {"median": percentile(lats, 50), "p99": percentile(lats, 99), "requests": len(lats)}
            if lats else None,
            "written_by": med.written_by, "share": shares(med.written_by),
            "batch_threshold": med.batch_threshold or None, "threads": med.threads,
            "launch_reasons": med.launch_reasons or None, "step_breakdown": breakdown(med),
            "outputs_stable_across_rounds": all(m.outputs == ms[0].outputs for m in ms)}


def identical_outputs(by_config: dict[str, list]) -> bool | None:
    """Whether every routed configuration produced the same tokens in every round."""
    outs = [m.outputs for name, ms in by_config.items() if name in ROUTED or "@" in name for m in ms]
    if not outs:
        return None
    k = min(map(len, outs))  # configurations may have run different numbers of requests
    return all(o[:k] == outs[0][:k] for o in outs)


def agreement(reference: list[list[int]], outputs: list[list[int]]) -> dict[str, Any]:
    """How far another engine's routed greedy outputs agree with ours, request by request
    (on the requests both ran): the share of requests identical token for token, and the
    share of tokens written before a request's first difference."""
    pairs = list(zip(reference, outputs))
    if not pairs:
        return {"requests": 0, "identical_requests": None, "tokens_before_first_difference": None}
    same, before, total = 0, 0, 0
    for a, b in pairs:
        k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        same += a == b
        before += k
        total += len(a)
    return {"requests": len(pairs), "identical_requests": same / len(pairs),
            "tokens_before_first_difference": before / total if total else None}


def peer_agreement(by_config: dict[str, list]) -> dict[str, Any]:
    """agreement() of each routed peer's median round with tokenrouter's (or the first of ours run)."""
    ours = next((by_config[c] for c in ROUTED if by_config.get(c)), None)
    if not ours:
        return {}
    ref = median_round(ours).outputs
    return {c: agreement(ref, median_round(ms).outputs) for c, ms in by_config.items() if c in PEERS_ROUTED and ms}


def bound(concurrency: int, profile, m) -> dict[str, Any] | None:
    """The profile's upper bound for the work a tokenrouter measurement did, as the tuner's
    (`tuner.bounds`): every request-step it took on model w (its batch sizes summed) feeding
    the tokens it fed (`tokens_per_request_step`: a decode's one, a returning request's
    extend of what the other model wrote, a first visit's prefill; from the subservers'
    fed-token counters) at its cheapest cost per request (L_w(b, k_w) / b at the best b <= N),
    nothing waiting, and the models stepping side by side as far as the profile's co-location
    slowdown allows (`overlapped_ms`). Without the fed-token counts every request-step is
    costed as a decode (`extends_counted` False), which leaves out the extends and overstates
    the bound."""
    if profile is None or m is None or not m.batch_sum:
        return None
    work, slow, per = {}, {}, {}
    counted = all(m.fed_tokens.get(w) for w in m.batch_sum)
    for w, req_steps in m.batch_sum.items():
        if w not in profile.models:
            return None
        k = tokens_per_request_step(m, w)
        prof = profile.models[w]
        try:
            ms, slow[w] = cheapest_step(lambda b, co: prof.step_ms(b, co, tokens=k), concurrency)
        except ProfileError as exc:
            return {"tokens_per_s": None, "error": str(exc)}
        work[w] = req_steps * ms
        per[w] = {"request_steps_per_token": req_steps / m.tokens, "tokens_per_request_step": k,
                  "ms_per_request_step": ms, "co_located_slowdown": slow[w]}
    total_ms = overlapped_ms(work, slow)
    return {"tokens_per_s": 1000.0 * m.tokens / total_ms if total_ms > 0 else None, "extends_counted": counted,
            "models": per}


def tokens_per_request_step(m, w: str) -> float:
    """Mean tokens model w was fed per request-step (1 where the counters are missing)."""
    req_steps, fed = m.batch_sum.get(w, 0), m.fed_tokens.get(w, 0)
    return max(1.0, fed / req_steps) if req_steps and fed else 1.0


def gap(concurrency: int, profile, m) -> dict[str, Any] | None:
    """Where a tokenrouter measurement's time went against the bound, per model: how much of
    the wall it was busy (the rest it waited for requests), the mean batch it formed against
    N (a step of b requests costs L(b)/b per request-step instead of L(N)/N: `underfill`),
    and its measured step against the profile's at that mean batch and tokens a request
    (`step_over_profile`: co-location, longer contexts, the frontend's CPU use, the step's
    work outside the forward)."""
    if profile is None or m is None or not m.batch_sum:
        return None
    out = {}
    for w, req_steps in m.batch_sum.items():
        steps = m.steps.get(w, 0)
        if steps <= 0 or w not in profile.models:
            continue
        busy = sum(m.phase_s.get(w, {}).values())
        mean_b = req_steps / steps
        prof = profile.models[w]
        k = tokens_per_request_step(m, w)
        try:
            at_b = prof.step_ms(max(1, int(round(mean_b))), tokens=k)
            at_n = prof.step_ms(concurrency, tokens=k)
        except ProfileError:
            continue
        out[w] = {"busy_share_of_wall": busy / m.wall_s if m.wall_s > 0 else None, "mean_batch": mean_b,
                  "tokens_per_request_step": k, "measured_step_ms": 1000 * busy / steps,
                  "profile_step_ms_at_mean_batch": at_b, "profile_step_ms_at_N": at_n,
                  "underfill": (at_b / max(1, round(mean_b))) / (at_n / concurrency),
                  "step_over_profile": 1000 * busy / steps / at_b,
                  "forward_share_of_step": (m.phase_s.get(w, {}).get("forward", 0.0) / busy) if busy else None}
    return out


def ratios(tps: dict[str, float | None]) -> dict[str, float]:
    t = tps.get("tokenrouter")
    if not t:
        return {}
    return {f"tokenrouter/{k}": t / v for k, v in tps.items() if k != "tokenrouter" and v}


def paired_ratios(per: dict[str, list]) -> dict[str, dict[str, Any]]:
    """tokenrouter's tokens/s over each other configuration's *in the same round*: the rounds
    run every configuration back to back (the order rotating), so a round's pair is minutes
    apart while the host's drift over the whole run (tens of percent here) moves whole rounds.
    Per pair: each round's ratio, their median (`lower_median`, as the rounds'), min and max. A configuration short of rounds is paired on the rounds both ran."""
    ours = [m.tokens_per_s for m in per.get("tokenrouter") or []]
    out = {}
    for c, ms in per.items():
        if c == "tokenrouter" or c.startswith("tokenrouter@") or not ms:
            continue
        rs = [a / m.tokens_per_s for a, m in zip(ours, ms) if m.tokens_per_s > 0]
        if rs:
            out[f"tokenrouter/{c}"] = {"rounds": rs, "median": lower_median(rs), "min": min(rs),
                                       "max": max(rs)}
    return out


def of_bound(tps: dict[str, float | None]) -> dict[str, float]:
    """Each configuration's tokens/s as a fraction of the bound."""
    b = tps.get("bound")
    return {k: v / b for k, v in tps.items() if k != "bound" and v and b} if b else {}


def summary(levels: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """summary.json: per concurrency level, tokens/s under each configuration key (null
    when not run), each one's fraction of `bound`, the tuner chain's predicted tokens/s for
    tokenrouter's schedule (`predicted`, null without a profile or fixed routing
    probabilities) and tokenrouter's measured/predicted (`of_predicted`), and the B_i used."""
    out = {}
    for n, lv in sorted(levels.items()):
        row = {c: (lv["configs"][c]["tokens_per_s"] if c in lv["configs"] else None) for c in CONFIGS}
        row["of_bound"] = lv.get("of_bound") or None
        pred = ((lv.get("predicted") or {}).get("tokenrouter") or {}).get("tokens_per_s")
        row["predicted"] = pred
        row["of_predicted"] = row["tokenrouter"] / pred if pred and row.get("tokenrouter") else None
        row[SUMMARY_B_KEY] = lv["batch_thresholds"]
        out[str(n)] = row
    return out


def write_json(path: str, doc: Any) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, indent=2, default=_jsonable)
        f.write("\n")


def _jsonable(x):
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")
