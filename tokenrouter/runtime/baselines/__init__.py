"""Baselines the benchmarks compare this runtime with, built from the same parts.

- `naive`: two independent single-model servers and a dispatcher in between, as a
  deployment on stock serving engines would be: every handoff goes through the
  dispatcher with the whole context, and the receiving server treats it as a new request
  whose prefix it matches against its cache (no pending state).
- `lockstep`: every model stepped in one loop, one token per request per iteration, so
  each iteration waits for the slowest model.
"""
