"""`fit`: one router (or head row) of a program, trained on the program's own model pair.

    from tokenrouter.fit.fitting import FitOptions, fit
    result = fit(FitOptions(route="examples/r2r.route", router="r2r", prompts="data/prompts/train.jsonl",
                            out="examples/weights/r2r_router.safetensors"))
    result.threshold, result.report  # the chosen threshold, the report dict (also written as JSON)

`fit` runs one function a step. `_check_options` and `_load_job` check the inputs before
a model is loaded (the options, the prompts files, the program with its models and shared
tokenizer, the router name); `_encode_prompts` encodes the prompts and splits them by seed;
`Pair.start` starts both engines; `_label` labels every position of the small model's
greedy trajectories and splits the rows by prompt; `_labels` orients the labels by the
program's comparison (refusing a CITER router compared with > or a Co-LLM head with <);
`_train` trains; `_choose_threshold` reads the network back from a probe file as serving
does, chooses its threshold on the held-out rows and, with `align`, moves its output logit
so that the program's own threshold is the chosen one; `heldout_figures` and `build_report`
give the figures (with `compare_generation` on --eval-prompts); `publish` writes the
report. Every output file is written to a temporary name and renamed only when all of
them are complete, so a fit that fails writes none of them.

The steps are here; what they pass each other is `job.py`, the router or head being fit
`target.py`, the report's sections `report.py`, the generation on --eval-prompts
`generation.py`, the output files `output.py`.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from typing import Callable

import torch

from tokenrouter.compiler import ir
from tokenrouter.compiler.pipeline import RouteError, load_program
from tokenrouter.compiler.weights import nets as rn
from tokenrouter.fit import collect, train
from tokenrouter.fit.errors import FitError
from tokenrouter.fit.generation import compare_generation
from tokenrouter.fit.job import Data, FitOptions, FitResult, Job, Pair, Prompts, Scores, Trained
from tokenrouter.fit.output import Probe, digest, metadata, publish, write_weights
from tokenrouter.fit.report import build_report, heldout_figures, training_metadata
from tokenrouter.fit.target import Target, find_target, route_lines, route_text
from tokenrouter.prompts import read_prompts
from tokenrouter.runtime.loader import model_facts, program_tokenizer

__all__ = ["FitOptions", "FitResult", "fit"]


def fit(opts: FitOptions) -> FitResult:
    t0 = time.time()
    _check_options(opts)
    job = _load_job(opts)
    torch.set_num_threads(opts.threads)
    tok = program_tokenizer(job.program)
    prompts = _encode_prompts(tok, job, opts)
    pair = Pair.start(job, tok, prompts.max_len, opts)
    data = _label(pair, prompts, opts.max_tokens)
    trained = _train(job.target, pair.inputs, data.train, _labels(job.target, data.train), opts)
    meta = metadata(job.target, pair.fingerprints)
    probe = Probe(opts.out)
    probe.write(trained.tensors, meta)
    try:
        scores = _choose_threshold(job, pair.hidden, trained.tensors, meta, probe, data, opts.align)
        heldout, entropy_rule = heldout_figures(job.target, scores, data)
        report = build_report(opts, job, pair, prompts, data, trained, scores, heldout, entropy_rule)
        if prompts.eval_ids:
            report["generation"] = compare_generation(pair, prompts.eval_ids, prompts.eval_tokens, scores,
                                                       job.target.op, entropy_rule["tau"], opts.eval_prompts,
                                                       digest(trained.tensors))
        report["seconds"] = round(time.time() - t0, 1)
        meta.update(training_metadata(job.target, scores.threshold, report, heldout, trained.hyper, opts.seed))
        weights = write_weights(opts.out, trained.tensors, meta)
    finally:
        probe.remove()
    report_json, report_png = publish(opts, weights, report)
    return FitResult(opts.out, report_json, report_png, scores.threshold,
                     route_lines(job.target, opts.out, opts.route, scores.threshold), report)


def _check_options(opts: FitOptions) -> None:
    if not os.path.isfile(opts.route):
        raise FitError(f"{opts.route}: no such .route file")
    if opts.min_recall is not None and opts.target_share is not None:
        raise FitError("give --min-recall or --target-share, not both")
    for flag, v in (("--min-recall", opts.min_recall), ("--target-share", opts.target_share)):
        if v is not None and not 0 < v <= 1:
            raise FitError(f"{flag} must be in (0, 1], got {v}")
    if not opts.out.endswith(".safetensors"):
        raise FitError(f"--out must name a .safetensors file, got {opts.out!r}")
    if opts.epochs < 1 or opts.max_tokens < 1 or opts.batch < 1:
        raise FitError("--epochs, --max-tokens and --batch must be at least 1")


def _load_job(opts: FitOptions) -> Job:
    """The prompt sets, the program and the router or head to fit, and the threshold rule
    (default: recall 0.95 for r2r, R2R's choice; a 0.3 large-token share for the others)."""
    rows = read_prompts(opts.prompts)
    eval_rows = read_prompts(opts.eval_prompts) if opts.eval_prompts else None
    try:
        program = load_program(opts.route, check_weights=False, model_facts=model_facts,
                               params=opts.params, model_paths=opts.model_paths)
    except RouteError as exc:
        raise FitError(f"{opts.route} does not load:\n{exc}") from None
    target = find_target(program, opts.route, opts.router)
    min_recall, target_share = opts.min_recall, opts.target_share
    if min_recall is None and target_share is None:
        if target.arch == "r2r":
            min_recall = 0.95
        else:
            target_share = 0.3
    return Job(rows, eval_rows, program, target, min_recall, target_share)


def _encode_prompts(tok, job: Job, opts: FitOptions) -> Prompts:
    ids = _encode(tok, job.rows)
    train_idx, held_idx = _split(len(ids), opts.holdout, opts.seed)
    max_len = max(len(p) for p in ids) + opts.max_tokens + 1
    eval_ids = _encode(tok, job.eval_rows[: opts.eval_max_prompts or None]) if job.eval_rows else []
    eval_tokens = opts.eval_max_tokens or opts.max_tokens
    if eval_ids:
        max_len = max(max_len, max(len(p) for p in eval_ids) + eval_tokens + 1)
    return Prompts(ids, train_idx, held_idx, eval_ids, eval_tokens, max_len)


def _split(n: int, fraction: float, seed: int) -> tuple[list[int], list[int]]:
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    k = max(1, round(n * fraction))
    if n - k < 1:
        raise FitError(f"{n} prompt(s) cannot be split into training and held-out parts; give at least 2")
    return sorted(perm[k:]), sorted(perm[:k])


def _encode(tok, rows: list[dict]) -> list[list[int]]:
    out = []
    for row in rows:
        text = row["prompt"]
        if tok.chat_template:
            text = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
        out.append(tok.encode(text))
    return out


def _label(pair: Pair, prompts: Prompts, max_tokens: int) -> Data:
    """Every position of the small model's greedy trajectories, labelled by the large model."""
    t = time.time()
    data, _ = pair.lockstep(prompts.ids, max_tokens, "small", None, f"label {len(prompts.ids)} prompts")
    seconds = time.time() - t
    is_held = torch.isin(data.prompt, torch.tensor(prompts.held_idx))
    tr, ho = data.take(~is_held), data.take(is_held)
    if len(tr.x) < 2 or len(ho.x) < 1:
        raise FitError("too few labelled positions to train on; give more prompts or --max-tokens")
    return Data(tr, ho, seconds)


def _labels(target: Target, tr: collect.Rows) -> torch.Tensor:
    """The training labels, oriented by the program's comparison (see the train module)."""
    route_high = target.op in (">", ">=")
    div_tr = tr.divergent
    y = div_tr if route_high else 1 - div_tr
    if target.arch == "citer":
        y = 1 - div_tr  # CITER's score is the confidence that the small model's token is right
        if route_high:
            raise FitError(f"a CITER router routes when its confidence is LOW: compare it with < or <=, not {target.op}")
    if target.arch == "co_llm" and not route_high:
        raise FitError(f"a Co-LLM defer head routes when its probability is HIGH: compare it with > or >=, not {target.op}")
    return y


def _train(target: Target, inputs: tuple, tr: collect.Rows, y: torch.Tensor, opts: FitOptions) -> Trained:
    router = target.router
    hp = dataclasses.replace(opts.hyper, epochs=opts.epochs)
    with torch.random.fork_rng():
        torch.manual_seed(opts.seed)
        model = train.build(target.arch, router, inputs[0].dim if router is None else rn.input_width(router), hp)
        t = time.time()
        aux = (tr.p_small_of_large, tr.p_large_top) if target.arch == "co_llm" else None
        losses = train.train(model, tr.x, y, hp, opts.seed, opts.progress, aux)
        seconds = time.time() - t
    tensors = {k: v.detach().float().contiguous() for k, v in model.export().items()}
    return Trained(tensors, losses, hp, seconds)


def _scorer(target: Target, path: str, hidden: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """The score of the network in `path`, computed by the module serving loads."""
    if target.router is not None:
        return rn.load_router_net(dataclasses.replace(target.router, file=path))
    w, b = rn.load_head(ir.HeadLogit(target.model, path, True), hidden)
    return functools.partial(_head_score, w, b)


def _head_score(w: torch.Tensor, b: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(x @ w + b)


def _scored(score_of, data: Data) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        return score_of(data.held.x), score_of(data.train.x)


def _choose_threshold(job: Job, hidden: int, tensors: dict[str, torch.Tensor], meta: dict[str, str],
                      probe: Probe, data: Data, align: bool) -> Scores:
    """The threshold by the job's rule on the held-out rows. With `align` (and both the
    program's threshold c and the chosen t inside (0, 1)), the output bias in `tensors`
    moves by d = logit(c) - logit(t), since sigmoid(z + d) op c <=> sigmoid(z) op t: the
    threshold the program already says becomes the chosen one; the probe is rewritten."""
    target = job.target
    score_of = _scorer(target, probe.path, hidden)
    s_ho, s_tr = _scored(score_of, data)
    if job.min_recall is not None and not float(data.held.divergent.sum()):
        raise FitError(f"no threshold routes {job.min_recall:g} of the divergent held-out positions: the two models "
                       f"agree on all {len(data.held.x)} of them (give prompts where they differ, more --max-tokens, "
                       "or choose by --target-share)")
    chosen = train.choose(s_ho, data.held.divergent, target.op, job.min_recall, job.target_share)
    c = target.constant
    if not (align and 0 < c < 1 and 0 < chosen["threshold"] < 1):
        return Scores(score_of, s_ho, s_tr, float(route_text(chosen["threshold"])), None)
    aligned_from = chosen["threshold"]
    d = train.sigmoid_inverse(c) - train.sigmoid_inverse(aligned_from)
    bias = _output_bias(target.arch, tensors)
    tensors[bias] = (tensors[bias].double() + d).float()
    probe.write(tensors, meta)
    score_of = _scorer(target, probe.path, hidden)
    s_ho, s_tr = _scored(score_of, data)
    return Scores(score_of, s_ho, s_tr, c, aligned_from)


def _output_bias(arch: str, tensors: dict[str, torch.Tensor]) -> str:
    """The bias of the one output logit."""
    if arch == "r2r":
        return "out.bias"
    if arch == "co_llm":
        return "bias"
    return f"layers.{sum(k.endswith('.weight') for k in tensors) - 1}.bias"
