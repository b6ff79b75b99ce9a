"""`tokenrouter fmt FILE... [--check|--write]`: the canonical layout of .route files.

Without a flag the formatted text goes to stdout. `--check` changes nothing and exits 1
when a file is not formatted; `--write` rewrites files in place. A file with a syntax
error is left alone and its diagnostic printed (exit 1); usage errors exit 2."""

from __future__ import annotations

import argparse
import sys

from tokenrouter.commands._args import report_unreadable

HELP = "lay out .route files canonically (comments kept)"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE", help=".route files to format")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 if any file would change; write nothing")
    mode.add_argument("--write", action="store_true", help="rewrite the files in place")


def run(args) -> int:
    from tokenrouter.dsl.diagnostics import render_all
    from tokenrouter.dsl.format import format_tree
    from tokenrouter.dsl.parser import parse_bytes

    if report_unreadable(args.files, "fmt"):
        return 2
    status = 0
    for path in args.files:
        with open(path, "rb") as f:
            data = f.read()
        tree, diags, text = parse_bytes(data, path)
        if tree is None:
            print(render_all(diags, text), file=sys.stderr)
            status = 1
            continue
        formatted = format_tree(tree, text)
        if args.check:
            if formatted != text:
                print(f"would reformat {path}", file=sys.stderr)
                status = 1
        elif args.write:
            if formatted != text:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(formatted)
                print(f"reformatted {path}", file=sys.stderr)
        else:
            sys.stdout.write(formatted)
    return status
