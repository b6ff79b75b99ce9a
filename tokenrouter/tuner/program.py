"""What the tuner reads from a routing program: its models, start, handoff actions, the
routing probabilities the program itself fixes, and its schedule."""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenrouter.compiler import ir

from .system import InvalidSystem


@dataclass
class ProgramInputs:
    models: list[str]
    start: str
    rewrite: dict[tuple[str, str], bool]
    #: probabilities the program fixes: a bare `bernoulli(p)` condition, a `max 1` bound
    route_probs: dict[str, dict[str, float]] = field(default_factory=dict)
    batch: dict[str, int] = field(default_factory=dict)  # fixed thresholds
    auto: list[str] = field(default_factory=list)  # models with `batch X = auto`
    max_wait_ms: dict[str, float] = field(default_factory=dict)


def inputs_from_program(program: ir.Program) -> ProgramInputs:
    if program.ensembles:
        raise InvalidSystem("the tuner models programs whose writers are single models; "
                           f"this one has ensembles ({', '.join(e.name for e in program.ensembles)})")
    models = [m.name for m in program.models]
    rewrite = {(t.source, t.dest): t.action == "rewrite" for t in program.transitions}
    probs: dict[str, dict[str, float]] = {}
    for t in program.transitions:
        if isinstance(t.when, ir.Bernoulli):
            probs.setdefault(t.source, {})[t.dest] = float(t.when.p)
    for b in program.bounds:
        if b.max_tokens == 1 and b.then:
            probs[b.writer] = {b.then: 1.0}
            rewrite.setdefault((b.writer, b.then), False)
    batch, auto = {}, []
    for name, v in program.schedule.batch:
        if v == "auto":
            auto.append(name)
        else:
            batch[name] = int(v)
    return ProgramInputs(models, program.start, rewrite, probs, batch, auto, dict(program.schedule.max_wait_ms))
