"""Every results table in README.md, benchmarks/README.md and docs/*.md, made from the committed
result JSON files.

    .venv/bin/python scripts/results_tables.py           # rewrite the tables in place
    .venv/bin/python scripts/results_tables.py --check   # exit 1, with a diff, where a document differs
    .venv/bin/python scripts/results_tables.py --list    # each table: the documents holding it, its JSON

A table sits between `<!-- table: NAME -->` and `<!-- /table -->` in a document, and NAME is
a key of `TABLES` below: a function that reads its JSON files (under benchmarks/results/) and
returns the block, a line naming the host (CPU, cores, measured read bandwidth, load, date),
the command that reruns it and how the rounds spread, then the table. One table holds one
run, so one host; a table over several runs (the soak runs, the eval comparisons) requires
them to share a CPU model and core count and gives each run's bandwidth, load and date.
After a benchmark is rerun and its JSON committed, this script remakes its tables; a test
(tests/test_results_tables.py) fails while a committed table differs from what it makes.

Where a JSON file does not record its date (runs from before `host_info` recorded one), the
date is that of the last commit that changed the file, marked "(committed)".
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
RESULTS = "benchmarks/results"
BLOCK = re.compile(r"(<!-- table: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /table -->)", re.S)


@dataclass
class Table:
    sources: list[str]  # the JSON files it is made from, relative to the repository
    text: str  # the caption and the Markdown table


# ------------------------------------------------------------------ reading the JSON


def load(rel: str) -> dict:
    with open(ROOT / rel, encoding="utf-8") as f:
        return json.load(f)


def host_of(doc: dict) -> dict:
    """The host facts of a result, whichever shape its file has: {cpu, cores, bw, load, date}."""
    h = doc.get("host") or doc.get("meta", {}).get("host") or doc.get("host_before") or doc.get("machine") or {}
    load_avg = h.get("load_average") or h.get("loadavg") or h.get("load_avg")
    return {"cpu": h.get("cpu") or h.get("cpu_model"), "cores": h.get("cores") or h.get("cpus"),
            "bw": h.get("read_gb_per_s") or h.get("read_bandwidth_gb_s"),
            "load": load_avg[0] if load_avg else None, "flags": h.get("flags"),
            "load_end": (h.get("load_average_at_end") or h.get("load_avg_end") or [None])[0],
            "date": h.get("date")}


def date_of(doc: dict, rel: str) -> str:
    when = host_of(doc)["date"] or doc.get("created") or doc.get("date")
    if when:
        return when[:10]
    try:
        day = subprocess.run(["git", "log", "-1", "--format=%cs", "--", rel], cwd=ROOT, capture_output=True,
                             text=True, timeout=30).stdout.strip()
    except OSError:
        day = ""
    return f"{day} (committed)" if day else "date not recorded"


def host_words(doc: dict, rel: str) -> str:
    h = host_of(doc)
    cpu = h["cpu"] or "CPU not recorded"
    bw = f"read bandwidth {h['bw']:.1f} GB/s" if h["bw"] else "read bandwidth not recorded"
    loads = [x for x in (h["load"], h["load_end"]) if x is not None]
    load = ("load " + "-".join(f"{x:.1f}" for x in sorted(set(round(v, 1) for v in loads)))) if loads else \
        "load not recorded"
    cores = f"{h['cores']} cores" if h["cores"] else "cores not recorded"
    flags = f" ({' '.join(h['flags'])})" if h.get("flags") else ""
    return f"{cpu}{flags}, {cores}, {bw}, {load}, {date_of(doc, rel)}"


def rerun(command: str) -> str:
    """A recorded command as it reruns after scripts/setup.sh, writing to the scratch folder:
    the venv's executables, without --out (and --no-progress)."""
    words = shlex.split(command)
    out, skip = [], False
    for w in words:
        if skip:
            skip = False
            continue
        if w == "--out":
            skip = True
            continue
        if w == "--no-progress":
            continue
        out.append(w)
    if out and out[0] == "tokenrouter":
        out[0] = ".venv/bin/tokenrouter"
    elif out and out[0] in ("python", "python3"):
        out[0] = ".venv/bin/python"
    return shlex.join(out)


def caption(rel: str, doc: dict, command: str, spread: str) -> str:
    return f"*{host_words(doc, rel)}; `{rerun(command)}`; {spread} ({rel}).*"


def span(values: list[float], fmt: str = "{:.1f}") -> str:
    lo, hi = min(values), max(values)
    return fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else f"{fmt.format(lo)}-{fmt.format(hi)}"


def pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def rows(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    return "\n".join(lines)


# ------------------------------------------------------------------ `tokenrouter bench`


def serving(run: str, command: str | None = None) -> Table:
    """A `tokenrouter bench` run (details.json): each configuration's median tokens/s with its
    rounds, its share of the bound and tokenrouter's ratio to it, at each concurrency level."""
    rel = f"{RESULTS}/bench/{run}/details.json"
    d = load(rel)
    levels = sorted(d["levels"], key=int)
    configs = list(dict.fromkeys(c for n in levels for c in d["levels"][n]["configs"]))
    header = ["configuration"]
    for n in levels:
        header += [f"N = {n}: tok/s (rounds)", f"N = {n}: of bound", f"N = {n}: tokenrouter / it"]
    body = []
    for c in configs:
        cells = [c]
        for n in levels:
            lv = d["levels"][n]
            r = lv["configs"].get(c)
            tps = r and r["tokens_per_s"]
            rounds = (r or {}).get("rounds_tokens_per_s") or []
            cells.append("not measured" if not tps else
                         f"{tps:.1f}" + (f" ({' / '.join(f'{x:.1f}' for x in rounds)})" if len(rounds) > 1 else ""))
            of = (lv.get("of_bound") or {}).get(c, 1.0 if c == "bound" and tps else None)
            cells.append("-" if of is None else f"{of:.2f}")
            ratio = (lv.get("ratios") or {}).get(f"tokenrouter/{c}")
            paired = ((lv.get("paired_ratios") or {}).get(f"tokenrouter/{c}") or {}).get("rounds") or []
            cells.append("-" if ratio is None or c == "bound" else f"{ratio:.2f}x" + (
                f" ({' / '.join(f'{x:.2f}' for x in paired)})" if len(paired) > 1 else ""))
        body.append(cells)
    body += predicted_row(d, levels)
    first = d["levels"][levels[0]]
    share = first["configs"].get("tokenrouter", {}).get("share", {}).get(d["large"])
    facts = [f"{d['workload']['max_tokens']} tokens a request, {d['workload']['rounds']} interleaved round(s), "
             f"the median reported"]
    if any(d["levels"][n].get("paired_ratios") for n in levels):
        facts.append("in brackets after a ratio, tokenrouter over that configuration within each round (run back "
                     "to back, so the host's drift between rounds cancels)")
    if share is not None:
        facts.append(f"the large model wrote {pct(share)} of tokenrouter's tokens")
    if not new_bound(first):
        facts.append("its bound is the older one (every request-step a decode at batch N, the two models one "
                     "after the other; `results.bound` now prices extends and overlaps the models)")
    dep = d.get("deployment") or {}
    builds = sorted({" ".join(built_with(b)) for b in (dep.get("llamacpp_build") or {}).values()})
    if builds:
        where = "the xllamacpp wheel" if dep.get("llama_server") in (None, "the xllamacpp wheel") else \
            "a llama-server built on this host"
        facts.append(f"the llama.cpp peers ran {where} ({'; '.join(builds)})")
    if first.get("identical_outputs") is not None:
        facts.append("our routed configurations gave identical outputs" if first["identical_outputs"]
                     else "our routed configurations' outputs differed")
    return Table([rel], caption(rel, d, command or d["command"], "; ".join(facts)) + "\n\n" + rows(header, body))


def new_bound(level: dict) -> bool:
    """Whether a level's bound is `results.bound` as it is now (the models' fed tokens priced
    at their cheapest batch, side by side: `ms_per_request_step`), or no bound was run."""
    b = (level["configs"].get("bound") or {}).get("bound")
    return b is None or all("ms_per_request_step" in m for m in b.get("models", {}).values())


def predicted_row(d: dict, levels: list[str]) -> list[list[str]]:
    """The tuner's prediction for tokenrouter's schedule at each level (its chain, or where the
    chain has too many states its simulation, marked), its share of the bound, and measured /
    predicted in the ratio column; no row when no level has one."""
    cells, any_pred = ["predicted (tuner)"], False
    for n in levels:
        lv = d["levels"][n]
        p = (lv.get("predicted") or {}).get("tokenrouter") or {}
        pred = p.get("tokens_per_s")
        measured = (lv["configs"].get("tokenrouter") or {}).get("tokens_per_s")
        bound = (lv["configs"].get("bound") or {}).get("tokens_per_s")
        any_pred |= bool(pred)
        simulated = " (simulated)" if p.get("method") == "simulation" else ""
        cells += ["-" if not pred else f"{pred:.1f}{simulated}", "-" if not (pred and bound) else f"{pred / bound:.2f}",
                  "-" if not (pred and measured) else f"{measured / pred:.2f}x"]
    return [cells] if any_pred else []


def long_run() -> Table:
    """The first --long run recorded no command and stopped `official` by hand (its note)."""
    t = serving("long", "tokenrouter bench --long --rounds 1 --configs tokenrouter,llamacpp_std,llamacpp_large,"
                        "official,bound --profile benchmarks/results/bench/quick/profile.json")
    d = load(f"{RESULTS}/bench/long/details.json")
    return Table(t.sources, t.text + f"\n\n{d['note']}")


# ------------------------------------------------------------------ the engine's benchmarks


def quant(run: str, command: str) -> Table:
    """bench_quant.py: tokens/s per weight format and llama.cpp, best of the rounds."""
    rel = f"{RESULTS}/{run}/bench_quant.json"
    d = load(rel)
    configs, batches = d["configs"], sorted({b["batch"] for b in d["best"]})
    best = {(b["config"], b["batch"]): b for b in d["best"]}
    per_round: dict = {}
    for r in d["runs"]:
        per_round.setdefault((r["config"], r["batch"]), []).append(r["tok_s"])
    peers = [p for p in ("llama.cpp", "llama.cpp-native") if p in configs and "native" in configs]
    header = ["batch", *[f"{c}: tok/s (rounds)" for c in configs], *[f"native / {p}" for p in peers]]
    body = []
    for b in batches:
        cells = [str(b)]
        for c in configs:
            rounds = per_round.get((c, b), [])
            cells.append(f"{best[(c, b)]['tok_s']:.1f} ({span(rounds)})" if (c, b) in best else "-")
        cells += [f"{best[('native', b)]['tok_s'] / best[(p, b)]['tok_s']:.2f}x" for p in peers]
        body.append(cells)
    rss = ", ".join(f"{k} {v:,.0f} MB" for k, v in d["rss_mb"].items())
    waves = (f"whole waves of requests for at least {d['min_s']:.0f} s a configuration and batch in each round"
             if d.get("min_s") else "one wave of requests a configuration and batch in each round")
    spread = (f"{d['threads']} threads, {d['prompt']}-token prompts, {d['new_tokens']} greedy tokens a request, "
              f"{waves}, best of {d['rounds']} rounds (their range in brackets); RSS: {rss}"
              + (f" ({d['rss_note']})" if d.get("rss_note") else ""))
    for peer, key in (("llama.cpp", "llama_cpp_build"), ("llama.cpp-native", "llama_cpp_native_build")):
        isa = built_with(d["host"].get(key))
        if isa:
            spread += f"; {peer}'s build: {' '.join(isa)}"
    return Table([rel], caption(rel, d, command, spread) + "\n\n" + rows(header, body))


def built_with(system_info: str | None) -> list[str]:
    """The instruction sets (and llamafile's kernels) a llama.cpp `system_info` line says are on."""
    words = (system_info or "").replace("|", " ").split()
    return list(dict.fromkeys(w for w, eq, v in zip(words, words[1:], words[2:])
                              if eq == "=" and v == "1" and w.isupper() and w not in ("OPENMP", "REPACK")))


def engine_vs_transformers() -> Table:
    rel = f"{RESULTS}/bench_engine.json"
    d = load(rel)
    body = [[str(r["threads"]), str(r["batch"]), f"{r['ours_ms']:.1f}", f"{r['ours_tok_s']:.1f}", f"{r['hf_ms']:.1f}",
             f"{r['hf_tok_s']:.1f}", f"{r['speedup']:.2f}x"]
            for r in sorted(d["vs_transformers"], key=lambda r: (-r["threads"], r["batch"]))]
    header = ["threads", "batch", "ours ms/step", "ours tok/s", "transformers ms/step", "transformers tok/s",
              "ratio"]
    pre = [[str(r["threads"]), f"{r['batch']} x {r['tokens']}", f"{r['ours_ms']:.0f}", f"{r['hf_ms']:.0f}",
            f"{r['speedup']:.2f}x"] for r in d["prefill_vs_transformers"]]
    text = (caption(rel, {**d, "host": d["machine"]}, "python benchmarks/bench_engine.py --no-compile",
                    "SmolLM2-135M, float32 on both sides, 32-token prompts, 24 greedy steps, the best round "
                    "(the rounds themselves are not recorded)")
            + "\n\n" + rows(header, body) + "\n\nPrefill, same comparison (" + d["prefill_note"] + "):\n\n"
            + rows(["threads", "requests x tokens", "ours ms", "transformers ms", "ratio"], pre))
    return Table([rel], text)


def route_overhead() -> Table:
    rel = f"{RESULTS}/bench_route.json"
    d = load(rel)
    body = [[r["program"], str(r["batch"]), f"{r['route_ms']:.2f}", f"{r['interpreter_ms']:.1f}",
             f"{r['forward_ms']:.1f}", pct(r["route_over_forward"]), f"{r['interpreter_over_route']:.0f}x"]
            for r in d["rows"]]
    header = ["program", "batch", "generated route, ms", "IR interpreter, ms", "small-model step, ms",
              "route / step", "interpreter / route"]
    spread = f"{d['model']}, {d['context']}-token contexts, {d['threads']} thread, median of {d['rounds']} rounds"
    return Table([rel], caption(rel, d, "python benchmarks/bench_route.py", spread) + "\n\n" + rows(header, body))


def invariance() -> Table:
    rel = f"{RESULTS}/invariance/demo/batch_invariance.json"
    d = load(rel)
    body = [[name, f"{len(r['differing_prompts'])} of {d['tasks']}", str(r["tokens"]), f"{r['wall_s']:.1f}"]
            for name, r in d["deployments"].items()]
    spread = (f"{d['route']}, {d['tasks']} shipped tasks, {d['max_tokens']} greedy tokens, N = {d['concurrency']}, "
              "one run; each deployment against concurrency 1")
    return Table([rel], caption(rel, d, f"python benchmarks/batch_invariance.py {d['route']}", spread) + "\n\n"
                 + rows(["deployment", "prompts whose tokens differ", "tokens", "wall s"], body))


def small_model() -> Table:
    rel = f"{RESULTS}/bench_small_model.json"
    d = load(rel)
    body = []
    for name, c in d["candidates"].items():
        if name.startswith("large"):
            continue
        speed = (f"{c['speedup_b1']:.2f}x / {c['speedup_b8']:.2f}x" if "step_ms_b1" in c else
                 f"{c['speedup_b1']:.2f}x / {c['speedup_b8']:.2f}x (products only)")
        ratio = f"{c['weight_bytes_ratio']:.2f}x" if "step_ms_b1" in c else "-"
        mark = " (chosen)" if name == d["chosen"] else ""
        body.append([name + mark, speed, ratio, pct(c["agreement"]), pct(c["agreement_top50_conf"])])
    header = ["candidate", "speed-up per decode step, batch 1 / 8", "weight bytes ratio", "greedy-token agreement",
              "on its most confident half"]
    large = d["candidates"]["large (30 layers)"]
    spread = (f"{d['prompts']} prompts x {d['tokens_per_prompt']} tokens, {d['threads']} thread, interleaved rounds; "
              f"the large model stepped in {large['step_ms_b1']:.1f} ms at batch 1 and {large['step_ms_b8']:.0f} ms "
              f"at batch 8")
    return Table([rel], caption(rel, d, "python benchmarks/bench_small_model.py", spread) + "\n\n" + rows(header, body))


def soak_run(run: str) -> Table:
    """One soak run: its requests, each kill -9 it made (if any), then each process's RSS
    before and after the warm-up."""
    rel = f"{RESULTS}/soak/{run}/soak.json"
    d = load(rel)
    q, lat, kv = d["requests"], d["latency_s"], d["kv_blocks_used"]
    blocks = ", ".join(f"{w} {kv['start'][w]:.0f} → {kv['end'][w]:.0f}" for w in sorted(kv["start"]))
    parts = [rows(["duration", "sent", "completed", "failed", "lost", "latency p50 / p99", "KV blocks start → end"],
                  [[f"{d['duration_s']:.0f} s", f"{q['sent']:,}", f"{q['completed']:,}", f"{q['failed']:,}",
                    f"**{q['lost']}**", f"{lat['p50']:.1f} s / {lat['p99']:.1f} s", blocks]])]
    if d.get("kills"):
        parts.append(rows(["kill -9", "requests in flight", "of them failed", "new requests failed", "serving again after"],
                          [[f"`{k['writer']}` at {k['t']:.0f} s", f"{k['in_flight']:.0f}", f"**{k['failed_in_flight']}**",
                            str(k["failed_new"]), f"{k['resumed_s']:.1f} s"] for k in d["kills"]]))
    warm = f"{d['warmup_s'] / 60:.0f} min"
    def warmed(r: dict) -> str:  # a killed subserver: its last process, after its own warm-up
        if not r.get("process_started_s"):
            return f"{r['after_warmup_mb']:,.0f} MB"
        return (f"{r['after_warmup_mb']:,.0f} MB (its process since {r['process_started_s']:.0f} s, "
                f"at {r['after_warmup_t']:.0f} s)")
    parts.append(rows(["process", "RSS at start", f"after the first {warm}", "at the end", f"growth after the first {warm}"],
                      [[f"`{w}`", f"{r['start_mb']:,.0f} MB", warmed(r), f"{r['end_mb']:,.0f} MB",
                        f"{r['growth_after_warmup_pct']:+.2f}%"] for w, r in sorted(d["rss"].items())]))
    kill_every = ""
    if d.get("kills"):  # runs before kill_every_s was recorded: the first kill comes after S seconds
        kill_every = f" --kill-every {d.get('kill_every_s') or round(d['kills'][0]['t'], -1):.0f}"
    command = (f"python benchmarks/soak.py {d['file']} --duration {d['duration_s']:.0f} --concurrency "
               f"{d['concurrency']}{kill_every}")
    return Table([rel], caption(rel, d, command, "one run") + "\n\n" + "\n\n".join(parts))


def faults_run() -> Table:
    """benchmarks/faults.py: kill -9 under load, overload at the door, idle connections,
    abandoned streams; one run, so one host."""
    rel = f"{RESULTS}/faults/faults.json"
    d = load(rel)
    rec, o, i, a = d["recovery"], d["overload"], d["idle"], d["abandoned"]
    kills = rows(["kill -9", "in flight", "noticed", "ready again", "1-token request after", "all done", "failed",
                  "differ from no kill", "resumed", "re-prefills"],
                 [[f"`{k['writer']}`", str(k["in_flight"]), f"{k['noticed_s']} s", f"{k['ready_again_s']} s",
                   f"{k['one_token_request_after_ready_s']} s", f"{k['all_done_s']} s", f"**{k['failed']}**",
                   f"**{k['differ']}**", f"{k['resumed']:.0f}", f"{k['reprefills']:.0f}"] for k in rec["kills"]])
    status = {str(k): v for k, v in o["status"].items()}
    lat = o["admitted_latency_s"]
    over = rows(["at once", "admitted", "503 (with Retry-After)", "admitted latency p50 / p99"],
                [[str(o["requests"]), str(status.get("200", 0)), f"{status.get('503', 0)} ({o['503_with_retry_after']})",
                  f"{lat['p50']} s / {lat['p99']} s"]])
    idle = rows(["idle connections", "a request served in", "evicted at the cap", "log growth"],
                [[f"{i['idle_connections']:,}", f"{i['request_s']} s", f"{i['evicted']:.0f}",
                  f"{i['log_growth_bytes']:,} bytes"]])
    aband = rows(["abandoned streams", "10-token request: 3 before", "4 after", "KV blocks all free (polled after those 4)"],
                 [[str(a["abandoned"]), ", ".join(f"{x:.2f} s" for x in a["before_s"]),
                   ", ".join(f"{x:.2f} s" for x in a["after_s"]), f"{a['kv_free_after_s']} s"]])
    extra = f" -- {' '.join(d['serve_args'])}" if d.get("serve_args") else ""
    command = (f"python benchmarks/faults.py {d['file']} --kills {len(rec['kills']) // 2} --concurrency "
               f"{rec['prompts']} --max-tokens {rec['max_tokens']} --overload {o['requests']} --idle "
               f"{i['idle_connections']} --abandon {a['abandoned']}{extra}")
    return Table([rel], caption(rel, d, command, "one run") + f"\n\n{rec['prompts']} greedy streamed requests of "
                 f"{rec['max_tokens']} tokens, each subserver killed in turn:\n\n" + kills + "\n\n" + over
                 + "\n\n" + idle + "\n\n" + aband)


def contention_run(run: str) -> Table:
    """benchmarks/contention.py: serve under load while hogs convert a model and write to disk;
    every answer by status, the restarts and the liveness gaps, the fuzzed bodies."""
    rel = f"{RESULTS}/contention/{run}/contention.json"
    d = load(rel)
    q, lat, live, fz, hogs = d["requests"], d["latency_s"], d["liveness"], d["fuzz"], d["hogs"]
    gb = 1e9
    hog = "; ".join(f"**{k}**: {h['what']} ({h['rounds']} rounds, {h['bytes_written'] / gb:,.0f} GB written)"
                    for k, h in hogs.items())
    ans = q["answers"]
    other_4xx = sum(n for k, n in ans.items() if k[0] == "4")
    load_ = rows(["duration", "clients", "answers", "200", "4xx", "5xx", "503 shed", "503 outage", "restarts",
                  "latency p50 / p99 (200s)"],
                 [[f"{d['duration_s']:.0f} s", str(d["concurrency"]), f"{sum(ans.values()):,}",
                   f"{ans.get('200', 0):,}", str(other_4xx), f"**{q['server_errors']}**", str(q["shed_503"]),
                   f"**{q['outage_503']}**", f"**{sum((live['restarts'] or {}).values()):.0f}**",
                   f"{lat['p50']:.1f} s / {lat['p99']:.1f} s"]])
    gaps = rows(["subserver", "restarts", "longest heartbeat gap", "longest gap without progress"],
                [[f"`{w}`", f"{live['restarts'][w]:.0f}", f"{live['heartbeat_gap_max_s'][w]:.2f} s",
                  f"{live['progress_gap_max_s'][w]:.2f} s"] for w in sorted(live["restarts"])])
    fuzzed = fz["by_status"]
    fuzz = rows(["fuzzed bodies (at concurrency 8, during the run)", "200", "400", "other 4xx", "5xx"],
                [[f"{fz['bodies']:,}", f"{fuzzed.get('200', 0):,}", f"{fuzzed.get('400', 0):,}",
                  str(sum(n for k, n in fuzzed.items() if k[0] == "4" and k != "400")),
                  f"**{len(fz['server_errors'])}**"]])
    host = (f"The hogs, each its own process at normal priority, beside other agents' work on the same "
            f"host: {hog}. Load average up to {d['load_1m_max']:.1f}, memory available down to "
            f"{d['mem_available_gb_min']:.1f} GB.")
    return Table([rel], caption(rel, d, d["command"], "one run") + "\n\n" + host + "\n\n" + load_ + "\n\n"
                 + gaps + "\n\n" + fuzz)



# ------------------------------------------------------------------ benchmarks/bench_cores.py


CORES_WORDS = {"small_alone": "small model alone", "large_alone": "large model alone",
               "split": "fixed halves (cores // writers threads each)", "all": "every writer all cores, OpenMP spinning",
               "all_passive": "every writer all cores, idle workers sleep", "share": "**by need** (`runtime/cores.py`)",
               "share_spin": "by need, OpenMP spinning", "lockstep": "one process, one pool, stepped in turn"}


def cores_table(scenarios: list[tuple[str, str]]) -> Table:
    """bench_cores.py runs of one host side by side: per mechanism, each scenario's median
    tokens/s with its rounds' range and its ratio to the small model alone (or to the large
    model alone where the small was not run)."""
    rels = [f"{RESULTS}/cores/{name}.json" for _, name in scenarios]
    docs = [load(r) for r in rels]
    same_host(docs, rels)
    names = [c for c in CORES_WORDS if any(c in d["median_tokens_per_s"] for d in docs)]
    header = ["cores held"] + [f"{label}: tok/s (rounds)" for label, _ in scenarios]
    body = []
    for c in names:
        row = [CORES_WORDS[c]]
        for d in docs:
            med = d["median_tokens_per_s"].get(c)
            if med is None:
                row.append("-")
                continue
            base = "small_alone" if "small_alone" in d["median_tokens_per_s"] else "large_alone"
            ratio = f", {med / d['median_tokens_per_s'][base]:.2f}x {base.split('_')[0]}" if c != base else ""
            row.append(f"{med:.1f} ({span([x['tokens_per_s'] for x in d['per_round'][c]])}){ratio}")
        body.append(row)
    runs = "; ".join(f"{label}: `{rerun(d['command'])}` (N = {d['concurrency']}, {d['rounds']} rounds of at least "
                     f"{d['min_s']:g} s, outputs agree: {d['outputs_agree']})" for (label, _), d in zip(scenarios, docs))
    text = f"*{host_words(docs[0], rels[0])}; {runs} ({', '.join(rels)}).*\n\n" + rows(header, body)
    return Table(rels, text)


# (run, router, what to know of its tok/s)
FITTED_CODER_RUNS = (("coder_r2r", "R2R", "; tok/s measured beside a router fit"), ("coder_citer", "CITER", ""),
                     ("coder_co_llm", "Co-LLM", ""))


def headline_coder(run: str, fitted: tuple = ()) -> Table:
    """The README's headline: the coder pair on HumanEval (eval run `run`), each
    configuration's pass@1, the large model's share of the tokens, and its speed at N = 8
    (the same eval run); then the `fitted` routers' runs on the same problems."""
    rel = f"{EVAL}/{run}/summary.json"
    ev = load(rel)
    m = ev["meta"]
    tau = m["bound_params"]["tau"]["value"]

    def row(label: str, c: dict) -> list[str]:
        return [label, f"{100 * c['accuracy']:.1f}% ({c['correct']} of {c['answered']})", pct(c["large_share"]),
                f"{c['tokens_per_s']:.1f}"]

    cfg = ev["configs"]
    body = [row("small alone (Qwen2.5-Coder-0.5B-Instruct)", cfg["small"]),
            row("large alone (Qwen2.5-Coder-1.5B-Instruct)", cfg["large"]),
            row(f"**routed**: entropy rule, tau = {tau:g} (`examples/coder/entropy.route`)", cfg["routed"])]
    body += [row(f"routed, tau = {p['value']:g}", p) for p in ev.get("sweep", {}).get("points", [])]
    which = "HumanEval's 164 problems" if m["n_prompts"] == 164 else \
        f"{m['n_prompts']} of HumanEval's 164 problems spread evenly"
    spread = (f"{which}, greedy, at most {m['max_tokens']} "
              f"tokens, each answer run against its tests in the sandbox; tok/s at {m['concurrency']} requests "
              f"in flight, the configurations one after another, one run")
    command = m.get("command") or EVAL_COMMANDS[run]
    rels = [rel]
    for fitted_run, name, speed_note in fitted:  # the routers fitted for the pair, on the same problems
        fitted_rel = f"{EVAL}/{fitted_run}/summary.json"
        if not (ROOT / fitted_rel).exists():
            continue
        doc = load(fitted_rel)
        same_host([ev, doc], [rel, fitted_rel])
        threshold = doc["meta"]["bound_params"]["threshold"]["value"]
        body.append(row(f"**routed**: {name}'s router fitted for the pair, threshold {threshold:g} "
                        f"(`{doc['meta']['program']}`{speed_note})", doc["configs"]["routed"]))
        body += [row(f"routed, {name}, threshold {p['value']:g}", p) for p in (doc.get("sweep") or {}).get("points", [])]
        spread += f"; {name}: `{rerun(doc['meta']['command'])}`"
        rels.append(fitted_rel)
    return Table(rels, caption(rel, ev, command, spread) + "\n\n" +
                 rows(["configuration", "HumanEval pass@1", "large model's tokens", f"tok/s at N = {m['concurrency']}"],
                      body))


def same_host(docs: list[dict], rels: list[str]) -> None:
    hosts = {(host_of(d)["cpu"], str(host_of(d)["cores"])) for d in docs}
    if len(hosts) != 1:
        raise SystemExit(f"one table holds one host, but {', '.join(rels)} come from {sorted(hosts)}")


# ------------------------------------------------------------------ `tokenrouter eval`


EVAL = f"{RESULTS}/eval"
EVAL_COMMANDS = {
    "demo": "tokenrouter eval benchmarks/demo_pair/derived.route --limit 40 --max-tokens 24 --sweep tau=0.3:0.6:4",
    "lens16": "tokenrouter eval benchmarks/demo_pair/derived.route --model slm=LENS16 --limit 40 --max-tokens 24",
    "rstitch": "tokenrouter eval examples/rstitch.route --limit 40 --max-tokens 24 --sweep tau=0:0.1:3",
    "native": "tokenrouter eval benchmarks/demo_pair/native.route --limit 40 --max-tokens 24 --sweep tau=0.3:0.6:2",
    "native_speed": "tokenrouter eval benchmarks/demo_pair/native.route --limit 8 --max-tokens 16 --concurrency 1,8",
    "demo_quiet": "tokenrouter eval examples/demo.route --limit 40 --max-tokens 24 --concurrency 1,8",
    "coder_entropy": "tokenrouter eval examples/coder/entropy.route --tasks humaneval --limit 20 "
                     "--sweep tau=0.05:0.2:2 --concurrency 8",
}


def eval_summary(run: str) -> Table:
    from tokenrouter.eval.tables import markdown

    rel = f"{EVAL}/{run}/summary.json"
    s = load(rel)
    m = s["meta"]
    spread = (f"{m['n_prompts']} prompts, {m['max_tokens']} greedy tokens, one run, {m['seconds']:.0f} s; "
              "tokens/s from configurations run one after another")
    command = m.get("command") or EVAL_COMMANDS[run]
    return Table([rel], caption(rel, s, command, spread) + "\n\n" + markdown(s))


def _cfg(run: str) -> dict:
    return load(f"{EVAL}/{run}/summary.json")


def _point(run: str, value: float | None) -> dict:
    """A run's routed scores at a sweep value (None: the program's own setting)."""
    s = _cfg(run)
    if value is None:
        return s["configs"]["routed"]
    return next(p for p in s["sweep"]["points"] if abs(p["value"] - value) < 1e-9)


def _host_cell(run: str) -> str:
    rel = f"{EVAL}/{run}/summary.json"
    d = load(rel)
    h = host_of(d)
    bw = f"{h['bw']:.1f} GB/s" if h["bw"] else "bandwidth not recorded"
    return f"{bw}, load {h['load']:.0f}, {date_of(d, rel)}" if h["load"] is not None else f"{bw}, {date_of(d, rel)}"


def demo_pair_choice() -> Table:
    """The candidate pairs side by side: routed accuracy against small and large alone, the
    large model's share, and the two criteria the demo's choice asked for."""
    picks = [("6 layers + lens / float32", "demo", None), ("6 layers + lens / float32", "demo", 0.3),
             ("16 layers + lens / float32", "lens16", None), ("R-Stitch, 6 layers + lens", "rstitch", None),
             ("int4 (native) / float32", "native", 0.3), ("int4 (native) / float32", "native", None)]
    runs = sorted({run for _, run, _ in picks})
    rels = [f"{EVAL}/{r}/summary.json" for r in runs]
    same_host([load(r) for r in rels], rels)
    body = []
    for label, run, value in picks:
        s = _cfg(run)
        small, large = s["configs"]["small"]["correct"], s["configs"]["large"]["correct"]
        p = _point(run, value)
        tau = value if value is not None else s["meta"]["bound_params"]["tau"]["value"]
        routed = p.get("correct", round(p["accuracy"] * s["meta"]["n_answered"]))
        closer = abs(routed - large) < abs(routed - small)
        body.append([f"{label} ({tau:g})", f"{routed}/{s['meta']['n_answered']} ({small} / {large})",
                     pct(p["large_share"]), f"{'yes' if closer else 'no'}, {'yes' if p['large_share'] <= 0.34 else 'no'}",
                     f"`{run}`: {_host_cell(run)}"])
    header = ["pair (tau)", "routed right (small / large alone)", "large share",
              "closer to large alone; large share <= 1/3", "run: host"]
    h = host_of(load(rels[0]))
    text = (f"*{h['cpu']}, {h['cores']} cores; the runs above ({', '.join(rels)}).*\n\n" + rows(header, body))
    return Table(rels, text)


def fitted_routers() -> Table:
    runs = ["fitted/r2r", "fitted/citer", "fitted/co_llm", "demo"]
    rels = [f"{EVAL}/{r}/summary.json" for r in runs]
    same_host([load(r) for r in rels], rels)
    demo = _cfg("demo")
    n = demo["meta"]["n_answered"]

    def cell(c: dict) -> str:
        return f"{pct(c['accuracy'])} ({c['correct']}/{n})"

    body = [["small alone", cell(demo["configs"]["small"]), "0.0%", pct(0), "", "", _host_cell("demo")],
            ["large alone", cell(demo["configs"]["large"]), "100.0%", pct(1), "", "", _host_cell("demo")]]
    for run in runs[:3]:
        s = _cfg(run)
        r, vl, vs = s["configs"]["routed"], s["diff"]["vs_large"], s["diff"]["vs_small"]
        body.append([f"`{s['meta']['program']}`", cell(r), pct(r["exact_match_with_large"]), pct(r["large_share"]),
                     f"{vl['both_right']} / {vl['fixed']} / {vl['broken']} / {vl['both_wrong']}",
                     f"{vs['fixed']} / {vs['broken']}", _host_cell(run)])
    points = [_point("demo", 0.4), _point("demo", None)]
    body.append(["entropy rule (`derived.route`, tau 0.4 / 0.5)", " / ".join(pct(p["accuracy"]) for p in points),
                 " / ".join(pct(p["exact_match_with_large"]) for p in points),
                 " / ".join(pct(p["large_share"]) for p in points), "", "", _host_cell("demo")])
    header = ["program", "routed accuracy", "exact match with large", "large share",
              "vs large: both right / fixed / broken / both wrong", "vs small: fixed / broken", "host"]
    h = host_of(load(rels[0]))
    text = (f"*{h['cpu']}, {h['cores']} cores; `.venv/bin/tokenrouter eval examples/NAME.route --limit 20 "
            f"--max-tokens 24 --reuse DEMO_OUT`, one run each ({', '.join(rels)}).*\n\n" + rows(header, body))
    return Table(rels, text)


def eval_speed() -> Table:
    rel = f"{EVAL}/native_speed/summary.json"
    s = load(rel)
    concs = s["meta"]["concurrencies"]
    names = {"small": f"small alone ({s['meta']['small']})", "large": f"large alone ({s['meta']['large']})",
             "routed": f"routed (large share {pct(s['configs']['routed']['large_share'])})"}
    body = [[names[k]] + [f"{s['configs'][k]['tokens_per_s_at'][str(c)]:.1f}" for c in concs] for k in names]
    spread = f"{s['meta']['n_prompts']} prompts, {s['meta']['max_tokens']} greedy tokens, one run"
    return Table([rel], caption(rel, s, EVAL_COMMANDS["native_speed"], spread) + "\n\n"
                 + rows(["configuration"] + [f"tokens/s at {c}" for c in concs], body))


# ------------------------------------------------------------------ the registry


TABLES: dict[str, Callable[[], Table]] = {
    "serving-demo-xeon": lambda: serving("quick_demo_xeon"),
    "serving-bench-quick": lambda: serving("quick"),
    "serving-bench-levels": lambda: serving("levels_epyc"),
    "serving-bench-levels-native": lambda: serving("levels_epyc_native"),
    "serving-bench-levels-xeon": lambda: serving("levels_xeon"),
    "serving-bench-256": lambda: serving("full_xeon"),
    "serving-long": long_run,
    "serving-bench-n8-xeon": lambda: serving("n8_256_xeon"),
    "serving-bench-1024-xeon": lambda: serving("n8_1024_xeon"),
    "serving-long-xeon-c": lambda: serving("long_xeon/c_attention"),
    # the run set TOKENROUTER_ATTENTION=torch, which its recorded command does not show
    "serving-long-xeon-torch": lambda: serving("long_xeon/torch_attention",
                                               "TOKENROUTER_ATTENTION=torch .venv/bin/tokenrouter bench --long "
                                               "--rounds 1 --configs tokenrouter --profile "
                                               "benchmarks/results/bench/quick/profile.json"),
    "quant-int4-kernels": lambda: quant("bench_quant_xeon/int4_kernels",
                                        "python benchmarks/bench_quant.py --configs none,native,native-torch-int4,"
                                        "llama.cpp --batches 1,8,16 --rounds 2"),
    "quant-epyc-avx512": lambda: quant("bench_quant_epyc_avx512",
                                       "python benchmarks/bench_quant.py --configs none,native,llama.cpp,"
                                       "llama.cpp-native --llama-server .cache/llama-server/llama-server "
                                       "--batches 1,8,16 --rounds 2"),
    "quant-epyc-avx2-build": lambda: quant("bench_quant_epyc_avx512/avx2_build",
                                          "CC=scripts/cc-avx2 TOKENROUTER_CACHE=/tmp/tr-avx2 .venv/bin/python "
                                          "benchmarks/bench_quant.py --configs native,llama.cpp --batches 1,8,16 "
                                          "--rounds 2"),
    "engine-vs-transformers": engine_vs_transformers,
    "route-overhead": route_overhead,
    "invariance-demo": invariance,
    "small-model": small_model,
    "soak-hour": lambda: soak_run("hour"),
    "soak-kills": lambda: soak_run("kill30"),
    "soak-mmap32": lambda: soak_run("mmap32"),
    "faults": faults_run,
    "cores-bench-pair": lambda: cores_table([("no handoffs (`handoff=0`)", "bench_handoff0_n8"),
                                             ("the program's 5% handoffs", "bench_n8")]),
    "headline-coder": lambda: headline_coder("coder_entropy_164", (("coder_r2r_164", "R2R", ""),
                                                                  ("coder_r2r_164_low", "R2R", ""),
                                                                  ("coder_citer_164", "CITER", ""),
                                                                  ("coder_co_llm_164", "Co-LLM", ""))),
    "headline-coder-20": lambda: headline_coder("coder_entropy", FITTED_CODER_RUNS),
    "serving-coder-pair": lambda: serving("coder_pair"),
    "serving-coder-humaneval": lambda: serving("coder_humaneval"),
    "eval-coder": lambda: eval_summary("coder_entropy"),
    "eval-coder-164": lambda: eval_summary("coder_entropy_164"),
    "eval-coder-r2r": lambda: eval_summary("coder_r2r"),
    "contention-small-model": lambda: contention_run("convert-0.5b"),
    "contention-large-model": lambda: contention_run("convert-1.5b"),
    "eval-demo": lambda: eval_summary("demo"),
    "eval-lens16": lambda: eval_summary("lens16"),
    "eval-rstitch": lambda: eval_summary("rstitch"),
    "eval-native": lambda: eval_summary("native"),
    "eval-demo-quiet": lambda: eval_summary("demo_quiet"),
    "eval-demo-pair-choice": demo_pair_choice,
    "eval-fitted-routers": fitted_routers,
    "eval-speed": eval_speed,
}


def documents() -> list[Path]:
    return [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def remade(text: str, where: Path, made: dict[str, Table]) -> str:
    """`text` with every table block's body remade; an unknown NAME is an error."""
    def one(m: re.Match) -> str:
        name = m.group("name")
        if name not in TABLES:
            raise SystemExit(f"{where.relative_to(ROOT)}: no table named {name!r} in scripts/results_tables.py")
        if name not in made:
            made[name] = TABLES[name]()
        return m.group(1) + made[name].text + "\n" + m.group(4)
    return BLOCK.sub(one, text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="change nothing; exit 1 where a document differs")
    mode.add_argument("--list", action="store_true", help="each table, the documents holding it and its JSON")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))  # tokenrouter.eval.tables, from this checkout
    made: dict[str, Table] = {}
    where: dict[str, list[str]] = {}
    differs = False
    for doc in documents():
        text = doc.read_text(encoding="utf-8")
        for m in BLOCK.finditer(text):
            where.setdefault(m.group("name"), []).append(str(doc.relative_to(ROOT)))
        new = remade(text, doc, made)
        if new == text:
            continue
        differs = True
        if args.check or args.list:
            if args.check:
                sys.stdout.writelines(difflib.unified_diff(text.splitlines(True), new.splitlines(True),
                                                           f"{doc.relative_to(ROOT)} (committed)",
                                                           f"{doc.relative_to(ROOT)} (made from the JSON)"))
        else:
            doc.write_text(new, encoding="utf-8")
            print(f"rewrote {doc.relative_to(ROOT)}", file=sys.stderr)
    if args.list:
        for name in TABLES:
            sources = made[name].sources if name in made else TABLES[name]().sources
            print(f"{name}: in {', '.join(where.get(name, ['no document']))}; from {', '.join(sources)}")
    unused = sorted(set(TABLES) - set(where))
    if unused and not args.list:
        print(f"tables no document holds: {', '.join(unused)}", file=sys.stderr)
    return 1 if args.check and (differs or unused) else 0


if __name__ == "__main__":
    sys.exit(main())
