"""What the compiler, the generated router modules and the runtime share.

| module | what |
|---|---|
| `sampling.py` | a request's sampling parameters, typed and bounded, from HTTP to the sampler and the wire |
| `state.py` | `RouteState` (one request as a subserver knows it) and `PeerMessage` (its wire form on a handoff) |
| `handoff.py` | `send` / `receive`: only the suffix a writer has not read crosses (invariant 2) |
| `step.py` | `StepTensors` (what a compiled `route` reads of a step) and `FeatureNeeds` |
| `features.py` | the feature helpers and the seeded hash the generated `route` calls |
| `router.py` | `Router`, the base class of every generated writer class |

It imports nothing else of tokenrouter, so a compiled router module loads without the
serving runtime.
"""
