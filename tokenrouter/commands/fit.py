"""`tokenrouter fit FILE.route --router NAME --prompts P.jsonl --out W.safetensors`: train one
router network or head row of a program on its own model pair, choose its threshold on a
held-out split, write the weights (with metadata), a JSON report and a PNG, and print the
lines to put in the .route file. `--model NAME=PATH` binds a model the program declares by
role only, `--set NAME=VALUE` one of its parameters, as on every command that loads a
program. A label set of one class (the models agree everywhere, or nowhere) is a warning; a
threshold that cannot be chosen is an error. Exit status 0 on success, 1 on bad input
(nothing is written then), 2 on a malformed --model or --set."""

from __future__ import annotations

import argparse
import sys

from tokenrouter.commands._args import add_binding_args, bindings

HELP = "train a router network or head row of a program on its model pair"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("route", metavar="FILE.route", help="the program whose router to fit")
    parser.add_argument("--router", required=True, metavar="NAME", help="the router or head to fit")
    parser.add_argument("--prompts", required=True, metavar="P.jsonl",
                        help='prompts, one JSON object a line with a "prompt" string')
    parser.add_argument("--out", required=True, metavar="W.safetensors", help="where to write the weights")
    add_binding_args(parser)
    parser.add_argument("--epochs", type=int, default=30, help="training epochs (default 30)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the held-out split, init and shuffling")
    pick = parser.add_mutually_exclusive_group()
    pick.add_argument("--min-recall", type=float, metavar="R",
                      help="threshold: the lowest large-token share that routes >= R of the divergent tokens "
                           "(default for arch r2r: 0.95, R2R's choice)")
    pick.add_argument("--target-share", type=float, metavar="S",
                      help="threshold: the large model writes a share S of the tokens (default for others: 0.3)")
    parser.add_argument("--holdout", type=float, default=0.2, help="share of the prompts held out (default 0.2)")
    parser.add_argument("--max-tokens", type=int, default=48, help="greedy tokens per prompt (default 48)")
    parser.add_argument("--batch", type=int, default=32, help="prompts per engine batch (default 32)")
    parser.add_argument("--eval-prompts", metavar="E.jsonl",
                        help="also generate on these prompts: routed output vs the large model's, router vs "
                             "the entropy rule at the same large-token share")
    parser.add_argument("--eval-max-tokens", type=int, metavar="N",
                        help="greedy tokens per --eval-prompts prompt (default: --max-tokens)")
    parser.add_argument("--eval-max-prompts", type=int, metavar="N",
                        help="generate on the first N --eval-prompts only (default: all)")
    parser.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate (default 1e-3)")
    parser.add_argument("--width", type=int, default=256, help="r2r backbone width (default 256; R2R: 1024)")
    parser.add_argument("--blocks", type=int, default=2, help="r2r residual blocks (default 2; R2R: 6)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: two threads per engine collapse on a busy 2-core host)")
    parser.add_argument("--report", metavar="STEM", help="report path without extension (default: next to --out)")
    parser.add_argument("--cache", action="store_true",
                        help="remember the labelled passes and baselines in $TOKENROUTER_CACHE/fit (refits and "
                             "other routers of the same pair and layout reuse them)")
    parser.add_argument("--no-align", action="store_true",
                        help="write the network as trained and print its threshold, instead of shifting its output "
                             "logit so that the threshold the program already compares with is the chosen one")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")


def run(args) -> int:
    from tokenrouter.fit.fitting import FitOptions, fit
    from tokenrouter.fit.errors import FitError
    from tokenrouter.prompts import PromptsError
    from tokenrouter.fit.train import Hyper

    params, model_paths = bindings(args)  # a malformed --set or --model: a UsageError, exit 2
    opts = FitOptions(route=args.route, params=params, model_paths=model_paths, router=args.router, prompts=args.prompts, out=args.out,
                      epochs=args.epochs, seed=args.seed, min_recall=args.min_recall,
                      target_share=args.target_share, holdout=args.holdout, max_tokens=args.max_tokens,
                      batch=args.batch, eval_prompts=args.eval_prompts, eval_max_tokens=args.eval_max_tokens,
                      eval_max_prompts=args.eval_max_prompts, report=args.report,
                      threads=args.threads, progress=not args.quiet, cache=args.cache, align=not args.no_align,
                      hyper=Hyper(lr=args.lr, width=args.width, blocks=args.blocks))
    try:
        res = fit(opts)
    except (FitError, PromptsError) as exc:
        print(f"tokenrouter fit: error: {exc}", file=sys.stderr)
        return 1
    for warning in res.report["warnings"]:
        print(f"tokenrouter fit: warning: {warning}", file=sys.stderr)
    h = res.report["heldout"]
    e = res.report["entropy_rule_same_share"]
    print(f"held-out ({h['rows']} positions, {h['divergent_rate']:.1%} divergent): AUC {_auc(h['auc'])}, "
          f"threshold {res.threshold:g}: recall {h['recall']:.3f}, precision {h['precision']:.3f}, "
          f"large-token share {h['large_share']:.3f}")
    print(f"entropy rule at the same share (tau {e['tau']:.4f}): AUC {_auc(e['auc'])}, recall {e['recall']:.3f}, "
          f"precision {e['precision']:.3f}")
    g = res.report.get("generation")
    if g:
        for name in ("router", "entropy_rule", "entropy_rule_heldout_tau", "small_alone"):
            r = g[name]
            print(f"generation on {g['prompts']} prompts, {name}: large-token share {r['large_share']:.3f}, "
                  f"agreement with the large model: position by position {r['token_agreement']:.3f}, "
                  f"ROUGE-L {r['rouge_l']:.3f}, common prefix {r['mean_common_prefix']:.1f} tokens")
    print(f"wrote {res.out}, {res.report_json}, {res.report_png}")
    print("put in the .route file:")
    for line in res.route_lines:
        print(line)
    return 0


def _auc(v: float) -> str:
    return "n/a (one class)" if v != v else f"{v:.3f}"
