"""Training data from the pair itself, and routed greedy generation, both in lockstep.

Both models hold the same sequences in their own engine's KV cache and step together on
one batch: at every output position the small model's step gives the router's inputs and
its greedy token, and the large model's step on the same prefix gives its own greedy token
(teacher forcing: the large model reads the small model's text, it never writes it). So
one pass labels every position of the small model's greedy trajectory.

`lockstep(..., decide=f)` instead appends the large model's token wherever `f` says route:
exactly the served semantics of a one-token rewrite (`slm -> llm when ... rewrite`,
`visit llm max 1 then slm`) under greedy decoding, used to compare routers by the text
they produce. `decide=ALWAYS` gives the large model's own greedy output.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from typing import Callable

import torch
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from tokenrouter.compiler import ir
from tokenrouter.compiler.features import STEP_NAMES, feature_of
from tokenrouter.compiler.needs import input_needs
from tokenrouter.compiler.text import input_text
from tokenrouter.protocol import features
from tokenrouter.protocol.step import StepTensors
from tokenrouter.runtime.engine.engine import Engine
from tokenrouter.runtime.loader import load_model
from tokenrouter.runtime.cache import cache_root

ALWAYS = "always"


@dataclass
class Rows:
    """One row per labelled output position."""

    x: torch.Tensor  # [N, width] the router's declared inputs
    small_tok: torch.Tensor  # [N] the small model's greedy token
    large_tok: torch.Tensor  # [N] the large model's greedy token at the same prefix
    p_small_of_large: torch.Tensor  # [N] the small model's probability of the large model's token
    p_large_top: torch.Tensor  # [N] the large model's probability of its own token
    entropy: torch.Tensor  # [N] the small model's normalised entropy (the training-free rule)
    prompt: torch.Tensor  # [N] index of the prompt
    position: torch.Tensor  # [N] output position

    @property
    def divergent(self) -> torch.Tensor:
        return (self.small_tok != self.large_tok).float()

    def take(self, mask: torch.Tensor) -> "Rows":
        return Rows(**{k: getattr(self, k)[mask] for k in self.__dataclass_fields__})


@dataclass
class Rollout:
    tokens: list[list[int]] = field(default_factory=list)  # per prompt, output tokens
    routed: list[list[bool]] = field(default_factory=list)  # per prompt, per token: the large model wrote it


def entropy(logp: torch.Tensor) -> torch.Tensor:
    """Normalised entropy (0 to 1) of each row of log-probabilities."""
    return torch.special.entr(logp.exp()).sum(-1) / math.log(logp.shape[-1])


def assemble(inputs: tuple, logits: torch.Tensor, hidden: dict, emb: torch.Tensor | None) -> torch.Tensor:
    """The router input [B, width] in declared order, computed as the compiled route does:
    each input with the helper its declaration names (`compiler/features/catalog.py`), in
    float32."""
    x, p, bad = features.dist(logits, torch.float32)
    step = StepTensors(logits=logits, sampled=None, visit_tokens=None, position=None, request_seed=None,
                       hidden=hidden, token_embedding=emb)
    given = {"x": x, "p": p, "bad": bad, "step": step, "dtype": torch.float32}
    cols = []
    for inp in inputs:
        node = inp.expr if isinstance(inp, ir.InputScalar) else inp
        decl = feature_of(node)
        if decl is None or any(a not in given and a in STEP_NAMES for a in decl.batched.args):
            raise ValueError(f"fit cannot compute the router input {input_text(inp)}")
        value = getattr(features, decl.batched.fn)(*(given[a] if a in given else getattr(node, a)
                                                     for a in decl.batched.args))
        cols.append(value[:, None] if decl.scalar else value)
    return torch.cat([c.float() for c in cols], -1)


def make_engine(model: ir.Model, max_len: int, batch: int):
    lm = load_model(model.path, dtype=getattr(torch, model.dtype))
    blocks = batch * (-(-max_len // 16) + 1) + 4
    return Engine(lm.config, lm.weights, lm.engine_options(  # the plan serving runs
        dtype=getattr(torch, model.dtype), max_model_len=max_len, num_blocks=blocks, cuda_graphs=False))


def lockstep(small, large, prompts: list[list[int]], inputs: tuple, max_tokens: int, batch: int,
             stop: set[int], decide: Callable | str | None = None, desc: str = "label",
             progress: bool = True) -> tuple[Rows, Rollout]:
    """Step both engines over `prompts` in batches; rows of every position, and the text."""
    needs = input_needs(inputs)
    out: dict[str, list[torch.Tensor]] = {k: [] for k in Rows.__dataclass_fields__}
    roll = Rollout([[] for _ in prompts], [[] for _ in prompts])
    bar = tqdm(total=len(prompts) * max_tokens, desc=desc, unit="tok", disable=not progress, leave=False)
    base = 1 << 40
    try:
        for start in range(0, len(prompts), batch):
            idx = list(range(start, min(start + batch, len(prompts))))
            sids = {i: base + i for i in idx}
            feed = {i: list(prompts[i]) for i in idx}
            alive = list(idx)
            for t in range(max_tokens):
                batch_in = [(sids[i], feed[i]) for i in alive]
                so = small.step(batch_in, needs)
                lo = large.step(batch_in)
                ls, ll = so.logits.float(), lo.logits.float()
                tok_s, tok_l = ls.argmax(-1), ll.argmax(-1)
                emb = small.embed(tok_s).float() if needs.token_embedding else None
                hidden = {k: v.float() for k, v in so.hidden.items()}
                x = assemble(inputs, ls, hidden, emb)
                lps, lpl = torch.log_softmax(ls, -1), torch.log_softmax(ll, -1)
                if decide is None:
                    route = torch.zeros(len(alive), dtype=torch.bool)
                elif decide == ALWAYS:
                    route = torch.ones(len(alive), dtype=torch.bool)
                else:
                    route = decide(x, ls).bool()
                out["x"].append(x)
                out["small_tok"].append(tok_s)
                out["large_tok"].append(tok_l)
                out["p_small_of_large"].append(lps.gather(1, tok_l[:, None])[:, 0].exp())
                out["p_large_top"].append(lpl.gather(1, tok_l[:, None])[:, 0].exp())
                out["entropy"].append(entropy(lps))
                out["prompt"].append(torch.tensor(alive))
                out["position"].append(torch.full((len(alive),), t))
                chosen = torch.where(route, tok_l, tok_s).tolist()
                still = []
                for j, i in enumerate(alive):
                    roll.tokens[i].append(chosen[j])
                    roll.routed[i].append(bool(route[j]))
                    feed[i] = [chosen[j]]
                    if chosen[j] not in stop:
                        still.append(i)
                bar.update(len(alive))
                alive = still
                if not alive:
                    break
            bar.update(sum(max_tokens - len(roll.tokens[i]) for i in idx))
            for i in idx:
                small.free(sids[i])
                large.free(sids[i])
    finally:
        bar.close()
    rows = Rows(**{k: torch.cat(v) if v else torch.zeros(0) for k, v in out.items()})
    return rows, roll


# ------------------------------------------------------------------ a cache of passes

CACHE_VERSION = 1


def cache_dir() -> str:
    return os.path.join(cache_root(), "fit")


def cache_key(**parts) -> str:
    blob = json.dumps({"version": CACHE_VERSION, **parts}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:24]


def _layout_names(layout: str) -> list[str]:
    return layout.split(",")


def cached_lockstep(key: str | None, layout: str, *args, **kwargs) -> tuple[Rows, Rollout]:
    """`lockstep`, remembered on disk (safetensors for the rows, JSON for the text; written
    atomically). A pass is a pure function of the models, the prompt token ids, the length
    and the decisions, which `key` names, and of the input layout: a pass cached for a
    layout that begins with this one (R2R's `hidden(-1), token_embedding, topk_logits(100)`
    begins with CITER's `hidden(-1)`) serves it by slicing its columns."""
    if key is None:
        return lockstep(*args, **kwargs)
    folder = cache_dir()
    index_path = os.path.join(folder, key + ".layouts.json")
    index = {}
    if os.path.isfile(index_path):
        with open(index_path) as f:
            index = json.load(f)
    ours = _layout_names(layout)
    for theirs, stem in sorted(index.items(), key=lambda kv: len(kv[0])):
        names = _layout_names(theirs)
        if names[: len(ours)] != ours:
            continue
        rows_path, text_path = os.path.join(folder, stem + ".safetensors"), os.path.join(folder, stem + ".json")
        if not (os.path.isfile(rows_path) and os.path.isfile(text_path)):
            continue
        t = load_file(rows_path)
        width = sum(int(n.rpartition(":")[2]) for n in ours)
        t["x"] = t["x"][:, :width].contiguous()
        with open(text_path) as f:
            roll = json.load(f)
        return Rows(**{k: t[k] for k in Rows.__dataclass_fields__}), Rollout(roll["tokens"], roll["routed"])
    rows, roll = lockstep(*args, **kwargs)
    os.makedirs(folder, exist_ok=True)
    stem = key + "-" + hashlib.sha256(layout.encode()).hexdigest()[:12]
    for path, write in ((os.path.join(folder, stem + ".safetensors"),
                         lambda p: save_file({k: getattr(rows, k).contiguous() for k in Rows.__dataclass_fields__}, p)),
                        (os.path.join(folder, stem + ".json"),
                         lambda p: open(p, "w").write(json.dumps({"tokens": roll.tokens, "routed": roll.routed}))),
                        (index_path, lambda p: open(p, "w").write(json.dumps({**index, layout: stem})))):
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-")
        os.close(fd)
        write(tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    return rows, roll
