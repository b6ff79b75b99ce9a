"""What the tuner reads from a routing program: its models, start, handoff actions, the
routing probabilities the program itself fixes, and its schedule; and the B_i it chooses
for the program's `auto` writers (`auto_thresholds`), which `tokenrouter serve --profile`
and the bench hand to the launcher as plain numbers (`runtime.launch`,
`LaunchOptions.tuned_batch`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Sequence

from tokenrouter.compiler import ir

from tokenrouter.tuner.api import choose_batch_thresholds
from tokenrouter.tuner.errors import TuneError
from tokenrouter.tuner.profile import Profile
from tokenrouter.tuner.system import InvalidSystem

log = logging.getLogger(__name__)


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


def auto_thresholds(program: ir.Program, profile: Profile | None, concurrency: int, writers: Sequence[str],
                    overrides: dict[str, int] | None = None) -> dict[str, int]:
    """B_i from the DTMC tuner for `writers` (the served ones) whose threshold is `auto` and
    not overridden, when there is a profile and the program fixes its routing probabilities
    (seeded coins, one-token visits); otherwise they must be measured first (`tokenrouter
    tune`) and {} lets the launcher's documented default apply."""
    given = dict(program.schedule.batch)
    auto = [w for w in writers if given.get(w, "auto") == "auto" and w not in (overrides or {})]
    if not auto or profile is None:
        return {}
    try:
        pi = inputs_from_program(program)
        if not set(pi.route_probs) >= set(pi.models):
            log.warning("auto thresholds: the program does not fix its routing probabilities; "
                        "using the default (run `tokenrouter tune` for measured ones)")
            return {}
        return dict(choose_batch_thresholds(profile, concurrency, pi.route_probs, models=pi.models,
                                            start=pi.start, rewrite=pi.rewrite, max_wait_ms=pi.max_wait_ms))
    except TuneError as exc:
        log.warning("auto thresholds: the tuner could not decide (%s); using the default", exc)
        return {}
