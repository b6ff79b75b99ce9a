"""Loading a program's compiled router module for the runtime.

The runtime uses exactly this API:

    from tokenrouter.compiler.backend.compiled import load_routers, generate_module
    source = generate_module(program)       # str: the generated module (deterministic)
    routers = load_routers(program, device="cpu", dtype=torch.float32)
    r = routers["slm"]                     # one router per writer (models, then ensembles)
    r.index         # position of this writer in program.writers()
    r.needs         # step.FeatureNeeds: hidden layers / token embedding its route reads
    r.route(step)   # step.StepTensors -> CPU int64 [2, B]: row 0 destination writer index,
                    #   row 1 keep (1) / rewrite (0); the step's one device-to-host copy
    r.send(state, peer) -> state.PeerMessage      # only the suffix `peer` has not read;
                                                #   updates state.peer_read[peer]
    r.receive(msg, state_or_None) -> state.RouteState  # creates or appends; a gap or an
                                                #   overlap that does not line up raises
    r.combine(step) -> [B, V] log-probs         # ensemble writers only

Visit bounds are part of `route`: before `min_tokens` no transition is tried; at
`max_tokens` the request goes to the bound's `then`, keeping its token. Router networks
and head rows are read from safetensors here, at load time, and checked against the
declared input layout (`weights.nets.RouterWeightsError` on any mismatch). Relative weight
paths resolve against `base_dir` (default: the folder of `program.source` when that is a
file, else the working directory). `dtype` is the dtype the features are computed in.
"""

from __future__ import annotations

import hashlib
import os
import types

import torch

from tokenrouter.compiler import ir
from tokenrouter.compiler.backend.codegen import CodegenError, generate_module, head_keys
from tokenrouter.compiler.weights.nets import RouterWeightsError, load_head, load_router_net

__all__ = ["generate_module", "load_module", "load_routers", "CodegenError", "RouterWeightsError"]


def load_module(source: str, name: str = "tokenrouter_compiled_router") -> types.ModuleType:
    """Execute generated source as a fresh module (never our own input: only codegen output)."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:12]
    module = types.ModuleType(f"{name}_{digest}")
    module.__file__ = f"<{module.__name__}>"
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    return module


def default_base_dir(program: ir.Program) -> str | None:
    src = str(program.source)
    return os.path.dirname(os.path.abspath(src)) if src and os.path.isfile(src) else None


def _hidden_sizes(program: ir.Program) -> dict[str, int]:
    """Final hidden width per model, where a router's declared layout says it."""
    sizes: dict[str, int] = {}
    for r in program.routers:
        for inp in r.inputs:
            if isinstance(inp, ir.InputHidden) and inp.layer == -1:
                sizes.setdefault(r.model, inp.dim)
    return sizes


def load_routers(program: ir.Program, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32, base_dir: str | None = None,
                 hidden_sizes: dict[str, int] | None = None) -> dict:
    """Compile `program` and return {writer name: router} ready for the runtime.

    `hidden_sizes` (model -> hidden width, e.g. from its ModelConfig) lets head rows be
    checked at load time too; without it, a head row is checked against the widths the
    program declares for that model's final hidden state, if any.
    """
    if base_dir is None:
        base_dir = default_base_dir(program)
    module = load_module(generate_module(program))
    nets = {r.name: load_router_net(r, base_dir, device, dtype) for r in program.routers}
    sizes = {**_hidden_sizes(program), **(hidden_sizes or {})}
    heads = [load_head(ir.HeadLogit(model=m, file=f, sigmoid=True), sizes.get(m), base_dir, device, dtype)
             for m, f in head_keys(program)]
    return {cls.NAME: cls(nets, heads, device, dtype) for cls in module.ROUTERS}
