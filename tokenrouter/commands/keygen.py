"""`tokenrouter keygen DIR`: a CURVE key pair for authenticated, encrypted tcp between hosts.

Writes DIR/tokenrouter.key (public) and DIR/tokenrouter.key_secret (owner-only). Copy the
folder to every host of the deployment and pass `--curve-keys DIR` to each
`tokenrouter serve` (frontend and `--subserver` alike): only processes holding the pair
can connect to one another. See docs/runtime.md, "Across hosts".
"""

from __future__ import annotations

import argparse
import sys

HELP = "make the CURVE key pair that authenticates and encrypts tcp between hosts"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", help="folder for tokenrouter.key and tokenrouter.key_secret (created)")


def run(args: argparse.Namespace) -> int:
    from tokenrouter.runtime.transport.security import SecurityError, generate_keys
    try:
        public, secret = generate_keys(args.dir)
    except (SecurityError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {public} and {secret} (keep the secret file private; copy the folder to every host)")
    return 0
