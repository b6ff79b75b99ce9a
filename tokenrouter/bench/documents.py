"""details.json of a `tokenrouter bench` run, from what `runner.py` measured: the host and
deployment, and per level each configuration's result, the bound, ratios, agreement, the
tuner's predictions and the sweep of the large model's B."""

from __future__ import annotations

from typing import Any

from tokenrouter.runtime.host import host_info, load_average

from tokenrouter.bench import results as R
from tokenrouter.bench import tuning
from tokenrouter.bench.state import Measured, Setup, swept_batch


def details(opts, setup: Setup, measured: Measured, cores: int) -> dict[str, Any]:
    """details.json without its levels and elapsed time (filled in last)."""
    return {"program": opts.file, "small": setup.small, "large": setup.large, "cores": cores,
            "host": {**host_info(), "load_average_at_end": load_average()},
            "workload": {"max_tokens": opts.max_tokens, "requests": measured.requests, "rounds": opts.rounds,
                         "steady_s": opts.steady_s, "sampling": "greedy, stop tokens ignored",
                         "prompts": opts.prompts or "the bench's own (bench/workload.py)"},
            "deployment": {"mode": opts.mode, "num_blocks": setup.blocks,
                           "threads": {"routed": "the host's cores shared by need among the local subservers (runtime/cores.py)",
                                       "lockstep_and_single_model": opts.threads,
                                       "llamacpp_std": f"{max(1, cores // 2)} per server",
                                       "llamacpp_large_and_official": opts.threads},
                           "llama_server": opts.llama_server or "the xllamacpp wheel", "llamacpp_build": measured.builds,
                           "llamacpp_gguf": measured.ggufs},
            "profile": tuning.slowdown_summary(setup.profile) if setup.profile is not None else None,
            "elapsed_s": None, "levels": {}, "failed_levels": {str(n): why for n, why in measured.failed.items()}}


def level_doc(n: int, measured: Measured, setup: Setup, opts) -> dict[str, Any]:
    """One level of details.json from its rounds: each configuration's result, the bound,
    ratios, agreement, the tuner's predictions and the sweep."""
    per, profile, tuned = measured.raw[n], setup.profile, setup.tuned[n]
    cfg = {c: R.config_result(ms) for c, ms in per.items() if not c.startswith("tokenrouter@")}
    if "bound" in opts.configs and per.get("tokenrouter"):
        med = R.median_round(per["tokenrouter"])
        b = R.bound(n, profile, med)
        if b and b["tokens_per_s"]:
            cfg["bound"] = {"tokens_per_s": b["tokens_per_s"], "rounds_tokens_per_s": None, "bound": b,
                            "tokenrouter_gap": R.gap(n, profile, med)}
    tps = {c: v["tokens_per_s"] for c, v in cfg.items()}
    lv = {"requests": measured.requests[n], "batch_thresholds": tuned, "configs": cfg, "ratios": R.ratios(tps),
          "paired_ratios": R.paired_ratios(per), "of_bound": R.of_bound(tps),
          "identical_outputs": R.identical_outputs(per),
          "peer_agreement": R.peer_agreement(per), "load_average": measured.load.get(n)}
    if profile is not None and setup.auto:
        # the chain for the measured workload (prompts counted), and as the tuner sees it (decodes and extends)
        ids = setup.ids[:measured.requests[n].get("tokenrouter", len(setup.ids))]
        work = {"prompt_tokens": sum(map(len, ids)) / max(1, len(ids)), "request_tokens": opts.max_tokens}
        lv["predicted"] = {"tokenrouter": tuning.predict(setup.program, profile, n, tuned, **work),
                           "no_delay": tuning.predict(setup.program, profile, n, {w: 1 for w in setup.writers}, **work),
                           "tokenrouter_without_prefills": tuning.predict(setup.program, profile, n, tuned)}
    sw = {c: ms for c, ms in per.items() if c.startswith("tokenrouter@")}
    if sw:
        lv["sweep"] = sweep_doc(n, sw, setup)
    return lv


def sweep_doc(n: int, sw: dict[str, list], setup: Setup) -> dict[str, Any]:
    """The measured sweep of the large model's B at level `n`, each point with the tuner's prediction."""
    pts = []
    for c, ms in sorted(sw.items(), key=lambda kv: int(kv[0].split("@")[1])):
        b = int(c.split("@")[1])
        batch = swept_batch(setup.writers, setup.large, b)
        pred = tuning.predict(setup.program, setup.profile, n, batch) if setup.profile is not None else None
        res = R.config_result(ms)
        pts.append({"B": b, "tokens_per_s": res["tokens_per_s"], "rounds_tokens_per_s": res["rounds_tokens_per_s"],
                    "predicted_tokens_per_s": (pred or {}).get("tokens_per_s")})
    best = max(pts, key=lambda p: p["tokens_per_s"])
    tuned_pt = next(p for p in pts if p["B"] == setup.tuned[n].get(setup.large, 1))
    return {"model": setup.large, "points": pts, "best_measured_B": best["B"], "tuned_B": tuned_pt["B"],
            "tuned_over_best": tuned_pt["tokens_per_s"] / best["tokens_per_s"]}
