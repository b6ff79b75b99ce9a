"""Logits agree with Hugging Face `transformers` for every family, however a sequence is split."""

from __future__ import annotations

import random

import pytest
import torch

from tokenrouter.protocol.step import FeatureNeeds
from tokenrouter.runtime.engine.engine import Engine
from tokenrouter.runtime.engine.options import EngineOptions

from tests.helpers.hf_parity import FAMILIES, hf_logits


def _splits(rng: random.Random, n: int) -> list[int]:
    """Random piece lengths summing to n: a prefill, some extends and decodes."""
    pieces, left = [], n
    while left:
        k = min(left, rng.choice([1, 1, 2, 3, 5, 9, 17, 30]))
        pieces.append(k)
        left -= k
    return pieces


@pytest.mark.parametrize("family", FAMILIES)
def test_any_split_matches_one_full_prefill_float64(tiny, family):
    model, cfg, sd = tiny(family)
    rng = random.Random(family)
    tokens = [rng.randrange(cfg.vocab_size) for _ in range(70)]
    ref = hf_logits(model, tokens)
    eng = Engine(cfg, sd, EngineOptions(dtype=torch.float64, block_size=4, num_blocks=64))
    for trial in range(3):
        sid = f"s{trial}"
        pos = 0
        for k in ([70] if trial == 0 else _splits(rng, 70)):
            out = eng.step([(sid, tokens[pos:pos + k])])
            pos += k
            torch.testing.assert_close(out.logits[0], ref[pos - 1], rtol=0, atol=1e-10)
        assert eng.seq_len(sid) == 70
        eng.free(sid)
    assert eng.blocks_used == 0


@pytest.mark.parametrize("family", FAMILIES)
def test_decode_after_prefill_float32_greedy_matches(tiny, family):
    """float32 engine vs the float64 reference: tight tolerance and identical greedy tokens."""
    model, cfg, sd = tiny(family)
    eng = Engine(cfg, {k: v.float() for k, v in sd.items()},
                 EngineOptions(dtype=torch.float32, block_size=8, num_blocks=32))
    tokens = list(range(3, 15))
    out = eng.step([("a", tokens)])
    for _ in range(20):
        nxt = int(out.logits[0].argmax())
        ref = hf_logits(model, tokens)[-1]
        torch.testing.assert_close(out.logits[0].double(), ref, rtol=0, atol=2e-4)
        assert nxt == int(ref.argmax())
        tokens.append(nxt)
        out = eng.step([("a", [nxt])])


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_hidden_states_match_transformers(tiny, family):
    model, cfg, sd = tiny(family)
    n = cfg.num_hidden_layers
    tokens = [5, 9, 2, 33, 7, 1, 60]
    captured = {}
    hook = model.model.layers[-1].register_forward_hook(
        lambda mod, args, out: captured.__setitem__("pre_norm", out[0] if isinstance(out, tuple) else out))
    with torch.no_grad():
        hf = model(torch.tensor([tokens]), output_hidden_states=True)
    hook.remove()
    eng = Engine(cfg, sd, EngineOptions(dtype=torch.float64, block_size=4, num_blocks=16))
    needs = FeatureNeeds(hidden_layers=tuple(range(n + 1)) + (-1,))
    eng.step([("a", tokens[:4])], needs)
    out = eng.step([("a", tokens[4:])], needs)
    for layer in range(n):  # HF: hidden_states[i] is the input of layer i (0 = embeddings)
        torch.testing.assert_close(out.hidden[layer][0], hf.hidden_states[layer][0, -1], rtol=0, atol=1e-10)
    torch.testing.assert_close(out.hidden[n][0], captured["pre_norm"].reshape(len(tokens), -1)[-1],
                               rtol=0, atol=1e-10)
    torch.testing.assert_close(out.hidden[-1][0], hf.hidden_states[-1][0, -1], rtol=0, atol=1e-10)
    torch.testing.assert_close(eng.embed(torch.tensor([9, 60])), sd["model.embed_tokens.weight"][[9, 60]])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("family", FAMILIES)
def test_cuda_float64_matches_the_cpu_float64_engine(tiny, family):
    """`device = cuda` in float64: the CPU engine's logits to 1e-10 over prefill, extends and decodes."""
    _, cfg, sd = tiny(family)
    rng = random.Random(family)
    tokens = [rng.randrange(cfg.vocab_size) for _ in range(60)]
    kw = dict(dtype=torch.float64, block_size=4, num_blocks=64)
    cpu, gpu = Engine(cfg, sd, EngineOptions(**kw)), Engine(cfg, sd, EngineOptions(device="cuda", **kw))
    pos = 0
    for k in [20] + _splits(rng, 40):
        a, b = cpu.step([("s", tokens[pos:pos + k])]), gpu.step([("s", tokens[pos:pos + k])])
        pos += k
        torch.testing.assert_close(b.logits.cpu(), a.logits, rtol=0, atol=1e-10)
