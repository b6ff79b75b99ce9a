"""`tokenrouter explain FILE [-o out.svg|out.png]`: the program in words, and its state
machine drawn.

The words go to stdout: writers, start, each handoff with its condition and keep/rewrite,
visit bounds, the serve schedule and the bound parameters (with `--set` applied). With
`-o` the state machine is drawn too: writers as boxes, handoffs as labelled arrows.

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
    try:
        params, model_paths = bindings(args)
    except ValueError as exc:
        print(f"tokenrouter explain: error: {exc}", file=sys.stderr)
        return 2
    program, diags = check_file(args.file, model_paths=model_paths, params=params, model_facts=model_facts)
    if diags:
        with open(args.file, encoding="utf-8", errors="replace") as f:
            print(render_all(diags, f.read()), file=sys.stderr)
    if program is None:
        return 1
    sys.stdout.write(describe(program))
    if args.output:
        from tokenrouter.compiler.explain.draw import draw

        try:
            draw(program, args.output)
        except OSError as exc:
            print(f"tokenrouter explain: error: cannot write '{args.output}': {exc.strerror or exc}", file=sys.stderr)
            return 1
        print(f"drew {args.output}", file=sys.stderr)
    return 0
