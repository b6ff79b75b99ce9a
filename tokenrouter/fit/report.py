"""The fit report: its sections (`build_report`: the data, the training, the held-out
figures next to the training-free entropy rule at the same large-token share, the curves,
the host, warnings about the labels), what the weights file records of it
(`training_metadata`), how close routed generation comes to the large model's
(`agreement`), and the figure (`plot`: precision, recall and large-token share against the
threshold, and the ROC of the router next to the entropy rule, on the held-out rows).
"""

from __future__ import annotations

import json
import os

import torch

from tokenrouter.compiler.weights import nets as rn
from tokenrouter.fit import train
from tokenrouter.fit.job import Data, FitOptions, Job, Pair, Prompts, Scores, Trained
from tokenrouter.fit.target import Target, route_text
from tokenrouter.runtime.host import host_info


LABELS = {
    "r2r": "divergent: the small model's greedy token differs from the large model's greedy token at the same "
           "prefix (verifier-free stand-in for R2R's verified continuation)",
    "citer": "keep (1) where the small model's greedy token equals the large model's, route (0) where it does not "
             "(CITER's token-level labels with the large model as the reference; no iterative relabelling)",
    "co_llm": "Co-LLM: weak labels (defer where the large model's token is the reference and the small model's is "
              "not), then the marginal likelihood of the reference token under {small, large} with both models frozen",
    "mlp": "divergent, as for r2r",
}


def host() -> dict:
    return {**host_info(bandwidth=False), "torch_threads": torch.get_num_threads()}


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


def label_warnings(data: Data) -> list[str]:
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


def heldout_figures(target: Target, scores: Scores, data: Data) -> tuple[dict, dict]:
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


def build_report(opts: FitOptions, job: Job, pair: Pair, prompts: Prompts, data: Data, trained: Trained,
            scores: Scores, heldout: dict, entropy_rule: dict) -> dict:
    target = job.target
    return {
        "router": target.name, "arch": target.arch, "program": os.path.basename(opts.route),
        "direction": target.op,
        "rule": f"{target.model} -> {target.large} when {target.name} {target.op} {route_text(scores.threshold)} rewrite",
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


def _data_section(opts: FitOptions, prompts: Prompts, data: Data) -> dict:
    return {"prompts_file": os.path.basename(opts.prompts), "prompts": len(prompts.ids),
            "train_prompts": len(prompts.train_idx), "heldout_prompts": len(prompts.held_idx), "split_seed": opts.seed,
            "max_tokens": opts.max_tokens, "train_rows": len(data.train.x), "heldout_rows": len(data.held.x),
            "train_divergent_rate": float(data.train.divergent.mean()), "seconds": round(data.seconds, 1)}


def _training_section(target: Target, trained: Trained, seed: int) -> dict:
    hp, losses = trained.hyper, trained.losses
    return {"epochs": hp.epochs, "lr": hp.lr, "weight_decay": hp.weight_decay, "batch": hp.batch,
            "dropout": hp.dropout, "seed": seed, "loss_first": losses[0], "loss_last": losses[-1],
            "losses": [round(x, 5) for x in losses], "seconds": round(trained.seconds, 1),
            **({"width": hp.width, "blocks": hp.blocks, "expansion": hp.expansion} if target.arch == "r2r" else {}),
            "parameters": sum(v.numel() for v in trained.tensors.values())}


def training_metadata(target: Target, threshold: float, report: dict, heldout: dict, hp: train.Hyper,
                       seed: int) -> dict[str, str]:
    """The metadata the weights file gains once the threshold is chosen."""
    return {rn.META_THRESHOLD: repr(threshold),
            rn.META_TRAINING: json.dumps({
                "labels": LABELS[target.arch], "threshold_rule": report["threshold_rule"],
                "data": report["data"], "heldout": {k: heldout[k] for k in ("auc", "recall", "precision", "large_share",
                                                                             "rows", "divergent_rate")},
                "epochs": hp.epochs, "seed": seed}, sort_keys=True)}


def plot(report: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curve, ent = report["curve"], report["entropy_curve"]
    held = report["heldout"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    th = [c["threshold"] for c in curve]
    a.plot(th, [c["recall"] for c in curve], label="recall (divergent tokens routed)")
    a.plot(th, [c["precision"] for c in curve], label="precision")
    a.plot(th, [c["large_share"] for c in curve], label="large-token share")
    a.axvline(held["threshold"], color="k", ls="--", lw=1, label=f"chosen {held['threshold']:g}")
    a.set_xlabel(f"threshold t (route when {report['router']} {report['direction']} t)")
    a.set_ylim(-0.02, 1.02)
    a.set_title(f"{report['router']} ({report['arch']}), held-out rows: {held['rows']}")
    a.legend(fontsize=8)
    b.plot([c["fpr"] for c in curve], [c["recall"] for c in curve], label=f"router, AUC {held['auc']:.3f}")
    b.plot([c["fpr"] for c in ent], [c["recall"] for c in ent],
           label=f"entropy rule, AUC {report['entropy_rule_same_share']['auc']:.3f}")
    b.plot([0, 1], [0, 1], color="grey", lw=0.8, ls=":")
    b.scatter([held["fpr"]], [held["recall"]], color="k", zorder=3, s=18)
    b.set_xlabel("false positive rate (agreeing tokens routed)")
    b.set_ylabel("true positive rate (divergent tokens routed)")
    b.set_title("ROC")
    b.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=110)
    plt.close(fig)
