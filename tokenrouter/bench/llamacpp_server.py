"""`python -m tokenrouter.bench.llamacpp_server MODEL.gguf --parallel N --threads T --ctx C`:
a stock llama.cpp HTTP server (xllamacpp) on a free loopback port.

Prints `BUILD <system_info>` (the instruction sets the wheel's llama.cpp was built with), then
`READY <url>` once the model is loaded (or `ERROR <why>`), and serves until its stdin closes,
so it never outlives the benchmark that started it.
"""

from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf")
    ap.add_argument("--parallel", type=int, required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--ctx", type=int, required=True, help="KV cache tokens in all (split over the slots)")
    args = ap.parse_args(argv)
    import xllamacpp as x
    print("BUILD " + " ".join(x.get_system_info().split()), flush=True)
    p = x.CommonParams()
    p.model.path = args.gguf
    p.n_parallel = args.parallel
    p.n_ctx = args.ctx
    p.cpuparams.n_threads = args.threads
    p.cpuparams_batch.n_threads = args.threads
    p.port = 0  # a free port, read back from listening_address
    p.verbosity = 0
    p.warmup = True
    p.cont_batching = True
    p.endpoint_metrics = True
    p.endpoint_slots = True
    try:
        server = x.Server(p)
    except RuntimeError as exc:
        print(f"ERROR {exc}", flush=True)
        return 1
    print(f"READY {server.listening_address}", flush=True)
    sys.stdin.read()  # until the parent closes the pipe (or dies)
    del server
    return 0


if __name__ == "__main__":
    sys.exit(main())
