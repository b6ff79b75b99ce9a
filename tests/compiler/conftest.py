"""Shared fixtures of the compiler back-end tests.

`PROGRAMS` builds one hand-written `ir.Program` per algorithm; the example files are
tested the same way (`EXAMPLES`, `load_example`, `get_program("example:NAME")`). `make_batch`
draws one random batch for a writer of any program: random logits with edge-case rows
(uniform, one-hot, ties, NaN, +inf, -inf, all -inf), hidden states and token embeddings of
the declared widths, per-request visit counts, positions and seeds, as both the batched
`StepTensors` and the interpreter's per-request `RequestStep`s.

Golden files are rewritten when TOKENROUTER_UPDATE_GOLDEN=1.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck
from safetensors.torch import save_file

from tokenrouter.compiler import ir
from tokenrouter.protocol.step import StepTensors
from tokenrouter.compiler.backend.interpreter import RequestStep
from tokenrouter.runtime.loader import model_facts

UPDATE_GOLDEN = os.environ.get("TOKENROUTER_UPDATE_GOLDEN") == "1"
REPO = Path(__file__).resolve().parents[2]
HEAD_DIM = 16  # hidden width used for head rows when the program does not declare one


def S(file: str, line: int) -> ir.Span:
    return ir.Span(file, line, 1, line, 40)


def _lt(expr_left, op, right) -> ir.Compare:
    return ir.Compare(op, expr_left, ir.Const(right))


def _pair(name: str) -> tuple[ir.Model, ir.Model]:
    return (ir.Model("slm", "tiny-small", role="small", span=S(name, 2)),
            ir.Model("llm", "tiny-large", role="large", span=S(name, 3)))


def r2r() -> ir.Program:
    f = "r2r.route"
    router = ir.RouterNet("r2r", "slm", "weights/r2r.safetensors",
                          inputs=(ir.InputHidden(-1, 16), ir.InputTokenEmbedding(16), ir.InputTopkLogits(4)),
                          activation="gelu", span=S(f, 4))
    return ir.Program(source=f, language_version=1, models=_pair(f), start="slm", routers=(router,),
                      transitions=(ir.Transition("slm", "llm", _lt(ir.RouterProb("r2r"), ">=", 0.55), "rewrite", S(f, 7)),),
                      bounds=(ir.VisitBound("llm", 1, 1, "slm", S(f, 8)),))


def citer() -> ir.Program:
    f = "citer.route"
    router = ir.RouterNet("citer", "slm", "weights/citer.safetensors",
                          inputs=(ir.InputHidden(2, 12), ir.InputScalar(ir.Entropy("slm", True)),
                                  ir.InputScalar(ir.TopProb("slm"))),
                          activation="relu", output_index=1, span=S(f, 4))
    return ir.Program(source=f, language_version=1, models=_pair(f), start="slm", routers=(router,),
                      transitions=(ir.Transition("slm", "llm", _lt(ir.RouterProb("citer"), "<", 0.45), "rewrite", S(f, 7)),),
                      bounds=(ir.VisitBound("llm", 1, 1, "slm", S(f, 8)),))


def co_llm() -> ir.Program:
    f = "co_llm.route"
    head = ir.HeadLogit("slm", "weights/defer.safetensors", sigmoid=True, span=S(f, 7))
    return ir.Program(source=f, language_version=1, models=_pair(f), start="slm",
                      transitions=(ir.Transition("slm", "llm", ir.Compare(">", head, ir.Const(0.5)), "rewrite", S(f, 7)),),
                      bounds=(ir.VisitBound("llm", 1, 1, "slm", S(f, 8)),))


def rstitch() -> ir.Program:
    f = "rstitch.route"
    return ir.Program(source=f, language_version=1, models=_pair(f), start="slm",
                      transitions=(ir.Transition("slm", "llm", _lt(ir.Entropy("slm", True), ">", 0.3), "rewrite", S(f, 6)),
                                   ir.Transition("llm", "slm", _lt(ir.Entropy("llm", True), "<=", 0.3), "keep", S(f, 7))),
                      bounds=(ir.VisitBound("llm", 1, 6, "slm", S(f, 8)),))


def ensemble() -> ir.Program:
    f = "ensemble.route"
    models = tuple(ir.Model(n, f"tiny-{n}", role="member", span=S(f, i + 2)) for i, n in enumerate("abc"))
    trio = ir.Ensemble("trio", ("a", "b", "c"), (0.5, 0.3, 0.2), "average", topk_union=3, span=S(f, 5))
    return ir.Program(source=f, language_version=1, models=models, start="trio", ensembles=(trio,),
                      transitions=(ir.Transition("trio", "a", _lt(ir.Entropy("trio", True), "<", 0.35), "keep", S(f, 7)),
                                   ir.Transition("a", "trio", _lt(ir.Margin("a"), "<", 0.3), "rewrite", S(f, 8))))


def mixture() -> ir.Program:
    f = "mixture.route"
    models = tuple(ir.Model(n, f"tiny-{n}", role="member", span=S(f, i + 2)) for i, n in enumerate("abc"))
    mix = ir.Ensemble("mix", ("a", "b", "c"), (1.0, 2.0, 1.0), "mixture", seed=7, span=S(f, 5))
    return ir.Program(source=f, language_version=1, models=models, start="mix", ensembles=(mix,),
                      transitions=(ir.Transition("mix", "b", ir.Logic("and", (
                          _lt(ir.TopProb("mix"), ">", 0.5), _lt(ir.Entropy("a", False), "<", 2.0))), "keep", S(f, 7)),
                                   ir.Transition("b", "mix", _lt(ir.TopProb("b"), "<", 0.4), "rewrite", S(f, 8))))


def bench() -> ir.Program:
    f = "bench.route"
    return ir.Program(source=f, language_version=1, models=_pair(f), start="slm",
                      transitions=(ir.Transition("slm", "llm", ir.Bernoulli(0.2, 3), "rewrite", S(f, 6)),
                                   ir.Transition("llm", "slm", ir.Bernoulli(0.5, 4), "keep", S(f, 7))),
                      bounds=(ir.VisitBound("llm", 2, 5, "slm", S(f, 8)),))


def kitchen() -> ir.Program:
    """Every operator: arithmetic, logic, numeric truth, ==/!=, visit tokens, self moves."""
    f = "kitchen.route"
    e, m, t = ir.Entropy("slm", False), ir.Margin("slm"), ir.TopProb("slm")
    vt = ir.VisitTokens()
    rules = (
        ir.Transition("slm", "slm", ir.Compare("==", vt, ir.Const(7)), "rewrite", S(f, 5)),
        ir.Transition("slm", "llm", ir.Logic("and", (
            ir.Compare(">", ir.Arith("/", e, ir.Arith("+", t, ir.Const(0.5))), ir.Const(1.2)),
            ir.Logic("not", (ir.Compare("<", ir.Arith("*", m, ir.Const(2)), ir.Const(0.1)),)))), "rewrite", S(f, 6)),
        ir.Transition("slm", "llm", ir.Logic("or", (
            ir.Compare("!=", ir.Arith("-", t, m), ir.Arith("-", t, m)),
            ir.Arith("-", vt, ir.Const(4)))), "keep", S(f, 7)),
        ir.Transition("llm", "slm", ir.Logic("or", (
            ir.Compare(">=", ir.Const(1), ir.Const(2)),
            ir.Compare("<=", ir.Arith("/", ir.Const(1.0), ir.Arith("-", ir.TopProb("llm"), ir.TopProb("llm"))),
                       ir.Const(0)),
            ir.Compare(">", ir.TopProb("llm"), ir.Const(0.6)))), "keep", S(f, 9)),
    )
    return ir.Program(source=f, language_version=1, models=_pair(f), start="slm", transitions=rules,
                      bounds=(ir.VisitBound("slm", 2, None, None, S(f, 10)), ir.VisitBound("llm", 1, 9, "slm", S(f, 11))))


PROGRAMS = {"r2r": r2r, "citer": citer, "co_llm": co_llm, "rstitch": rstitch,
            "ensemble": ensemble, "mixture": mixture, "bench": bench, "kitchen": kitchen}


# ------------------------------------------------------------------ the example files

EXAMPLES = sorted(p.stem for p in (REPO / "examples").glob("*.route"))
TINY_HIDDEN = 16


def _map_files(obj, fn):
    """`obj` with every router network's and head row's weights path passed through `fn`."""
    if isinstance(obj, (ir.RouterNet, ir.HeadLogit)):
        obj = dataclasses.replace(obj, file=fn(obj.file))
    if dataclasses.is_dataclass(obj):
        changes = {}
        for f in dataclasses.fields(obj):
            v = getattr(obj, f.name)
            nv = _map_files(v, fn)
            if nv is not v:
                changes[f.name] = nv
        return dataclasses.replace(obj, **changes) if changes else obj
    if isinstance(obj, tuple):
        new = tuple(_map_files(x, fn) for x in obj)
        return new if any(a is not b for a, b in zip(new, obj)) else obj
    return obj


def load_example(name: str, tmp: Path) -> ir.Program:
    """An example program checked by the front end, its models pointed at a tiny config
    (hidden size 16) and its weights files moved into `tmp` (the tests write them)."""
    from tokenrouter.compiler.pipeline import check_file
    path = REPO / "examples" / f"{name}.route"
    program, diags = check_file(path, model_facts=model_facts)
    assert program is not None, [str(d) for d in diags]
    folder = tmp / "tiny-model"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"hidden_size": TINY_HIDDEN, "num_hidden_layers": 2}))
    # the shipped weights fit the real models, not these: they are replaced by random ones below
    program, diags = check_file(path, model_paths={m.name: str(folder) for m in program.models},
                                check_weights=False, model_facts=model_facts)
    assert program is not None, [str(d) for d in diags]
    return _map_files(program, lambda f: str(tmp / "weights" / os.path.basename(f)))


def get_program(key: str, tmp: Path) -> ir.Program:
    """A hand-built program by name, or an example file as 'example:<stem>'."""
    if key.startswith("example:"):
        return load_example(key.split(":", 1)[1], tmp)
    return PROGRAMS[key]()


# ------------------------------------------------------------------ weights


def _hidden_dims(program: ir.Program) -> dict[tuple[str, int], int]:
    dims: dict[tuple[str, int], int] = {}
    for r in program.routers:
        for inp in r.inputs:
            if isinstance(inp, ir.InputHidden):
                dims[(r.model, inp.layer)] = inp.dim
            elif isinstance(inp, ir.InputTokenEmbedding):
                dims[(r.model, "emb")] = inp.dim  # type: ignore[index]
    return dims


def write_random_weights(program: ir.Program, base_dir: Path, seed: int = 0) -> None:
    """Random weights of the declared shapes for every router network and head row."""
    from tokenrouter.compiler.backend.codegen import head_keys
    from tokenrouter.compiler.weights.nets import arch_metadata, random_tensors
    g = torch.Generator().manual_seed(seed)
    dims = _hidden_dims(program)
    for r in program.routers:
        _save(random_tensors(r, g), base_dir, r.file, arch_metadata(r))
    for model, file in head_keys(program):
        h = dims.get((model, -1), HEAD_DIM)
        _save({"weight": torch.randn(1, h, generator=g) / h ** 0.5, "bias": torch.tensor([0.1])}, base_dir, file)


def _save(tensors: dict, base_dir: Path, file: str, metadata: dict | None = None) -> None:
    path = Path(file) if os.path.isabs(file) else base_dir / file
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata=metadata)


# ------------------------------------------------------------------ batches

ROW_KINDS = ("normal", "normal", "normal", "sharp", "flat", "uniform", "onehot", "tie",
             "neginf", "nan", "posinf", "allneginf")


def _logits_row(rng: np.random.Generator, v: int, kind: str) -> np.ndarray:
    if kind == "normal":
        x = rng.standard_normal(v) * rng.choice([0.5, 2.0, 6.0])
    elif kind == "sharp":
        x = rng.standard_normal(v) * 30.0
    elif kind == "flat":
        x = rng.standard_normal(v) * 0.01
    elif kind == "uniform":
        x = np.full(v, float(rng.standard_normal()))
    elif kind == "onehot":
        x = np.full(v, -np.inf) if rng.random() < 0.5 else np.full(v, -1e4)
        x[rng.integers(v)] = 3.0
    elif kind == "tie":
        x = rng.standard_normal(v)
        i, j = rng.choice(v, 2, replace=False)
        x[i] = x[j] = x.max() + 1.0
    else:
        x = rng.standard_normal(v) * 2.0
        idx = rng.choice(v, int(rng.integers(1, v // 2 + 1)), replace=False)
        x[idx] = {"neginf": -np.inf, "nan": np.nan, "posinf": np.inf, "allneginf": -np.inf}[kind]
        if kind == "allneginf":
            x[:] = -np.inf
    return x.astype(np.float32)


def _vector(rng: np.random.Generator, h: int) -> np.ndarray:
    x = rng.standard_normal(h).astype(np.float32)
    r = rng.random()
    if r < 0.03:
        x[rng.integers(h)] = np.nan
    elif r < 0.05:
        x[rng.integers(h)] = np.inf
    return x


def vocab_size(program: ir.Program) -> int:
    v = 16
    for r in program.routers:
        for inp in r.inputs:
            if isinstance(inp, ir.InputTopkLogits):
                v = max(v, inp.k + 2)
    for e in program.ensembles:
        if e.topk_union:
            v = max(v, len(e.members) * e.topk_union + 8)
    return v


def make_batch(program: ir.Program, writer: str, needs, rng: np.random.Generator, b: int,
               kinds: tuple[str, ...] = ROW_KINDS):
    """(StepTensors in float32, [RequestStep]) for one random batch of `writer`."""
    v = vocab_size(program)
    dims = _hidden_dims(program)
    ens = next((e for e in program.ensembles if e.name == writer), None)
    n_logits = len(ens.members) if ens else 1
    logits = [np.stack([_logits_row(rng, v, kinds[rng.integers(len(kinds))]) for _ in range(b)])
              for _ in range(n_logits)]
    hidden = {}
    for layer in needs.hidden_layers:
        h = dims.get((writer, layer), HEAD_DIM)
        hidden[layer] = np.stack([_vector(rng, h) for _ in range(b)])
    emb = None
    if needs.token_embedding:
        emb = np.stack([_vector(rng, dims[(writer, "emb")]) for _ in range(b)])
    bound = program.bound(writer)
    top = max(bound.min_tokens, bound.max_tokens or 1, 8) + 2
    visit = rng.integers(0, top + 1, b)
    position = rng.integers(0, 1 << 20, b)
    seeds = rng.integers(-(1 << 63), (1 << 63) - 1, b, dtype=np.int64, endpoint=True)
    sampled = rng.integers(0, v, b)
    t = torch.from_numpy
    step = StepTensors(
        logits=None if ens else t(logits[0]), sampled=t(sampled), visit_tokens=t(visit),
        position=t(position), request_seed=t(seeds),
        hidden={k: t(x) for k, x in hidden.items()},
        token_embedding=None if emb is None else t(emb),
        member_logits=tuple(t(x) for x in logits) if ens else ())
    rows = [RequestStep(
        logits=None if ens else logits[0][i], sampled=int(sampled[i]), visit_tokens=int(visit[i]),
        position=int(position[i]), request_seed=int(seeds[i]),
        hidden={k: x[i] for k, x in hidden.items()},
        token_embedding=None if emb is None else emb[i],
        member_logits=tuple(x[i] for x in logits) if ens else ()) for i in range(b)]
    return step, rows


def to_dtype(step: StepTensors, dtype: torch.dtype) -> StepTensors:
    """The same batch with floating tensors converted (exactly, from float32) to `dtype`."""
    c = lambda x: None if x is None else x.to(dtype)  # noqa: E731
    return StepTensors(logits=c(step.logits), sampled=step.sampled, visit_tokens=step.visit_tokens,
                       position=step.position, request_seed=step.request_seed,
                       hidden={k: c(x) for k, x in step.hidden.items()},
                       token_embedding=c(step.token_embedding),
                       member_logits=tuple(c(x) for x in step.member_logits))


@pytest.fixture
def golden_update() -> bool:
    return UPDATE_GOLDEN


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Tiny tensors: intra-op threads only add OpenMP contention on a shared 2-core machine
    (measured: log_softmax of [32, 16] takes 5 us on one thread, up to 20 ms on two)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# --- the differential check of generated `route` code against the interpreter (shared by
# backend/test_differential and weights/test_nets)

SETTINGS = dict(derandomize=True, database=None, deadline=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def check_route_batch(program, interp, routers, writer, step, rows, dtype, tie_gap, seen):
    writers = program.writers()
    got = routers[writer].route(to_dtype(step, dtype))
    assert got.dtype == torch.int64 and got.device.type == "cpu" and tuple(got.shape) == (2, len(rows))
    skipped = 0
    for i, row in enumerate(rows):
        d = interp.route(writer, row)
        same = (int(got[0, i]), int(got[1, i])) == (writers.index(d.dest), int(d.keep))
        if not same and d.min_gap < tie_gap:
            skipped += 1  # a threshold tie decided differently by rounding: tolerated, counted
            continue
        seen[(writer, d.reason)] += 1
        assert same, f"row {i} of {writer}: generated {got[:, i].tolist()}, interpreter {d}"
    if routers[writer].__class__.__dict__.get("combine"):
        comb = routers[writer].combine(to_dtype(step, dtype)).to(torch.float64).numpy()
        for i, row in enumerate(rows):
            ref = interp.combine(writer, row)
            tol = 1e-9 if dtype == torch.float64 else 2e-4
            np.testing.assert_allclose(comb[i], ref, rtol=tol, atol=tol, equal_nan=True)
    return skipped


def check_coverage(program, seen):
    """Every transition fired, every request stayed, every max bound forced a move."""
    for w in program.writers():
        ts = program.transitions_from(w)
        for n in range(len(ts)):
            assert seen[(w, f"transition {n}")] > 0, f"{w}: transition {n} never fired"
        if ts:
            assert seen[(w, "stay")] > 0, f"{w}: no request ever stayed"
        if program.bound(w).max_tokens is not None:
            assert seen[(w, "max")] > 0, f"{w}: max bound never reached"
