"""`tokenrouter eval`: the small model alone, the large model alone and the routed program on
a task set, per-prompt diffs, an optional parameter sweep (the cost/quality frontier), and a
static report page. See docs/eval.md."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time

from tokenrouter.commands._args import add_binding_args, bindings, positive_ints

HELP = "is routing worth it? score a program against its small and large model alone"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="the .route program")
    parser.add_argument("--out", default=None,
                        help="folder for summary.json, report.html and frontier.png (default: a new dated folder, "
                             "out/eval/NAME-YYYYMMDD-HHMMSS)")
    parser.add_argument("--prompts", action="append", default=None, metavar="P.jsonl",
                        help="task file (JSONL; repeatable); default: the shipped task set")
    add_binding_args(parser)
    parser.add_argument("--sweep", default=None, metavar="NAME=LO:HI:N",
                        help="also run the program at N evenly spaced values of parameter NAME")
    parser.add_argument("--concurrency", default="8", metavar="C[,C...]",
                        help="requests in flight (default 8); several (1,8): each configuration is timed at "
                             "each, the first is the headline figure")
    parser.add_argument("--max-tokens", type=int, default=32, help="most tokens per answer (default 32)")
    parser.add_argument("--limit", type=int, default=None,
                        help="only N prompts, spread evenly over the task files (a quicker, proportional subset)")
    parser.add_argument("--small", default=None, help="the small model's name (default: by role, else the start writer)")
    parser.add_argument("--large", default=None, help="the large model's name (default: by role, else the other model)")
    parser.add_argument("--no-chat", action="store_true", help="send prompts as raw text, not in the chat template")
    parser.add_argument("--reuse", default=None, metavar="DIR",
                        help="take small alone / large alone from an earlier eval's DIR when they are the same "
                             "computation (same model declaration, prompts, max tokens, concurrencies)")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads per subserver")


def run(args: argparse.Namespace) -> int:
    from tokenrouter.compiler.pipeline import check_file
    from tokenrouter.eval.configs import EvalError
    from tokenrouter.eval.evaluate import evaluate
    from tokenrouter.eval.tables import markdown
    from tokenrouter.runtime.frontend.frontend import RuntimeUnavailable
    from tokenrouter.runtime.frontend.launch import LaunchOptions
    from tokenrouter.runtime.loader import LoadError, model_facts

    try:
        params, model_paths = bindings(args)
        positive_ints(args.concurrency, "--concurrency")  # a clear error for a bad list
        concurrency = [int(x) for x in args.concurrency.split(",") if x.strip()]
        if len(set(concurrency)) != len(concurrency):
            raise EvalError("--concurrency values must be distinct")
        launch = LaunchOptions()
        if args.threads:
            prog, _ = check_file(args.file, model_paths=model_paths, params=params, model_facts=model_facts)
            launch.threads = {w: args.threads for w in (prog.writers() if prog else ())}
        out = args.out or default_out(args.file)
        print(f"tokenrouter eval: the report goes to {out}", file=sys.stderr)
        summary = evaluate(args.file, out, prompts=args.prompts, params=params, model_paths=model_paths, sweep=args.sweep,
                 concurrency=concurrency, max_tokens=args.max_tokens, limit=args.limit,
                 small=args.small, large=args.large, chat=not args.no_chat, launch=launch, reuse=args.reuse,
                 log=lambda m: print(m, file=sys.stderr), command=shlex.join(["tokenrouter", *sys.argv[1:]]))
        print(markdown(summary))
        return 0
    except (EvalError, LoadError, RuntimeUnavailable, ValueError) as exc:
        print(f"tokenrouter eval: error: {exc}", file=sys.stderr)
        return 1


def default_out(program: str) -> str:
    """out/eval/NAME-YYYYMMDD-HHMMSS: a new folder for each run, never over an earlier one."""
    name = os.path.splitext(os.path.basename(program))[0]
    return os.path.join("out", "eval", f"{name}-{time.strftime('%Y%m%d-%H%M%S')}")
