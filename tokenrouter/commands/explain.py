"""`tokenrouter explain FILE [-o out.svg|out.png]`: the program in words, and its state
machine drawn.

The words go to stdout: writers (each model's weight format, engine and, on the CPU, the
kernel plan measured on this host for the threads `serve` would give it, or that none is
measured yet), start, routers and heads (weights file, inputs), each handoff with its
condition and keep/rewrite, visit bounds, the serve schedule and the bound parameters (with
`--set` and `--model` applied). With `-o` the state machine is drawn too: writers as boxes,
handoffs as labelled arrows.

Exit status: 0, 1 when the program does not check, 2 on usage errors.
"""

from __future__ import annotations

import argparse
import os
import sys

from tokenrouter.commands._args import add_binding_args, bindings, report_unreadable

HELP = "describe a .route program in words and draw its state machine"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE", help="the .route program")
    parser.add_argument("-o", "--output", metavar="OUT", help="draw the state machine to OUT (.svg or .png)")
    add_binding_args(parser)


def run(args) -> int:
    from tokenrouter.compiler.explain.describe import describe
    from tokenrouter.compiler.pipeline import check_file
    from tokenrouter.runtime.loader import model_facts
    from tokenrouter.dsl.diagnostics import render_all

    if report_unreadable([args.file], "explain"):
        return 2
    if args.output and os.path.splitext(args.output)[1].lower() not in (".svg", ".png"):
        print(f"tokenrouter explain: error: -o takes a file ending in .svg or .png, got '{args.output}'",
              file=sys.stderr)
        return 2
    params, model_paths = bindings(args)  # a malformed --set or --model: a UsageError, exit 2
    program, diags = check_file(args.file, model_paths=model_paths, params=params, model_facts=model_facts)
    if diags:
        with open(args.file, encoding="utf-8", errors="replace") as f:
            print(render_all(diags, f.read()), file=sys.stderr)
    if program is None:
        return 1
    sys.stdout.write(describe(program, kernel_plan_notes(program)))
    if args.output:
        from tokenrouter.compiler.explain.draw import draw

        try:
            draw(program, args.output)
        except OSError as exc:
            print(f"tokenrouter explain: error: cannot write '{args.output}': {exc.strerror or exc}", file=sys.stderr)
            return 1
        print(f"drew {args.output}", file=sys.stderr)
    return 0


def kernel_plan_notes(program) -> dict[str, list[str]]:
    """Per writer, the kernel plan of each model it steps, as cached on this host for the
    threads `serve` would give its subserver (nothing is loaded, converted or measured)."""
    from tokenrouter.runtime.launch import LaunchOptions, plan
    from tokenrouter.runtime.loader import LoadError, cached_kernel_plan

    ensembles = {e.name: e.members for e in program.ensembles}
    notes: dict[str, list[str]] = {}
    for w, spec in plan(program, LaunchOptions(mode="thread")).items():
        for name in ensembles.get(w, (w,)):
            m = program.model(name)
            head = "kernel plan" + (f" of {name}" if w in ensembles else "")
            if spec.device != "cpu":
                notes.setdefault(w, []).append(f"{head}: none (the engine measures kernels on the CPU only)")
                continue
            try:
                where, cached = cached_kernel_plan(m.path, m.quant, spec.threads)
            except (LoadError, OSError) as exc:
                notes.setdefault(w, []).append(f"{head}: unknown ({exc})")
                continue
            notes.setdefault(w, []).extend(_plan_lines(head, spec.threads, where, cached))
    return notes


def _plan_lines(head: str, threads: int, where: str | None, cached: dict | None) -> list[str]:
    t = f"{threads} thread{'s' if threads != 1 else ''}"
    if where is None:
        return [f"{head} ({t}): measured at the first load, once the weights are converted into the cache"]
    if cached is None:
        return [f"{head} ({t}): not measured on this host yet; the first load measures it (tens of seconds)"]
    lines = [f"{head} ({t}, measured on this host {cached.get('measured_at', '')}):"]
    for shape, steps in sorted(cached.get("plans", {}).items()):
        text = ", ".join(f"{k} to {rows} row{'s' if rows != 1 else ''}" if i < len(steps) - 1
                         else (f"{k} above" if i else k) for i, (rows, k) in enumerate(steps))
        lines.append(f"  {shape}: {text}")
    return lines
