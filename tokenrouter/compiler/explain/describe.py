"""A checked program in words (`tokenrouter explain`): its writers (each model's weight
format and engine), start, routers and heads (weights file, inputs), handoffs with their
conditions and actions, visit bounds, serving schedule and bound parameters.

It reads the IR, so it shows the program as it will run, with `--set` values in place; a
number that came from a parameter is shown by the parameter's name and value (`tau=0.3`).
What only the runtime knows (a writer's measured kernel plan on this host) the caller
passes as extra lines per writer. `draw.py` draws the same facts as a state machine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from tokenrouter import engines
from tokenrouter.compiler import ir
from tokenrouter.compiler.text import expr_text, input_text
from tokenrouter.compiler.weights.files import input_widths


@dataclass(frozen=True)
class Edge:
    """One way a request leaves a writer: a transition, or a visit bound's `then`."""

    source: str
    dest: str
    kind: str  # "rule" | "max"
    condition: str  # the rule's condition; for a bound, "after N tokens"
    action: str  # keep | rewrite
    order: int  # a rule's place among the rules out of its writer (1-based); 0 for a bound


def edges(program: ir.Program) -> list[Edge]:
    out = []
    for w in program.writers():
        for i, t in enumerate(program.transitions_from(w), 1):
            out.append(Edge(t.source, t.dest, "rule", expr_text(t.when), t.action, i))
        b = program.bound(w)
        if b.max_tokens is not None and b.then:
            n = b.max_tokens
            out.append(Edge(w, b.then, "max", f"after {n} token{'s' if n != 1 else ''}", "keep", 0))
    return out


def reachable(program: ir.Program) -> list[str]:
    """The writers a request can reach from the start, in declaration order (a model that
    is only an ensemble's member never writes on its own)."""
    seen, todo = {program.start}, [program.start]
    while todo:
        w = todo.pop()
        nxt = [t.dest for t in program.transitions_from(w)] + [program.bound(w).then]
        for d in nxt:
            if d and d not in seen:
                seen.add(d)
                todo.append(d)
    return [w for w in program.writers() if w in seen]


def writer_line(program: ir.Program, name: str) -> str:
    ens = {e.name: e for e in program.ensembles}
    if name in ens:
        e = ens[name]
        members = ", ".join(f"{m} {w:g}" for m, w in zip(e.members, e.weights))
        extra = f", top-{e.topk_union} union" if e.topk_union else ""
        extra += f", seed {e.seed}" if e.mode == "mixture" else ""
        return f"ensemble ({e.mode} of {members}{extra})"
    m = program.model(name)
    fmt = m.dtype if m.quant == "none" else f"{m.dtype}, quant {m.quant}"
    if m.engine != engines.DEFAULT:
        fmt += f", served by {engines.capabilities(m.engine).title}" + (
            f" over {m.tensor_parallel} tensor-parallel ranks" if m.tensor_parallel > 1 else "")
    return f"model {m.path} ({m.role}, {fmt})"


QUANT_WORDS = {"native": "the GGUF file's own blocks (Q4_0/Q4_1/Q4_K as 4-bit codes, Q8_0 as int8)",
               "int4": "quantised to 4 bits on load (min/max per group of 32)",
               "int8": "quantised to int8 on load (one scale per row)"}


def model_lines(program: ir.Program, name: str) -> list[str]:
    """A model writer's weight format and the engine that runs it."""
    m = program.model(name)
    place = dict(program.schedule.placement).get(name, "cpu")
    weights = (f"weights: {m.dtype}" if m.quant == "none" else
               f"weights: {QUANT_WORDS[m.quant]}; bfloat16 into each product, {m.dtype} between them")
    caps = engines.capabilities(m.engine)
    ranks = f" over {m.tensor_parallel} tensor-parallel ranks" if m.tensor_parallel > 1 else ""
    return [weights, f"engine: {caps.explain or caps.title}{ranks}" + (f", on {place}" if caps.placed else "")]


def shown_path(path: str) -> str:
    """A file as a user finds it: relative to the working directory when under it."""
    rel = os.path.relpath(path) if os.path.isabs(path) else path
    return path if rel.startswith("..") else rel


