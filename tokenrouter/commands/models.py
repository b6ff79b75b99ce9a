"""`tokenrouter models`: the built-in model names, where each comes from, its size, and whether
it is already converted in the cache (the first use of an uncached one converts it)."""

from __future__ import annotations

import argparse
import sys

HELP = "list the built-in models (name, source, parameters, cached)"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--build", action="store_true",
                        help="convert / generate every built-in model into the cache now")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _fmt_params(n: int | None) -> str:
    if n is None:
        return "-"
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}K"


def run(args: argparse.Namespace) -> int:
    import json

    from ..runtime.loader import BUILTIN_MODELS, LoadError
    from ..runtime.loader.cache import cache_root

    rows = []
    for name, model in BUILTIN_MODELS.items():
        try:
            if args.build:
                print(f"building {name} ...", file=sys.stderr)
                model.folder()
            rows.append({"name": name, "source": model.source(), "parameters": model.parameters(),
                         "cached": model.is_cached(), "description": model.description})
        except LoadError as exc:
            rows.append({"name": name, "source": f"unavailable: {exc}", "parameters": None,
                         "cached": False, "description": model.description})
    if args.json:
        print(json.dumps({"cache": cache_root(), "models": rows}, indent=1))
        return 0
    width = max(len(r["name"]) for r in rows)
    print(f"{'NAME':<{width}}  {'PARAMS':>7}  {'CACHED':<6}  SOURCE")
    for r in rows:
        print(f"{r['name']:<{width}}  {_fmt_params(r['parameters']):>7}  {'yes' if r['cached'] else 'no':<6}  "
              f"{r['source']}")
        print(f"{'':<{width}}  {'':>7}  {'':<6}  {r['description']}")
    print(f"\ncache: {cache_root()} (set TOKENROUTER_CACHE to move it)")
    return 0
