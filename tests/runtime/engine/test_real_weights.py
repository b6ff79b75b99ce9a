"""The default large model (SmolLM2-135M-Instruct) in our engine against `transformers`, in
float64 (tight) and float32 (greedy tokens identical), with the sequence split into pieces."""

from __future__ import annotations

import pytest
import torch

from tokenrouter.runtime.engine.engine import Engine
from tokenrouter.runtime.engine.options import EngineOptions
from tokenrouter.runtime.loader import load_model

from tests.helpers.hf_parity import rms_norm_f64

pytestmark = pytest.mark.real_weights


@pytest.fixture(scope="module")
def smollm():
    m = load_model("smollm2-135m")
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(**{k: v for k, v in m.raw_config.items() if k != "architectures"})
    cfg._attn_implementation = "sdpa"
    hf = LlamaForCausalLM(cfg)
    missing, unexpected = hf.load_state_dict(m.weights, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    hf.tie_weights()
    hf = hf.double().eval()
    for mod in hf.modules():
        if type(mod).__name__.endswith("RMSNorm"):
            mod.forward = rms_norm_f64.__get__(mod)
    ids = m.tokenizer.encode(m.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}]), add_special_tokens=False)
    return m, hf, ids


def test_float64_pieces_match_one_full_forward(smollm):
    m, hf, ids = smollm
    toks = ids + [504, 3575, 282, 4649, 314, 7042, 30]
    with torch.no_grad():
        ref = hf(torch.tensor([toks])).logits[0]
    eng = Engine(m.config, {k: v.double() for k, v in m.weights.items()},
                 EngineOptions(dtype=torch.float64, num_blocks=16, max_model_len=256))
    n = len(ids)
    pos = 0
    for k in (n - 3, 3, 1, 2, 1, 1, 1, 1):  # prefill, extend, decode, extend, decodes
        out = eng.step([("a", toks[pos:pos + k])]).logits[0]
        pos += k
        torch.testing.assert_close(out, ref[pos - 1], rtol=0, atol=1e-8)
    assert pos == len(toks)


def test_float32_greedy_generation_matches(smollm):
    m, hf, ids = smollm
    eng = Engine(m.config, m.weights, EngineOptions(dtype=torch.float32, num_blocks=16, max_model_len=256))
    out = eng.step([("a", ids), ("b", ids[:-4])])  # two requests in one batch
    gen = {"a": [], "b": []}
    for _ in range(12):
        nxt = out.logits.argmax(-1).tolist()
        gen["a"].append(nxt[0])
        gen["b"].append(nxt[1])
        out = eng.step([("a", [nxt[0]]), ("b", [nxt[1]])])
    for sid, prompt in (("a", ids), ("b", ids[:-4])):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
                              pad_token_id=0)[0, len(prompt):].tolist()
        assert len(ref) == 12 or ref[-1] in m.config.eos_token_ids  # HF stops at end-of-sequence
        assert len(ref) >= 5 and gen[sid][:len(ref)] == ref