def network_lines(program: ir.Program) -> list[str]:
    """Each router network and head row: whose step it reads, its weights file, its inputs."""
    out = []
    for r in program.routers:
        inputs = ", ".join(f"{input_text(i)} ({width} wide)" if width else input_text(i)
                           for i, width in zip(r.inputs, input_widths(r)))
        out.append(f"{r.name} on {r.model}: {r.arch} network, weights {shown_path(r.file)}")
        out.append(f"   inputs: {inputs}")
    heads = {(e.model, e.file, e.sigmoid) for t in program.transitions for e in ir.walk(t.when)
             if isinstance(e, ir.HeadLogit)}
    for model, file, sigmoid in sorted(heads):
        out.append(f"head on {model}: an extra LM-head row, weights {shown_path(file)}")
        out.append(f"   input: hidden(-1) of {model}; {'sigmoid of its logit' if sigmoid else 'its raw logit'}")
    return out


def _action_words(e: Edge) -> str:
    if e.action == "rewrite":
        return f"rewrite: the token {e.source} just wrote is dropped and {e.dest} writes that position"
    return f"keep: the token {e.source} just wrote stays"


def _schedule_lines(s: ir.Schedule) -> list[str]:
    def per(pairs, fmt=str):
        return ", ".join(f"{k} {fmt(v)}" for k, v in pairs)

    lines = []
    if s.batch:
        lines.append(f"batch threshold: {per(s.batch)}")
    if s.max_wait_ms:
        lines.append(f"max wait: {per(s.max_wait_ms, lambda v: f'{v:g}ms')}")
    if s.placement:
        lines.append(f"placement: {per(s.placement)}")
    if s.threads:
        lines.append(f"threads: {per(s.threads)}")
    if s.graph_batch_sizes:
        lines.append(f"graph batch sizes: {', '.join(map(str, s.graph_batch_sizes))}")
    if s.graph_tokens:
        lines.append(f"graph tokens: {', '.join(map(str, s.graph_tokens))}")
    return lines


def param_value(p: ir.Param) -> str:
    if p.type == "duration":
        return f"{p.value:g}ms"
    if p.type == "float":
        return f"{p.value:g}"
    return str(p.value)


def param_line(p: ir.Param) -> str:
    rng = ""
    if p.lo is not None and p.hi is not None:
        unit = "ms" if p.type == "duration" else ""
        rng = f" in [{p.lo:g}{unit}, {p.hi:g}{unit}]"
    origin = f"set by --set {p.name}={p.text}" if p.origin == "set" else "the default"
    return f"{p.name} = {param_value(p)}  ({p.type}{rng}; {origin})"


def describe(program: ir.Program, writer_notes: dict[str, list[str]] | None = None) -> str:
    """The program in words, one fact per line; `writer_notes[w]`: more lines about writer w."""
    out = [f"{program.source}", ""]
    out.append("writers:")
    width = max(len(w) for w in program.writers())
    live = reachable(program)
    member_of = {m: e.name for e in program.ensembles for m in e.members}
    models = {m.name for m in program.models}
    for w in program.writers():
        mark = "  <- start" if w == program.start else ""
        if w not in live:
            mark = f"  (a member of {member_of[w]} only)" if w in member_of else "  (never reached)"
        out.append(f"  {w:<{width}}  {writer_line(program, w)}{mark}")
        more = (model_lines(program, w) if w in models else []) + list((writer_notes or {}).get(w, ()))
        out += [f"  {'':<{width}}    {line}" for line in more]
    out.append(f"start: {program.start} writes every request's first token")
    nets = network_lines(program)
    if nets:
        out += ["", "routers:"] + [f"  {line}" for line in nets]
    out.append("")
    es = edges(program)
    rules = [e for e in es if e.kind == "rule"]
    out.append("handoffs (after each token, the rules out of its writer are tried in the order listed; the first "
               "that holds moves the request; none: it stays):" if rules else "handoffs: none")
    for i, e in enumerate(rules, 1):
        out.append(f"  {i}. {e.source} -> {e.dest} when {e.condition}")
        out.append(f"     {_action_words(e)}")
    bounds = [b for b in program.bounds]
    out.append("")
    out.append("visit bounds:" if bounds else "visit bounds: none")
    for b in bounds:
        parts = []
        if b.min_tokens > 1:
            parts.append(f"writes at least {b.min_tokens} tokens before its rules are tried")
        if b.max_tokens is not None:
            parts.append(f"writes at most {b.max_tokens} token{'s' if b.max_tokens != 1 else ''}, then hands "
                         f"over to {b.then} (keep)")
        out.append(f"  {b.writer}: {'; '.join(parts) or 'no bound'}")
    out.append("")
    sched = _schedule_lines(program.schedule)
    out.append("serve schedule (speed only, never the tokens):" if sched else "serve schedule: defaults")
    out += [f"  {line}" for line in sched]
    out.append("")
    out.append("parameters:" if program.params else "parameters: none")
    out += [f"  {param_line(p)}" for p in program.params]
    return "\n".join(out) + "\n"
