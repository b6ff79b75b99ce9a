"""`fit`: one router (or head row) of a program, trained on the program's own model pair.

    from tokenrouter.fit.fitting import FitOptions, fit
    result = fit(FitOptions(route="examples/r2r.route", router="r2r", prompts="data/prompts/train.jsonl",
                            out="examples/weights/r2r_router.safetensors"))
    result.threshold, result.report  # the chosen threshold, the report dict (also written as JSON)

`fit` runs one function a step. `_check_options` and `_load_job` check the inputs before
a model is loaded (the options, the prompts files, the program with its models and shared
tokenizer, the router name); `_encode_prompts` encodes the prompts and splits them by seed;
`_Pair.start` starts both engines; `_label` labels every position of the small model's
greedy trajectories and splits the rows by prompt; `_labels` orients the labels by the
program's comparison (refusing a CITER router compared with > or a Co-LLM head with <);
`_train` trains; `_choose_threshold` reads the network back from a probe file as serving
does, chooses its threshold on the held-out rows and, with `align`, moves its output logit
so that the program's own threshold is the chosen one; `_heldout_figures` and `_report`
give the figures (with `_compare_generation` on --eval-prompts); `_publish` writes the
report. Every output file is written to a temporary name and renamed only when all of
them are complete, so a fit that fails writes none of them.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from safetensors.torch import save_file

from tokenrouter.compiler import ir
from tokenrouter.compiler.weights import nets as rn
from tokenrouter.compiler.check import resolve_path
from tokenrouter.compiler.pipeline import RouteError, load_program
from tokenrouter.dsl import ast
from tokenrouter.dsl.parser import parse_bytes
from tokenrouter.fit import collect, train
from tokenrouter.fit.prompts import FitError, read_prompts
from tokenrouter.fit.report import plot
from tokenrouter.runtime.host import host_info
from tokenrouter.runtime.loader import model_facts, resolve_folder
from tokenrouter.runtime.loader import program_tokenizer

LABELS = {
    "r2r": "divergent: the small model's greedy token differs from the large model's greedy token at the same "
           "prefix (verifier-free stand-in for R2R's verified continuation)",
    "citer": "keep (1) where the small model's greedy token equals the large model's, route (0) where it does not "
             "(CITER's token-level labels with the large model as the reference; no iterative relabelling)",
    "co_llm": "Co-LLM: weak labels (defer where the large model's token is the reference and the small model's is "
              "not), then the marginal likelihood of the reference token under {small, large} with both models frozen",
    "mlp": "divergent, as for r2r",
}


@dataclass
class FitOptions:
    route: str
    router: str
    prompts: str
    out: str
    epochs: int = 30
    seed: int = 0
    min_recall: float | None = None
    target_share: float | None = None
    holdout: float = 0.2
    max_tokens: int = 48
    batch: int = 32
    eval_prompts: str | None = None
    eval_max_tokens: int | None = None
    eval_max_prompts: int | None = None  # the first N of --eval-prompts (default: all)
    report: str | None = None  # default: OUT without .safetensors + ".report.json" / ".png"
    threads: int = 1
    progress: bool = True
    cache: bool = False  # remember the lockstep passes (labelled rows, baselines) under the cache root
    align: bool = True  # shift the output logit so that the program's own threshold is the chosen one
    hyper: train.Hyper = field(default_factory=train.Hyper)
    params: dict[str, str] | None = None  # --set NAME=VALUE
    model_paths: dict[str, str] | None = None  # --model NAME=PATH


@dataclass
class Target:
    name: str
    arch: str  # mlp | citer | r2r | co_llm
    model: str  # the model whose step it reads
    large: str  # the model it hands off to
    op: str  # route when score `op` threshold
    constant: float  # the threshold the program compares it with
    router: ir.RouterNet | None  # None for a head


@dataclass
class FitResult:
    out: str
    report_json: str
    report_png: str
    threshold: float
    route_lines: list[str]
    report: dict


# ------------------------------------------------------------------ the target


def _compares(e, match) -> tuple[str, float] | None:
    """(op as `score op const`, const) of the first comparison of `match` with a constant."""
    flip = {"<": ">", ">": "<", "<=": ">=", ">=": "<="}
    if isinstance(e, ir.Compare):
        if match(e.left) and isinstance(e.right, ir.Const):
            return e.op, e.right.value
        if match(e.right) and isinstance(e.left, ir.Const) and e.op in flip:
            return flip[e.op], e.left.value
    for child in [getattr(e, "left", None), getattr(e, "right", None), *getattr(e, "args", ())]:
        if child is not None:
            found = _compares(child, match)
            if found:
                return found
    return None


def find_target(program: ir.Program, route_path: str, name: str) -> Target:
    routers = {r.name: r for r in program.routers}
    heads = _head_decls(route_path)
    if name not in routers and name not in heads:
        declared = sorted(routers) + sorted(heads)
        raise FitError(f"{route_path}: no router or head named '{name}'"
                       + (f" (declared: {', '.join(declared)})" if declared else " (it declares none)"))
    if name in routers:
        r = routers[name]
        match = lambda e: isinstance(e, ir.RouterProb) and e.router == name  # noqa: E731
        model, arch = r.model, r.arch
    else:
        model, file = heads[name]
        match = lambda e: isinstance(e, ir.HeadLogit) and e.file == file  # noqa: E731
        r, arch = None, "co_llm"
    for t in program.transitions:
        found = _compares(t.when, match) if t.source == model else None
        if found:
            op, constant = found
            if op not in (">", ">=", "<", "<="):
                raise FitError(f"{route_path}: '{name}' is compared with {op}; fit needs <, <=, > or >=")
            return Target(name, arch, model, t.dest, op, float(constant), r)
    raise FitError(f"{route_path}: '{name}' is not compared with a threshold in a transition out of '{model}'")


def _head_decls(route_path: str) -> dict[str, tuple[str, str]]:
    with open(route_path, "rb") as f:
        tree, _, _ = parse_bytes(f.read(), route_path)
    base = os.path.dirname(os.path.abspath(route_path))
    return {i.name.text: (i.model.text, resolve_path(i.path.value, base))
            for i in (tree.items if tree else ()) if isinstance(i, ast.HeadDecl)}


# ------------------------------------------------------------------ helpers


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


def host() -> dict:
    return {**host_info(bandwidth=False), "torch_threads": torch.get_num_threads()}


def _route_text(value: float) -> str:
    return f"{value:.4f}".rstrip("0").rstrip(".") if value == value else "nan"


def _inputs_text(router: ir.RouterNet) -> str:
    return ", ".join(part.rpartition(":")[0] for part in rn.layout_text(router).split(","))


def _lcs(a: list[int], b: list[int]) -> int:
    row = [0] * (len(b) + 1)
    for x in a:
        prev = 0
        for j, y in enumerate(b):
            cur = row[j + 1]
            row[j + 1] = prev + 1 if x == y else max(row[j + 1], row[j])
            prev = cur
    return row[-1]


def agreement(tokens: list[list[int]], reference: list[list[int]]) -> dict:
    """How close routed outputs are to the large model's greedy outputs: the share of the
    reference's positions holding the same token (strict: one early difference shifts
    everything after it), the mean common-prefix length, and ROUGE-L F1 over tokens (the
    longest common subsequence, which forgives such shifts)."""
    same = total = 0
    prefix, rouge = [], []
    for a, b in zip(tokens, reference):
        total += len(b)
        same += sum(x == y for x, y in zip(a, b))
        k = 0
        while k < min(len(a), len(b)) and a[k] == b[k]:
            k += 1
        prefix.append(k)
        lcs = _lcs(a, b)
        rouge.append(0.0 if lcs == 0 else 2 * lcs / (len(a) + len(b)))
    n = max(len(prefix), 1)
    return {"token_agreement": same / max(total, 1), "mean_common_prefix": sum(prefix) / n,
            "rouge_l": sum(rouge) / n}


def _output_bias(arch: str, tensors: dict[str, torch.Tensor]) -> str:
    """The bias of the one output logit."""
    if arch == "r2r":
        return "out.bias"
    if arch == "co_llm":
        return "bias"
    return f"layers.{sum(k.endswith('.weight') for k in tensors) - 1}.bias"


def _digest(tensors: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for k in sorted(tensors):
        h.update(k.encode())
        h.update(tensors[k].contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def _share(roll: collect.Rollout) -> float:
    n = sum(len(r) for r in roll.routed)
    return sum(sum(r) for r in roll.routed) / max(n, 1)


def _atomic(path: str, write) -> str:
    """Write via `write(tmp_path)` into the target folder; returns the temporary path."""
    folder = os.path.dirname(os.path.abspath(path)) or "."
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".fit-", suffix=os.path.basename(path), dir=folder)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would make the outputs private
    except BaseException:
        os.unlink(tmp)
        raise
    return tmp


# ------------------------------------------------------------------ the steps of a fit


@dataclass
class _Job:
    """What `fit` reads and checks before a model is loaded."""

    rows: list[dict]
    eval_rows: list[dict] | None
    program: ir.Program
    target: Target
    min_recall: float | None  # the threshold rule: exactly one of these two is set
    target_share: float | None

    @property
    def threshold_rule(self) -> dict:
        return {"min_recall": self.min_recall} if self.min_recall is not None else {"target_share": self.target_share}


@dataclass
class _Prompts:
    """The prompts as token ids, and the seeded split of the training prompts."""

    ids: list[list[int]]
    train_idx: list[int]
    held_idx: list[int]
    eval_ids: list[list[int]]  # the first --eval-max-prompts of --eval-prompts (none without it)
    eval_tokens: int
    max_len: int  # the longest sequence either engine holds


@dataclass
class _Pair:
    """Both engines, stepped together over prompts (`collect.cached_lockstep`) with the
    router's declared inputs."""

    small: Any  # runtime Engine
    large: Any
    hidden: int  # the small model's hidden size
    inputs: tuple  # the router's inputs (a head reads hidden(-1))
    layout: str  # the inputs as text: the cached rows' column layout
    fingerprints: dict  # {"reads": ..., "large": ...}: each model's name and folder fingerprint
    dtypes: tuple[str, str]
    stop: set[int]
    batch: int
    progress: bool
    cache: bool

    @classmethod
    def start(cls, job: _Job, tok, max_len: int, opts: FitOptions) -> "_Pair":
        small_m, large_m = job.program.model(job.target.model), job.program.model(job.target.large)
        router = job.target.router
        small = collect.make_engine(small_m, max_len, opts.batch)
        large = collect.make_engine(large_m, max_len, opts.batch)
        hidden = small.config.hidden_size
        if router is None:
            inputs = (ir.InputHidden(-1, hidden),)
        else:
            inputs = router.inputs
            if any(w <= 0 for w in rn.input_widths(router)):
                raise FitError(f"router '{router.name}': the input widths of '{router.model}' are unknown")
        fps = {"reads": {"name": small_m.path, "fingerprint": rn.folder_fingerprint(resolve_folder(small_m.path)[1])},
               "large": {"name": large_m.path, "fingerprint": rn.folder_fingerprint(resolve_folder(large_m.path)[1])}}
        layout = rn.layout_text(router) if router is not None else f"hidden(-1):{hidden}"
        return cls(small, large, hidden, inputs, layout, fps, (small_m.dtype, large_m.dtype), set(tok.eos_token_ids),
                   opts.batch, opts.progress, opts.cache)

    def key(self, prompt_ids: list[list[int]], tokens: int, decisions: str) -> str | None:
        """The cache key of a pass (None without --cache)."""
        if not self.cache:
            return None
        return collect.cache_key(models=[self.fingerprints["reads"]["fingerprint"],
                                         self.fingerprints["large"]["fingerprint"], *self.dtypes],
                                 prompts=prompt_ids, tokens=tokens, decisions=decisions)

    def lockstep(self, prompt_ids: list[list[int]], tokens: int, decisions: str, decide,
                 desc: str) -> tuple[collect.Rows, collect.Rollout]:
        """One pass over `prompt_ids` (`decide`: see collect.lockstep; `decisions` names it in the cache key)."""
        return collect.cached_lockstep(self.key(prompt_ids, tokens, decisions), self.layout, self.small, self.large,
                                       prompt_ids, self.inputs, tokens, self.batch, self.stop, decide, desc=desc,
                                       progress=self.progress)


