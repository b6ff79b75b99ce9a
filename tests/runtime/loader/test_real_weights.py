"""The embedded SmolLM2 model end to end: our dequantised weights in our engine give the same
logits as transformers' LlamaForCausalLM on the same weights (prefill, then decode), and the
derived small model loads and runs."""

import pytest
import torch

from tokenrouter.runtime.engine.engine import Engine
from tokenrouter.runtime.engine.options import EngineOptions
from tokenrouter.runtime.loader import BUILTIN_MODELS, load_model
from tokenrouter.runtime.loader.builtin.bench_pair import SHAPES
from tokenrouter.runtime.loader.builtin.derive import SMALL_RECIPE, subset_layers
from tokenrouter.runtime.loader.hf import parse_config

pytestmark = pytest.mark.real_weights


@pytest.fixture(scope="module")
def smollm():
    return load_model("smollm2-135m")


def _hf_model(m):
    from transformers import LlamaConfig, LlamaForCausalLM
    model = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in m.raw_config.items() if k != "architectures"}))
    missing, unexpected = model.load_state_dict(m.weights, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    model.tie_weights()
    return model.eval()


@pytest.mark.slow
def test_engine_matches_transformers_on_smollm2(smollm):
    ids = smollm.tokenizer.encode(smollm.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Name three colours."}]), add_special_tokens=False)
    ref = _hf_model(smollm)
    with torch.no_grad():
        ref_logits = ref(torch.tensor([ids + [330, 2887]])).logits[0]
    eng = Engine(smollm.config, smollm.weights, EngineOptions(num_blocks=16, max_model_len=256))
    prefill = eng.step([("a", ids)]).logits[0]
    dec1 = eng.step([("a", [330])]).logits[0]
    dec2 = eng.step([("a", [2887])]).logits[0]
    for got, want in ((prefill, ref_logits[len(ids) - 1]), (dec1, ref_logits[len(ids)]),
                      (dec2, ref_logits[len(ids) + 1])):
        assert (got - want).abs().max().item() < 2e-3 * want.abs().max().item()
        assert int(got.argmax()) == int(want.argmax())


@pytest.mark.slow
def test_builtin_small_model_is_the_chosen_layer_subset(smollm):
    small = load_model("smollm2-135m-small")
    keep = SMALL_RECIPE["keep_layers"]
    assert small.config.num_hidden_layers == len(keep) < smollm.config.num_hidden_layers
    assert small.tokenizer.fingerprint == smollm.tokenizer.fingerprint
    for new, old in enumerate(keep):
        name = "model.layers.{}.mlp.down_proj.weight"
        assert torch.equal(small.weights[name.format(new)], smollm.weights[name.format(old)])
    assert BUILTIN_MODELS["smollm2-135m-small"].is_cached()
    # the fitted lens: an untied head that is E @ M for some M (rank <= hidden), not E itself
    assert not small.config.tie_word_embeddings
    head, embed = small.weights["lm_head.weight"], smollm.weights["model.embed_tokens.weight"]
    m = torch.linalg.lstsq(embed.double(), head.double()).solution
    assert torch.allclose(embed.double() @ m, head.double(), atol=1e-4)
    assert not torch.allclose(head, embed, atol=1e-3)
    # the lens is what makes it a model: teacher-forced on the large model's greedy answers it
    # picks the large model's token more often than the same 6 layers read by the plain head
    tok = smollm.tokenizer
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": q}]), add_special_tokens=False)
               for q in ("What is the capital of France?", "Name a fruit that is yellow.",
                         "How many days are in a week?", "What colour is the sky on a clear day?")]
    large_eng = Engine(smollm.config, smollm.weights, EngineOptions(num_blocks=64, max_model_len=128))
    plain_cfg, plain_w = subset_layers(smollm.raw_config, smollm.weights, keep)
    engines = {"lens": Engine(small.config, small.weights, EngineOptions(num_blocks=64, max_model_len=128)),
               "plain": Engine(parse_config(plain_cfg, "plain"), plain_w,
                               EngineOptions(num_blocks=64, max_model_len=128))}
    hits = {"lens": 0, "plain": 0}
    batch = [(i, p) for i, p in enumerate(prompts)]
    for _ in range(16):
        want = large_eng.step(batch).logits.argmax(-1)
        for name, eng in engines.items():
            hits[name] += int((eng.step(batch).logits.argmax(-1) == want).sum())
        batch = [(i, [int(t)]) for i, t in enumerate(want)]
    assert hits["lens"] >= 0.1 * 64 and hits["lens"] > hits["plain"], hits  # measured: 9 vs 5 of 64


def test_bench_small_builds_with_the_smollm2_tokenizer(smollm):
    m = load_model("bench-small")
    assert m.config.architecture == "qwen3" and m.config.hidden_size == SHAPES["small"]["hidden_size"]
    assert m.tokenizer.fingerprint == smollm.tokenizer.fingerprint
    assert load_model("bench-small").weights["model.norm.weight"].equal(m.weights["model.norm.weight"])
