"""`tokenrouter compile FILE`: a .route file (or an IR .json) to its router module and plan.

    tokenrouter compile examples/r2r.route -o build/r2r   # router.py, plan.json, ir.json
    tokenrouter compile examples/r2r.route --emit python  # the generated module on stdout
    tokenrouter compile examples/r2r.route --emit ir      # the IR (JSON) on stdout

The plan says what serving needs besides the module: models (path, role, dtype,
placement, batch threshold, maximum wait, threads), writers with the features each
route reads, weights files, the schedule, the parameters it was compiled with (value and
origin: default or --set), and the module's SHA-256. Models are not loaded
unless `--resolve` is given (then router input widths come from the models' configs).

Exit status: 0 on success, 1 when the program does not check or compile, 2 on usage
errors (a path that cannot be read).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

from tokenrouter.commands._args import add_binding_args, bindings, report_unreadable

HELP = "compile a .route file into its router module and serving plan"
PLAN_VERSION = 1


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE", help="a .route file, or an IR .json written by --emit ir")
    parser.add_argument("-o", "--output", metavar="DIR", help="write router.py, plan.json and ir.json here")
    parser.add_argument("--emit", choices=["python", "ir", "plan"], help="print this on stdout instead")
    parser.add_argument("--resolve", action="store_true",
                        help="resolve the models (checkpoint, GGUF or built-in) to fill in input widths")
    add_binding_args(parser)


def run(args) -> int:
    from tokenrouter.compiler.backend.codegen import CodegenError, generate_module

    if report_unreadable([args.file], "compile"):
        return 2
    if not args.output and not args.emit:
        print("tokenrouter compile: error: give -o DIR or --emit python|ir|plan", file=sys.stderr)
        return 2
    params, model_paths = bindings(args)  # a malformed --set or --model: a UsageError, exit 2
    if args.file.endswith(".json") and (params or model_paths):
        print("tokenrouter compile: error: an IR file is already bound; --set and --model apply to a .route file",
              file=sys.stderr)
        return 2
    program = _load(args.file, args.resolve, params, model_paths)
    if program is None:
        return 1
    try:
        source = generate_module(program)
    except CodegenError as exc:
        print(f"{args.file}: error: {exc}", file=sys.stderr)
        return 1
    plan = serving_plan(program, source)
    if args.emit == "python":
        sys.stdout.write(source)
    elif args.emit == "ir":
        print(program.to_json())
    elif args.emit == "plan":
        print(json.dumps(plan, indent=2, sort_keys=True))
    if args.output:
        try:
            os.makedirs(args.output, exist_ok=True)
            _write(os.path.join(args.output, "router.py"), source)
            _write(os.path.join(args.output, "plan.json"), json.dumps(plan, indent=2, sort_keys=True) + "\n")
            _write(os.path.join(args.output, "ir.json"), program.to_json() + "\n")
        except OSError as exc:
            print(f"tokenrouter compile: error: cannot write to '{args.output}': {exc.strerror or exc}",
                  file=sys.stderr)
            return 1
        if not args.emit:
            print(f"wrote {args.output}/router.py, plan.json, ir.json", file=sys.stderr)
    return 0


def _write(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def _load(path: str, resolve: bool, params=None, model_paths=None):
    """The checked program, or None after printing why not."""
    from tokenrouter.compiler import ir

    if path.endswith(".json"):
        try:
            with open(path, encoding="utf-8") as f:
                return ir.Program.from_json(f.read())
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"{path}: error: not a valid IR file ({exc})", file=sys.stderr)
            return None
    from tokenrouter.compiler.pipeline import RouteError, check_file, load_program
    from tokenrouter.runtime.loader import model_facts
    if resolve:
        try:
            return load_program(path, model_paths=model_paths, params=params, model_facts=model_facts)
        except RouteError as exc:
            print(str(exc), file=sys.stderr)
            return None
    program, diags = check_file(path, model_paths=model_paths, params=params, model_facts=model_facts)
    if diags:
        from tokenrouter.dsl.diagnostics import render
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError:
            text = None
        for d in diags:
            print(render(d, text), file=sys.stderr)
    return program


def serving_plan(program, source: str) -> dict:
    """What a launcher needs to serve the program, as JSON-ready data."""
    from tokenrouter.compiler import ir
    from tokenrouter.compiler.backend.codegen import head_keys
    from tokenrouter.compiler.needs import writer_needs

    s = program.schedule
    batch, wait = dict(s.batch), dict(s.max_wait_ms)
    placement, threads = dict(s.placement), dict(s.threads)
    ensembles = {e.name: e for e in program.ensembles}
    writers = []
    for i, w in enumerate(program.writers()):
        e = ensembles.get(w)
        needs = writer_needs(program, w)
        writers.append({"name": w, "index": i, "kind": "ensemble" if e else "model",
                        "members": list(e.members) if e else [w],
                        "needs": {"hidden_layers": list(needs.hidden_layers),
                                  "token_embedding": needs.token_embedding}})
    return {
        "plan_version": PLAN_VERSION,
        "ir_version": program.ir_version,
        "source": str(program.source),
        "start": program.start,
        "models": [{"name": m.name, "path": m.path, "role": m.role, "dtype": m.dtype,
                    "placement": placement.get(m.name, "cpu"), "batch": batch.get(m.name, 1),
                    "max_wait_ms": wait.get(m.name), "threads": threads.get(m.name, 0)}
                   for m in program.models],
        "writers": writers,
        "weights": sorted({r.file for r in program.routers} | {f for _, f in head_keys(program)}),
        "schedule": {"graph_batch_sizes": list(s.graph_batch_sizes), "graph_tokens": list(s.graph_tokens)},
        "params": [{"name": p.name, "type": p.type, "value": p.value, "origin": p.origin} for p in program.params],
        "module": "router.py",
        "module_sha256": hashlib.sha256(source.encode()).hexdigest(),
    } if isinstance(program, ir.Program) else {}