@dataclass
class _Data:
    """The labelled positions of the training prompts, split by prompt."""

    train: collect.Rows
    held: collect.Rows
    seconds: float


@dataclass
class _Trained:
    tensors: dict[str, torch.Tensor]  # as exported; `_choose_threshold` may shift the output bias
    losses: list[float]
    hyper: train.Hyper
    seconds: float


@dataclass
class _Scores:
    """The network's scores, read back from its file, and the threshold it is used with."""

    score_of: Callable[[torch.Tensor], torch.Tensor]
    held: torch.Tensor  # on the held-out rows
    train: torch.Tensor  # on the training rows
    threshold: float
    aligned_from: float | None  # the chosen threshold, when --align moved it onto the program's


class _Probe:
    """The weights as they stand, under a temporary name next to --out, so that the
    inference module reads them from a file as serving does."""

    def __init__(self, out: str):
        self.out = out
        self.path: str | None = None

    def write(self, tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> None:
        if self.path is not None:
            os.unlink(self.path)
        self.path = _write_weights(self.out, tensors, meta)

    def remove(self) -> None:
        os.unlink(self.path)


def fit(opts: FitOptions) -> FitResult:
    t0 = time.time()
    _check_options(opts)
    job = _load_job(opts)
    torch.set_num_threads(opts.threads)
    tok = program_tokenizer(job.program)
    prompts = _encode_prompts(tok, job, opts)
    pair = _Pair.start(job, tok, prompts.max_len, opts)
    data = _label(pair, prompts, opts.max_tokens)
    trained = _train(job.target, pair.inputs, data.train, _labels(job.target, data.train), opts)
    meta = _metadata(job.target, pair.fingerprints)
    probe = _Probe(opts.out)
    probe.write(trained.tensors, meta)
    try:
        scores = _choose_threshold(job, pair.hidden, trained.tensors, meta, probe, data, opts.align)
        heldout, entropy_rule = _heldout_figures(job.target, scores, data)
        report = _report(opts, job, pair, prompts, data, trained, scores, heldout, entropy_rule)
        if prompts.eval_ids:
            report["generation"] = _compare_generation(pair, prompts.eval_ids, prompts.eval_tokens, scores,
                                                       job.target.op, entropy_rule["tau"], opts.eval_prompts,
                                                       _digest(trained.tensors))
        report["seconds"] = round(time.time() - t0, 1)
        meta.update(_training_metadata(job.target, scores.threshold, report, heldout, trained.hyper, opts.seed))
        weights = _write_weights(opts.out, trained.tensors, meta)
    finally:
        probe.remove()
    report_json, report_png = _publish(opts, weights, report)
    return FitResult(opts.out, report_json, report_png, scores.threshold,
                     _route_lines(job.target, opts, scores.threshold), report)


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


def _load_job(opts: FitOptions) -> _Job:
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
    return _Job(rows, eval_rows, program, target, min_recall, target_share)


def _encode_prompts(tok, job: _Job, opts: FitOptions) -> _Prompts:
    ids = _encode(tok, job.rows)
    train_idx, held_idx = _split(len(ids), opts.holdout, opts.seed)
    max_len = max(len(p) for p in ids) + opts.max_tokens + 1
    eval_ids = _encode(tok, job.eval_rows[: opts.eval_max_prompts or None]) if job.eval_rows else []
    eval_tokens = opts.eval_max_tokens or opts.max_tokens
    if eval_ids:
        max_len = max(max_len, max(len(p) for p in eval_ids) + eval_tokens + 1)
    return _Prompts(ids, train_idx, held_idx, eval_ids, eval_tokens, max_len)


def _label(pair: _Pair, prompts: _Prompts, max_tokens: int) -> _Data:
    """Every position of the small model's greedy trajectories, labelled by the large model."""
    t = time.time()
    data, _ = pair.lockstep(prompts.ids, max_tokens, "small", None, f"label {len(prompts.ids)} prompts")
    seconds = time.time() - t
    is_held = torch.isin(data.prompt, torch.tensor(prompts.held_idx))
    tr, ho = data.take(~is_held), data.take(is_held)
    if len(tr.x) < 2 or len(ho.x) < 1:
        raise FitError("too few labelled positions to train on; give more prompts or --max-tokens")
    return _Data(tr, ho, seconds)


def label_warnings(data: _Data) -> list[str]:
    """What a label set of one class means for the fit: nothing to learn from (training), no
    AUC and no recall (held-out)."""
    out = []
    for rows, what, why in ((data.train, "training", "the router has nothing to learn"),
                            (data.held, "held-out", "its AUC and recall are undefined")):
        rate = float(rows.divergent.mean())
        if rate in (0.0, 1.0):
            agree = "agree" if rate == 0.0 else "disagree"
            out.append(f"the small and large model {agree} on all {len(rows.x)} {what} positions: {why} "
                       "(give prompts where they differ, or more --max-tokens)")
    return out


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


def _train(target: Target, inputs: tuple, tr: collect.Rows, y: torch.Tensor, opts: FitOptions) -> _Trained:
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
    return _Trained(tensors, losses, hp, seconds)


def _metadata(target: Target, fingerprints: dict) -> dict[str, str]:
    """The weights file's metadata before the threshold is chosen."""
    meta = {rn.META_ARCH: target.arch, rn.META_DIRECTION: target.op}
    if target.router is not None:
        meta[rn.META_INPUTS] = rn.layout_text(target.router)
    meta[rn.META_MODELS] = json.dumps(fingerprints, sort_keys=True)
    return meta


def _write_weights(path: str, tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> str:
    """The weights in a temporary file next to `path`; returns its path."""
    return _atomic(path, functools.partial(save_file, tensors, metadata=meta))


def _scorer(target: Target, path: str, hidden: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """The score of the network in `path`, computed by the module serving loads."""
    if target.router is not None:
        return rn.load_router_net(dataclasses.replace(target.router, file=path))
    w, b = rn.load_head(ir.HeadLogit(target.model, path, True), hidden)
    return functools.partial(_head_score, w, b)


def _head_score(w: torch.Tensor, b: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(x @ w + b)


def _scored(score_of, data: _Data) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        return score_of(data.held.x), score_of(data.train.x)


def _choose_threshold(job: _Job, hidden: int, tensors: dict[str, torch.Tensor], meta: dict[str, str],
                      probe: _Probe, data: _Data, align: bool) -> _Scores:
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
        return _Scores(score_of, s_ho, s_tr, float(_route_text(chosen["threshold"])), None)
    aligned_from = chosen["threshold"]
    d = train.sigmoid_inverse(c) - train.sigmoid_inverse(aligned_from)
    bias = _output_bias(target.arch, tensors)
    tensors[bias] = (tensors[bias].double() + d).float()
    probe.write(tensors, meta)
    score_of = _scorer(target, probe.path, hidden)
    s_ho, s_tr = _scored(score_of, data)
    return _Scores(score_of, s_ho, s_tr, c, aligned_from)


def _heldout_figures(target: Target, scores: _Scores, data: _Data) -> tuple[dict, dict]:
    """The router's figures on the held-out rows, and the training-free entropy rule's at
    the same large-token share."""
    ho, div = data.held, data.held.divergent
    route_high = target.op in (">", ">=")
    figs = train.at(scores.held, div, target.op, scores.threshold)
    route_score = scores.held if route_high else 1 - scores.held
    heldout = {"rows": len(ho.x), "divergent_rate": float(div.mean()),
               **({"aligned_from_threshold": scores.aligned_from} if scores.aligned_from is not None else {}),
               "auc": train.auc(route_score, div), **figs,
               "train_auc": train.auc(scores.train if route_high else 1 - scores.train, data.train.divergent)}
    if float(div.sum()):  # else no threshold reaches any recall (label_warnings says why)
        at_recall = train.choose(scores.held, div, target.op, 0.95, None)
        heldout["at_recall_0.95"] = {k: at_recall[k] for k in ("threshold", "recall", "precision", "large_share")}
    tau = train.entropy_threshold_for_share(ho.entropy, figs["large_share"])
    entropy_rule = {"rule": f"entropy({target.model}, normalized) > tau", "tau": tau,
                    "auc": train.auc(ho.entropy, div), **train.at(ho.entropy, div, ">", tau)}
    return heldout, entropy_rule


def _report(opts: FitOptions, job: _Job, pair: _Pair, prompts: _Prompts, data: _Data, trained: _Trained,
            scores: _Scores, heldout: dict, entropy_rule: dict) -> dict:
    target = job.target
    return {
        "router": target.name, "arch": target.arch, "program": os.path.basename(opts.route),
        "direction": target.op,
        "rule": f"{target.model} -> {target.large} when {target.name} {target.op} {_route_text(scores.threshold)} rewrite",
        "models": pair.fingerprints, "labels": LABELS[target.arch],
        "threshold_rule": job.threshold_rule,
        "data": _data_section(opts, prompts, data),
        "training": _training_section(target, trained, opts.seed),
        "heldout": heldout,
        "entropy_rule_same_share": entropy_rule,
        "curve": train.curve(scores.held, data.held.divergent, target.op),
        "entropy_curve": train.curve(data.held.entropy, data.held.divergent, ">"),
        "host": host(),
        "warnings": label_warnings(data),
    }


def _data_section(opts: FitOptions, prompts: _Prompts, data: _Data) -> dict:
    return {"prompts_file": os.path.basename(opts.prompts), "prompts": len(prompts.ids),
            "train_prompts": len(prompts.train_idx), "heldout_prompts": len(prompts.held_idx), "split_seed": opts.seed,
            "max_tokens": opts.max_tokens, "train_rows": len(data.train.x), "heldout_rows": len(data.held.x),
            "train_divergent_rate": float(data.train.divergent.mean()), "seconds": round(data.seconds, 1)}


def _training_section(target: Target, trained: _Trained, seed: int) -> dict:
    hp, losses = trained.hyper, trained.losses
    return {"epochs": hp.epochs, "lr": hp.lr, "weight_decay": hp.weight_decay, "batch": hp.batch,
            "dropout": hp.dropout, "seed": seed, "loss_first": losses[0], "loss_last": losses[-1],
            "losses": [round(x, 5) for x in losses], "seconds": round(trained.seconds, 1),
            **({"width": hp.width, "blocks": hp.blocks, "expansion": hp.expansion} if target.arch == "r2r" else {}),
            "parameters": sum(v.numel() for v in trained.tensors.values())}


def _training_metadata(target: Target, threshold: float, report: dict, heldout: dict, hp: train.Hyper,
                       seed: int) -> dict[str, str]:
    """The metadata the weights file gains once the threshold is chosen."""
    return {rn.META_THRESHOLD: repr(threshold),
            rn.META_TRAINING: json.dumps({
                "labels": LABELS[target.arch], "threshold_rule": report["threshold_rule"],
                "data": report["data"], "heldout": {k: heldout[k] for k in ("auc", "recall", "precision", "large_share",
                                                                             "rows", "divergent_rate")},
                "epochs": hp.epochs, "seed": seed}, sort_keys=True)}


def _publish(opts: FitOptions, weights_tmp: str, report: dict) -> tuple[str, str]:
    """Write the report's JSON and figure next to the weights' temporary file, then rename
    all three into place; returns the report's paths."""
    stem = opts.report or opts.out[: -len(".safetensors")] + ".report"
    json_tmp = _atomic(stem + ".json", functools.partial(_write_text, json.dumps(report, indent=1) + "\n"))
    png_tmp = _atomic(stem + ".png", functools.partial(plot, report))
    for tmp, dst in ((weights_tmp, opts.out), (json_tmp, stem + ".json"), (png_tmp, stem + ".png")):
        os.replace(tmp, dst)
    return stem + ".json", stem + ".png"


def _write_text(text: str, path: str) -> None:
    with open(path, "w") as f:
        f.write(text)


# ------------------------------------------------------------------ generation on --eval-prompts


def _compare_generation(pair: _Pair, ids: list[list[int]], max_tokens: int, scores: _Scores, op: str, tau: float,
                        path: str, digest: str) -> dict:
    """Routed greedy outputs against the large model's own, for the router and for the entropy
    rule at the same large-token share. The share a threshold gives in generation differs
    from the share on the labelled rows (the trajectories change), so the entropy rule runs
    twice: with the tau matched on the held-out rows, and with the tau that routes the
    router's generation share of the positions the router's own generation visited (the
    closer match). The fit's output does not depend on this: it only reports."""
    threshold = scores.threshold
    _, ref = pair.lockstep(ids, max_tokens, "large", collect.ALWAYS, "large alone")
    _, small_only = pair.lockstep(ids, max_tokens, "small", None, "small alone")
    with torch.no_grad():
        rrows, routed = pair.lockstep(ids, max_tokens, f"router:{digest}{op}{threshold!r}",
                                      functools.partial(_route_by_score, scores.score_of, op, threshold), "router")
    tau_gen = train.entropy_threshold_for_share(rrows.entropy, _share(routed))
    out = {"prompts_file": os.path.basename(path), "prompts": len(ids), "max_tokens": max_tokens}
    for name, roll in (("router", routed), ("entropy_rule", _entropy_pass(pair, ids, max_tokens, tau_gen)),
                       ("entropy_rule_heldout_tau", _entropy_pass(pair, ids, max_tokens, tau)),
                       ("small_alone", small_only)):
        out[name] = {"large_share": _share(roll), **agreement(roll.tokens, ref.tokens)}
    out["entropy_rule"]["tau"] = tau_gen
    out["entropy_rule_heldout_tau"]["tau"] = tau
    return out


def _route_by_score(score_of, op: str, threshold: float, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    return train.routes(score_of(x), op, threshold)


def _route_by_entropy(tau: float, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    return collect.entropy(torch.log_softmax(logits, -1)) > tau


def _entropy_pass(pair: _Pair, ids: list[list[int]], max_tokens: int, tau: float) -> collect.Rollout:
    return pair.lockstep(ids, max_tokens, f"entropy>{tau!r}", functools.partial(_route_by_entropy, tau),
                         "entropy rule")[1]


def _route_lines(target: Target, opts: FitOptions, threshold: float) -> list[str]:
    router = target.router
    rel = os.path.relpath(os.path.abspath(opts.out), os.path.dirname(os.path.abspath(opts.route)))
    t = _route_text(threshold)
    if router is None:
        decl = f'head {target.name} on {target.model} = "{rel}" {{\n  sigmoid = true\n}}'
    else:
        attrs = [f"inputs = [{_inputs_text(router)}]"]
        if router.arch != "mlp":
            attrs.append(f"arch = {router.arch}")
        if router.activation != "relu":
            attrs.append(f"activation = {router.activation}")
        decl = f'router {target.name} on {target.model} = "{rel}" {{\n' + "".join(f"  {a}\n" for a in attrs) + "}"
    return [decl, f"{target.model} -> {target.large} when {target.name} {target.op} {t} rewrite"]
