"""`tokenrouter serve FILE`: an OpenAI-compatible server for a routing program.

Starts one subserver per writer (its own process) and the HTTP frontend. Options override
the program's serving schedule; none changes the tokens produced. With `--subserver NAME`
it runs just that subserver (for a multi-host deployment, see docs/runtime.md).

Exit status (`EXIT_CODES`, also in `--help` and docs/runtime.md): 0 stopped normally; 1 the
program has errors; 2 a bad argument, file or key; 3 a subserver's restarts were exhausted
while serving (a supervisor should take over); 4 the server did not start (a subserver
failed to start, the port is taken).
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
from contextlib import asynccontextmanager

from tokenrouter.commands._args import QUANT_HELP, add_binding_args, bindings, with_quant
from tokenrouter.protocol.sampling import DEFAULT_MAX_TOKENS

HELP = "serve a .route program over an OpenAI-compatible HTTP API"

EXIT_OK, EXIT_PROGRAM, EXIT_USAGE, EXIT_RESTARTS_EXHAUSTED, EXIT_NOT_STARTED = 0, 1, 2, 3, 4
EXIT_CODES = ((EXIT_OK, "stopped normally"), (EXIT_PROGRAM, "the program has errors"),
              (EXIT_USAGE, "a bad argument, file or key"),
              (EXIT_RESTARTS_EXHAUSTED, "a subserver's restarts were exhausted while serving"),
              (EXIT_NOT_STARTED, "the server did not start (a subserver failed to start, the port is taken)"))


def _pairs(values: list[str] | None, what: str, conv=str) -> dict:
    out = {}
    for v in values or ():
        name, sep, val = v.partition("=")
        if not sep or not name or not val:
            raise ValueError(f"{what} must look like NAME=VALUE, got {v!r}")
        try:
            out[name] = conv(val)
        except ValueError:
            raise ValueError(f"{what} {v!r}: {val!r} is not a valid value") from None
    return out


def configure(parser: argparse.ArgumentParser) -> None:
    parser.epilog = "exit status: " + "; ".join(f"{code} {what}" for code, what in EXIT_CODES)
    parser.add_argument("file", help="the .route program")
    parser.add_argument("--host", default="127.0.0.1", help="HTTP address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000)")
    add_binding_args(parser)
    parser.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                        help="the model id(s) clients use; the first is the one responses carry "
                             "(default: the file's name without .route)")
    parser.add_argument("--concurrency", type=int, default=8,
                        help="expected concurrent requests, for `auto` batch thresholds (default 8)")
    parser.add_argument("--batch", action="append", metavar="WRITER=B", help="override a batch threshold B_i")
    parser.add_argument("--max-wait-ms", action="append", metavar="WRITER=MS", help="override a max wait")
    parser.add_argument("--threads", action="append", metavar="WRITER=N", help="override CPU threads")
    parser.add_argument("--block-size", type=int, default=16, help="KV cache block size (default 16)")
    parser.add_argument("--num-blocks", type=int, default=None, help="KV blocks per model (default: 1 GiB each)")
    parser.add_argument("--max-model-len", type=int, default=None, help="context length (default: the models')")
    parser.add_argument("--max-tokens-limit", type=int, default=None, help="largest max_tokens accepted")
    parser.add_argument("--default-max-tokens", type=int, default=DEFAULT_MAX_TOKENS,
                        help=f"max_tokens when a request gives none (default {DEFAULT_MAX_TOKENS})")
    parser.add_argument("--tool-call-parser", default=None, metavar="NAME",
                        help="how tool calls are read from the output (hermes: Qwen2.5, Qwen3, Hermes; "
                             "default: the format the chat template writes, else hermes; docs/runtime.md)")
    parser.add_argument("--profile", default=None, help="tuner profile (JSON) for `auto` thresholds")
    parser.add_argument("--bind", action="append", metavar="NAME=ADDR",
                        help="ZeroMQ endpoint of `frontend` or a writer (tcp://host:port for other hosts)")
    parser.add_argument("--remote", action="append", metavar="WRITER",
                        help="a writer whose subserver runs elsewhere (started with --subserver)")
    parser.add_argument("--subserver", metavar="WRITER", default=None,
                        help="run only this writer's subserver (needs --bind for every endpoint)")
    parser.add_argument("--log-level", default=None, choices=("debug", "info", "warning", "error"),
                        help="info (default, or $TOKENROUTER_LOG): a line per long start-up step and per subserver "
                             "ready; warning: problems only. The HTTP server's own log stays at warning unless given")
    parser.add_argument("--quant", action="append", metavar="Q|NAME=Q",
                        help="override the models' weight format (all, or one model): " + QUANT_HELP)
    net = parser.add_argument_group("liveness and hosts")
    net.add_argument("--stall-window", type=float, default=30.0, metavar="S",
                     help="a subserver whose decoding loop shows no progress this long (stopped, deadlocked) is "
                          "declared hung and replaced; a busy one (its CPU time moves) or one whose heartbeats are "
                          "late never is (default 30 s; docs/runtime.md, Faults and liveness)")
    net.add_argument("--heartbeat-timeout", type=float, default=10.0, metavar="S",
                     help="a remote subserver (--remote) not heard from this long is down; its requests wait for "
                          "its return (default 10 s). A local one's death comes from the OS")
    net.add_argument("--max-restarts", type=int, default=5,
                     help="failed restarts in a row of a local subserver before serve exits non-zero (default 5)")
    net.add_argument("--curve-keys", metavar="DIR", default=None,
                     help="CURVE key folder (`tokenrouter keygen DIR`): authenticated, encrypted tcp")
    net.add_argument("--insecure-tcp", action="store_true",
                     help="allow plain tcp binds on non-loopback addresses (no keys)")
    lim = parser.add_argument_group("limits and access (HTTP)")
    lim.add_argument("--api-key", default=os.environ.get("TOKENROUTER_API_KEY"),
                     help="require `Authorization: Bearer KEY` on /v1 (default: $TOKENROUTER_API_KEY)")
    lim.add_argument("--insecure-http", action="store_true",
                     help="allow a non-loopback --host without --api-key")
    lim.add_argument("--max-body-bytes", type=int, default=8 << 20,
                     help="largest request body; larger gets 413 (default 8 MiB)")
    lim.add_argument("--max-running", type=int, default=64, help="requests generating at once (default 64)")
    lim.add_argument("--max-queue", "--max-waiting", dest="max_queue", type=int, default=None,
                     help="requests waiting beyond --max-running; more get 503 + Retry-After "
                          "(default: half of --max-running)")
    lim.add_argument("--allowed-origins", nargs="+", default=(), metavar="ORIGIN",
                     help="answer CORS requests from these origins (`*`: any); default: no CORS")
    lim.add_argument("--request-timeout", type=float, default=None, metavar="S",
                     help="end a request after S seconds, queueing included, with 504 (default: none)")
    lim.add_argument("--max-connections", type=int, default=None,
                     help="open HTTP connections; beyond it a new one replaces the oldest that has sent no "
                          "request yet, or gets 503 (default 4096, fewer if the descriptor limit is lower)")
    lim.add_argument("--header-timeout", type=float, default=None, metavar="S",
                     help="close a connection whose request headers take longer (default 10 s)")
    lim.add_argument("--body-timeout", type=float, default=None, metavar="S",
                     help="close a connection whose request body takes longer (default 60 s)")
    lim.add_argument("--idle-timeout", type=float, default=None, metavar="S",
                     help="close a keep-alive connection idle this long (default 5 s)")


def _options(args):
    """(LaunchOptions, the --profile or None); B_i for `auto` are added once the program is
    loaded (`_tune`)."""
    from tokenrouter.runtime.launch import LaunchOptions
    from tokenrouter.tuner.profile import Profile
    profile = Profile.load(args.profile) if args.profile else None
    binds = _pairs(args.bind, "--bind") or None
    return LaunchOptions(
        mode="process", concurrency=args.concurrency, batch=_pairs(args.batch, "--batch", int),
        max_wait_ms=_pairs(args.max_wait_ms, "--max-wait-ms", float),
        threads=_pairs(args.threads, "--threads", int), addresses=binds,
        remote=tuple(args.remote or ()), block_size=args.block_size, num_blocks=args.num_blocks,
        max_model_len=args.max_model_len, curve_keys=args.curve_keys,
        insecure_tcp=args.insecure_tcp), profile


def _tune(program, opts, profile) -> None:
    """The tuner's B_i for the program's `auto` writers, from --profile, handed to the
    launcher as numbers (without a profile the launcher's default applies)."""
    from tokenrouter.runtime.launch import served_writers
    from tokenrouter.tuner.program import auto_thresholds
    opts.tuned_batch = auto_thresholds(program, profile, opts.concurrency, served_writers(program), opts.batch)


def run(args: argparse.Namespace) -> int:
    from tokenrouter.runtime import logs
    level = (args.log_level or logs.level()).upper()
    logs.configure("tokenrouter", level)
    os.environ[logs.LEVEL_ENV] = level  # the subserver processes log at the same level
    from tokenrouter.compiler.pipeline import RouteError, load_program
    from tokenrouter.compiler.weights.check import required_weights
    from tokenrouter.extras import MissingExtra
    from tokenrouter.runtime.loader import model_facts
    try:
        opts, profile = _options(args)  # cheap checks first: no model is loaded yet
        params, model_paths = bindings(args)
        program = with_quant(load_program(args.file, model_paths=model_paths, params=params, model_facts=model_facts), args.quant)
        missing = required_weights(program)  # every router file, before any process starts
        if missing:
            with open(args.file, encoding="utf-8", errors="replace") as f:
                raise RouteError(missing, f.read())
        for w in [*opts.batch, *opts.max_wait_ms, *opts.threads, *opts.remote]:
            if w not in program.writers():
                raise ValueError(f"{w!r} is not a writer of {args.file} ({', '.join(program.writers())})")
        if opts.batch and min(opts.batch.values()) < 1:
            raise ValueError("batch thresholds must be at least 1")
        from tokenrouter.runtime.transport.security import Security, check_bind
        # SecurityError is a ValueError; a subserver started here cannot make a launch's keys
        sec = (Security.load(opts.curve_keys, opts.insecure_tcp) if args.subserver else
               Security.for_launch(opts.curve_keys, opts.insecure_tcp, opts.addresses or {}, opts.remote))
        if opts.addresses:
            for w, addr in opts.addresses.items():  # what this process will bind
                if w == args.subserver or (not args.subserver and (w == "frontend" or w not in opts.remote)):
                    check_bind(addr, sec)
        if args.heartbeat_timeout <= 0 or args.stall_window <= 0 or args.max_restarts < 0:
            raise ValueError("--heartbeat-timeout and --stall-window must be positive and --max-restarts at least 0")
        from tokenrouter.runtime.launch import require_engines
        here_not = tuple(w for w in program.writers() if w != args.subserver) if args.subserver else opts.remote
        require_engines(program, here_not)  # an engine's extra, where a writer served here needs it
        _tune(program, opts, profile)
    except RouteError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_PROGRAM
    except (ValueError, OSError, MissingExtra) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.subserver:
        return _run_subserver(args, program, opts)
    try:
        limits = _limits(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return _run_http(args, program, opts, limits)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _limits(args):
    from tokenrouter.runtime.http.app import Limits
    from tokenrouter.runtime.http.connections import ConnectionLimits
    from tokenrouter.runtime.http.limits import QUEUE_PER_RUNNING
    if not _is_loopback(args.host) and not args.api_key and not args.insecure_http:
        raise ValueError(f"--host {args.host} is reachable from other machines: give --api-key (or "
                         f"$TOKENROUTER_API_KEY), or --insecure-http to serve without one")
    for name in ("max_body_bytes", "max_running", "max_connections"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
    if args.max_queue is not None and args.max_queue < 0:
        raise ValueError("--max-queue must be at least 0")
    for name in ("request_timeout", "header_timeout", "body_timeout", "idle_timeout"):
        if getattr(args, name) is not None and getattr(args, name) <= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be positive")
    queue = args.max_queue if args.max_queue is not None else int(args.max_running * QUEUE_PER_RUNNING)
    given = {"header_timeout_s": args.header_timeout, "body_timeout_s": args.body_timeout,
             "idle_timeout_s": args.idle_timeout, "max_connections": args.max_connections}
    conn = ConnectionLimits(**{k: v for k, v in given.items() if v is not None})
    return Limits(max_body_bytes=args.max_body_bytes, max_running=args.max_running, max_queue=queue,
                  request_timeout_s=args.request_timeout, api_key=args.api_key or None, connections=conn)


def _run_subserver(args, program, opts) -> int:
    from tokenrouter.runtime.launch import plan
    from tokenrouter.runtime.subserver.process import run_process
    if opts.addresses is None:
        print("error: --subserver needs --bind NAME=ADDR for the frontend and every writer", file=sys.stderr)
        return EXIT_USAGE
    try:
        specs = plan(program, opts)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.subserver not in specs:
        print(f"error: {args.subserver!r} is not a served writer ({', '.join(specs)})", file=sys.stderr)
        return EXIT_USAGE
    spec = specs[args.subserver]
    spec.base_dir = os.path.dirname(os.path.abspath(args.file))
    run_process(spec.to_dict())
    return EXIT_OK


def _run_http(args, program, opts, limits) -> int:
    import uvicorn

    from tokenrouter.runtime.launch import close_runtime, open_runtime
    from tokenrouter.runtime.http.app import build_app
    from tokenrouter.runtime.http.connections import raise_descriptor_limit, server_config
    from tokenrouter.runtime.loader import LoadError, program_tokenizer
    from tokenrouter.runtime.logs import quiet_repeats

    opts.base_dir = os.path.dirname(os.path.abspath(args.file))
    try:
        tokenizer = program_tokenizer(program)
    except LoadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    names = tuple(args.served_model_name or (os.path.splitext(os.path.basename(args.file))[0],))
    name = names[0]

    fatal: list[str] = []

    def on_fatal(why: str) -> None:  # restarts exhausted: stop, so a supervisor takes over
        print(f"tokenrouter: {why}; exiting", file=sys.stderr, flush=True)
        fatal.append(why)
        server.should_exit = True

    @asynccontextmanager
    async def runtime():
        launcher, fe = await open_runtime(program, opts, heartbeat_timeout_s=args.heartbeat_timeout,
                                          stall_window_s=args.stall_window, max_restarts=args.max_restarts,
                                          on_fatal=on_fatal)
        try:
            print(f"tokenrouter: serving {name!r} ({', '.join(fe.writers)}) on http://{args.host}:{args.port}",
                  file=sys.stderr, flush=True)
            yield fe
        finally:
            await close_runtime(launcher, fe)

    try:
        app = build_app(runtime, names, tokenizer, args.max_tokens_limit, args.default_max_tokens, limits,
                        allowed_origins=args.allowed_origins, tool_call_parser=args.tool_call_parser)
    except ValueError as exc:  # an unknown --tool-call-parser
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    raise_descriptor_limit()
    server = uvicorn.Server(server_config(app, args.host, args.port, args.log_level or "warning", limits.connections,
                                          app.state.connections))
    quiet_repeats()  # after uvicorn configured its loggers: a repeated error is logged once, with a count
    try:
        server.run()
    except SystemExit:  # uvicorn's own exit when the app did not start (its status 3 is ours below)
        return EXIT_NOT_STARTED
    if fatal:
        return EXIT_RESTARTS_EXHAUSTED
    return EXIT_OK if server.started else EXIT_NOT_STARTED
