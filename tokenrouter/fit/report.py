"""The fit report's figure: precision, recall and large-token share against the threshold,
and the ROC of the router next to the training-free entropy rule (held-out rows)."""

from __future__ import annotations


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
