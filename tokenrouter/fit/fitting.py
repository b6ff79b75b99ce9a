"""`fit`: one router (or head row) of a program, trained on the program's own model pair.

    from tokenrouter.fit.fitting import FitOptions, fit
    result = fit(FitOptions(route="examples/r2r.route", router="r2r", prompts="data/prompts/train.jsonl",
                            out="examples/weights/r2r_router.safetensors"))
    result.threshold, result.report  # the chosen threshold, the report dict (also written as JSON)

Order of work: every input is checked before a model is loaded (prompts file, router name,
the program with its models and shared tokenizer), and every output file is written to a
temporary name and renamed only when all of them are complete, so a failed fit leaves
nothing behind.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
import time
from dataclasses import dataclass, field

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


@dataclass
class Target:
    name: str
    arch: str  # mlp | citer | r2r | co_llm
    model: str  # the model whose step it reads
    large: str  # the model it hands off to
    file: str
    op: str  # route when score `op` threshold
    constant: float  # the threshold the program compares it with
    router: ir.RouterNet | None
    inputs: tuple


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
        model, file, arch, inputs = r.model, r.file, r.arch, r.inputs
    else:
        model, file = heads[name]
        match = lambda e: isinstance(e, ir.HeadLogit) and e.file == file  # noqa: E731
        r, arch, inputs = None, "co_llm", (ir.InputHidden(-1, 0),)
    for t in program.transitions:
        found = _compares(t.when, match) if t.source == model else None
        if found:
            op, constant = found
            if op not in (">", ">=", "<", "<="):
                raise FitError(f"{route_path}: '{name}' is compared with {op}; fit needs <, <=, > or >=")
            return Target(name, arch, model, t.dest, file, op, float(constant), r, inputs)
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


# ------------------------------------------------------------------ fit


def fit(opts: FitOptions) -> FitResult:
    t0 = time.time()
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
    rows = read_prompts(opts.prompts)
    eval_rows = read_prompts(opts.eval_prompts) if opts.eval_prompts else None
    try:
        program = load_program(opts.route, check_weights=False, model_facts=model_facts)
    except RouteError as exc:
        raise FitError(f"{opts.route} does not load:\n{exc}") from None
    target = find_target(program, opts.route, opts.router)
    small_m, large_m = program.model(target.model), program.model(target.large)
    router = target.router
    min_recall, target_share = opts.min_recall, opts.target_share
    if min_recall is None and target_share is None:
        if target.arch == "r2r":
            min_recall = 0.95
        else:
            target_share = 0.3

    torch.set_num_threads(opts.threads)
    tok = program_tokenizer(program)
    stop = set(tok.eos_token_ids)
    ids = _encode(tok, rows)
    train_idx, held_idx = _split(len(ids), opts.holdout, opts.seed)
    max_len = max(len(p) for p in ids) + opts.max_tokens + 1
    eval_ids = _encode(tok, eval_rows[: opts.eval_max_prompts or None]) if eval_rows else []
    eval_tokens = opts.eval_max_tokens or opts.max_tokens
    if eval_ids:
        max_len = max(max_len, max(len(p) for p in eval_ids) + eval_tokens + 1)
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

    def key(prompt_ids, tokens, decisions):
        if not opts.cache:
            return None
        return collect.cache_key(models=[fps["reads"]["fingerprint"], fps["large"]["fingerprint"],
                                         small_m.dtype, large_m.dtype], prompts=prompt_ids, tokens=tokens,
                                 decisions=decisions)

    t_data = time.time()
    data, _ = collect.cached_lockstep(key(ids, opts.max_tokens, "small"), layout, small, large, ids, inputs,
                                      opts.max_tokens, opts.batch, stop, desc=f"label {len(ids)} prompts",
                                      progress=opts.progress)
    t_data = time.time() - t_data
    held_set = torch.tensor(held_idx)
    is_held = torch.isin(data.prompt, held_set)
    tr, ho = data.take(~is_held), data.take(is_held)
    if len(tr.x) < 2 or len(ho.x) < 1:
        raise FitError("too few labelled positions to train on; give more prompts or --max-tokens")

    # ---- labels and training
    route_high = target.op in (">", ">=")
    div_tr = tr.divergent
    y = div_tr if route_high else 1 - div_tr
    if target.arch == "citer":
        y = 1 - div_tr  # CITER's score is the confidence that the small model's token is right
        if route_high:
            raise FitError(f"a CITER router routes when its confidence is LOW: compare it with < or <=, not {target.op}")
    if target.arch == "co_llm" and not route_high:
        raise FitError(f"a Co-LLM defer head routes when its probability is HIGH: compare it with > or >=, not {target.op}")
    hp = dataclasses.replace(opts.hyper, epochs=opts.epochs)
    with torch.random.fork_rng():
        torch.manual_seed(opts.seed)
        model = train.build(target.arch, router, inputs[0].dim if router is None else rn.input_width(router), hp)
        t_train = time.time()
        aux = (tr.p_small_of_large, tr.p_large_top) if target.arch == "co_llm" else None
        losses = train.train(model, tr.x, y, hp, opts.seed, opts.progress, aux)
        t_train = time.time() - t_train
    tensors = {k: v.detach().float().contiguous() for k, v in model.export().items()}

    # ---- the inference module from its own file, the threshold, held-out figures
    meta = {rn.META_ARCH: target.arch, rn.META_DIRECTION: target.op}
    if router is not None:
        meta[rn.META_INPUTS] = rn.layout_text(router)
    meta[rn.META_MODELS] = json.dumps(fps, sort_keys=True)
    probe = _atomic(opts.out, lambda p: save_file(tensors, p, metadata=meta))
    try:
        if router is not None:
            net = rn.load_router_net(dataclasses.replace(router, file=probe))
            score_of = lambda x: net(x)  # noqa: E731
        else:
            w, b = rn.load_head(ir.HeadLogit(target.model, probe, True), hidden)
            score_of = lambda x: torch.sigmoid(x @ w + b)  # noqa: E731
        with torch.no_grad():
            s_ho, s_tr = score_of(ho.x), score_of(tr.x)
        div = ho.divergent
        chosen = train.choose(s_ho, div, target.op, min_recall, target_share)
        threshold = float(_route_text(chosen["threshold"]))
        aligned_from = None
        c = target.constant
        if opts.align and 0 < c < 1 and 0 < chosen["threshold"] < 1:
            # sigmoid(z + d) op c  <=>  sigmoid(z) op t  for d = logit(c) - logit(t): the file's
            # output moves so that the threshold the program already says is the chosen one
            aligned_from = chosen["threshold"]
            d = train.sigmoid_inverse(c) - train.sigmoid_inverse(aligned_from)
            bias = _output_bias(target.arch, tensors)
            tensors[bias] = (tensors[bias].double() + d).float()
            os.unlink(probe)
            probe = _atomic(opts.out, lambda p: save_file(tensors, p, metadata=meta))
            if router is not None:
                net = rn.load_router_net(dataclasses.replace(router, file=probe))
            else:
                w, b = rn.load_head(ir.HeadLogit(target.model, probe, True), hidden)
            with torch.no_grad():
                s_ho, s_tr = score_of(ho.x), score_of(tr.x)
            threshold = c
        figs = train.at(s_ho, div, target.op, threshold)
        route_score = s_ho if route_high else 1 - s_ho
        heldout = {"rows": len(ho.x), "divergent_rate": float(div.mean()),
                   **({"aligned_from_threshold": aligned_from} if aligned_from is not None else {}),
                   "auc": train.auc(route_score, div), **figs,
                   "train_auc": train.auc(s_tr if route_high else 1 - s_tr, tr.divergent)}
        at_recall = train.choose(s_ho, div, target.op, 0.95, None)
        heldout["at_recall_0.95"] = {k: at_recall[k] for k in ("threshold", "recall", "precision", "large_share")}
        tau = train.entropy_threshold_for_share(ho.entropy, figs["large_share"])
        entropy_rule = {"auc": train.auc(ho.entropy, div), **train.at(ho.entropy, div, ">", tau)}
        report = {
            "router": target.name, "arch": target.arch, "program": os.path.basename(opts.route),
            "direction": target.op,
            "rule": f"{target.model} -> {target.large} when {target.name} {target.op} {_route_text(threshold)} rewrite",
            "models": fps, "labels": LABELS[target.arch],
            "threshold_rule": ({"min_recall": min_recall} if min_recall is not None else {"target_share": target_share}),
            "data": {"prompts_file": os.path.basename(opts.prompts), "prompts": len(ids),
                     "train_prompts": len(train_idx), "heldout_prompts": len(held_idx), "split_seed": opts.seed,
                     "max_tokens": opts.max_tokens, "train_rows": len(tr.x), "heldout_rows": len(ho.x),
                     "train_divergent_rate": float(tr.divergent.mean()), "seconds": round(t_data, 1)},
            "training": {"epochs": hp.epochs, "lr": hp.lr, "weight_decay": hp.weight_decay, "batch": hp.batch,
                         "dropout": hp.dropout, "seed": opts.seed, "loss_first": losses[0], "loss_last": losses[-1],
                         "losses": [round(x, 5) for x in losses], "seconds": round(t_train, 1),
                         **({"width": hp.width, "blocks": hp.blocks, "expansion": hp.expansion}
                            if target.arch == "r2r" else {}),
                         "parameters": sum(v.numel() for v in tensors.values())},
            "heldout": heldout,
            "entropy_rule_same_share": {"rule": f"entropy({target.model}, normalized) > tau", "tau": tau,
                                        **entropy_rule},
            "curve": train.curve(s_ho, div, target.op),
            "entropy_curve": train.curve(ho.entropy, div, ">"),
            "host": host(),
        }
        if eval_ids:
            report["generation"] = _compare_generation(small, large, eval_ids, inputs, eval_tokens, opts, stop,
                                                       score_of, target.op, threshold, tau, opts.eval_prompts,
                                                       key, layout, _digest(tensors))
        report["seconds"] = round(time.time() - t0, 1)
        meta[rn.META_THRESHOLD] = repr(threshold)
        meta[rn.META_TRAINING] = json.dumps({
            "labels": LABELS[target.arch], "threshold_rule": report["threshold_rule"],
            "data": report["data"], "heldout": {k: heldout[k] for k in ("auc", "recall", "precision", "large_share",
                                                                         "rows", "divergent_rate")},
            "epochs": hp.epochs, "seed": opts.seed}, sort_keys=True)
        final = _atomic(opts.out, lambda p: save_file(tensors, p, metadata=meta))
    finally:
        os.unlink(probe)
    stem = opts.report or opts.out[: -len(".safetensors")] + ".report"
    json_tmp = _atomic(stem + ".json", lambda p: open(p, "w").write(json.dumps(report, indent=1) + "\n"))
    png_tmp = _atomic(stem + ".png", lambda p: plot(report, p))
    for tmp, dst in ((final, opts.out), (json_tmp, stem + ".json"), (png_tmp, stem + ".png")):
        os.replace(tmp, dst)
    lines = _route_lines(target, router, opts, threshold)
    return FitResult(opts.out, stem + ".json", stem + ".png", threshold, lines, report)


def _compare_generation(small, large, ids, inputs, max_tokens, opts, stop, score_of, op, threshold, tau,
                        path, key, layout, digest) -> dict:
    """Routed greedy outputs against the large model's own, for the router and for the entropy
    rule at the same large-token share. The share a threshold gives in generation differs
    from the share on the labelled rows (the trajectories change), so the entropy rule runs
    twice: with the tau matched on the held-out rows, and with the tau that routes the
    router's generation share of the positions the router's own generation visited (the
    closer match). The fit's output does not depend on this: it only reports."""
    kw = dict(progress=opts.progress)
    _, ref = collect.cached_lockstep(key(ids, max_tokens, "large"), layout, small, large, ids, inputs, max_tokens,
                                     opts.batch, stop, collect.ALWAYS, desc="large alone", **kw)
    _, small_only = collect.cached_lockstep(key(ids, max_tokens, "small"), layout, small, large, ids, inputs,
                                            max_tokens, opts.batch, stop, None, desc="small alone", **kw)
    with torch.no_grad():
        rrows, routed = collect.cached_lockstep(key(ids, max_tokens, f"router:{digest}{op}{threshold!r}"), layout,
                                            small, large, ids, inputs, max_tokens, opts.batch, stop,
                                            lambda x, logits: train.routes(score_of(x), op, threshold),
                                            desc="router", **kw)

    def entropy_pass(t):
        def by_entropy(x, logits):
            return collect.entropy(torch.log_softmax(logits, -1)) > t
        return collect.cached_lockstep(key(ids, max_tokens, f"entropy>{t!r}"), layout, small, large, ids, inputs,
                                       max_tokens, opts.batch, stop, by_entropy, desc="entropy rule", **kw)[1]

    tau_gen = train.entropy_threshold_for_share(rrows.entropy, _share(routed))
    out = {"prompts_file": os.path.basename(path), "prompts": len(ids), "max_tokens": max_tokens}
    for name, roll in (("router", routed), ("entropy_rule", entropy_pass(tau_gen)),
                       ("entropy_rule_heldout_tau", entropy_pass(tau)), ("small_alone", small_only)):
        out[name] = {"large_share": _share(roll), **agreement(roll.tokens, ref.tokens)}
    out["entropy_rule"]["tau"] = tau_gen
    out["entropy_rule_heldout_tau"]["tau"] = tau
    return out


def _route_lines(target: Target, router: ir.RouterNet | None, opts: FitOptions, threshold: float) -> list[str]:
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
