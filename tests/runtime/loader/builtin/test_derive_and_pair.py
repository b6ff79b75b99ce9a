"""The derived small model is exactly the large model cut after k layers (checked against
transformers' own hidden states), and the benchmark pair is deterministic and well-formed."""

import pytest
import torch

from tests.helpers.checkpoints import hf_config, tiny_tokenizer_json, transformers_model
from tokenrouter.runtime.loader import LoadError, Tokenizer
from tokenrouter.runtime.loader.builtin.bench_pair import SHAPES, bench_config, random_weights
from tokenrouter.runtime.loader.builtin.derive import apply_lens, derive_small, fit_lens, subset_layers
from tokenrouter.runtime.loader.hf import check_weights, parse_config


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_early_exit_equals_the_large_models_hidden_state_through_norm_and_head(family):
    config = hf_config(family, layers=4)
    large = transformers_model(config, seed=5, dtype=torch.float64)
    weights = {k: v for k, v in large.state_dict().items() if k != "lm_head.weight"}
    small_cfg, small_w = subset_layers(config, weights, [0, 1])
    small = transformers_model(small_cfg, dtype=torch.float64)
    small.load_state_dict(small_w, strict=False)
    small.tie_weights()
    ids = torch.tensor([[5, 17, 200, 42, 99, 3]])
    with torch.no_grad():
        hs = large(ids, output_hidden_states=True).hidden_states[2]  # after layer index 1
        expected = large.lm_head(large.model.norm(hs))
        got = small(ids).logits
    assert torch.allclose(got, expected, rtol=0, atol=1e-12)


def test_lens_folds_into_an_untied_head():
    """With M = diag(final norm weight) the fitted-lens model is exactly plain early exit."""
    config = hf_config("llama", layers=3)
    large = transformers_model(config, seed=6, dtype=torch.float64)
    weights = {k: v for k, v in large.state_dict().items() if k != "lm_head.weight"}
    cfg, w = subset_layers(config, weights, [0, 1])
    lens_cfg, lens_w = apply_lens(cfg, w, torch.diag(weights["model.norm.weight"]))
    assert lens_cfg["tie_word_embeddings"] is False and torch.equal(lens_w["model.norm.weight"],
                                                                    torch.ones(64, dtype=torch.float64))
    plain, lensed = transformers_model(cfg, dtype=torch.float64), transformers_model(lens_cfg, dtype=torch.float64)
    plain.load_state_dict(w, strict=False)
    plain.tie_weights()
    lensed.load_state_dict(lens_w)
    ids = torch.tensor([[1, 50, 60, 70]])
    with torch.no_grad():
        assert torch.allclose(plain(ids).logits, lensed(ids).logits, rtol=0, atol=1e-12)


def test_fit_lens_recovers_a_linear_map():
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(16, 16, generator=gen, dtype=torch.float64)
    x = torch.randn(500, 16, generator=gen, dtype=torch.float64)
    m = fit_lens(x, x @ a.T, ridge=1e-9)
    assert torch.allclose(m, a, atol=1e-5)


def test_derive_small_end_to_end_is_deterministic(tmp_path):
    tiny_tokenizer_json(str(tmp_path))
    tok = Tokenizer.from_dir(str(tmp_path))
    config = hf_config("qwen2", layers=3)
    weights = {k: v for k, v in transformers_model(config, seed=9).state_dict().items() if k != "lm_head.weight"}
    recipe = {"keep_layers": [0], "lens": "ridge", "ridge": 0.05, "fit_prompts": 3, "fit_tokens": 4, "seed": 1}
    c1, w1 = derive_small(config, weights, tok, recipe)
    c2, w2 = derive_small(config, weights, tok, recipe)
    assert c1 == c2 and c1["num_hidden_layers"] == 1 and not c1["tie_word_embeddings"]
    assert all(torch.equal(w1[k], w2[k]) for k in w1)
    check_weights(parse_config(c1, "small"), w1, "small")


def test_subset_renumbers_and_checks():
    config = hf_config("llama", layers=4)
    weights = {k: v for k, v in transformers_model(config).state_dict().items() if k != "lm_head.weight"}
    cfg, w = subset_layers(config, weights, [0, 3])
    check_weights(parse_config(cfg, "test"), w, "test")  # complete and well-shaped
    assert torch.equal(w["model.layers.1.mlp.up_proj.weight"], weights["model.layers.3.mlp.up_proj.weight"])
    assert cfg["num_hidden_layers"] == 2 and config["num_hidden_layers"] == 4
    with pytest.raises(LoadError, match="not within"):
        subset_layers(config, weights, [0, 4])


def test_bench_pair_weights_are_deterministic_and_complete():
    small = {**bench_config("small"), "num_hidden_layers": 1}  # one layer keeps the test fast
    a, b = random_weights(small, 7), random_weights(small, 7)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.embed_tokens.weight"], random_weights(small, 8)["model.embed_tokens.weight"])
    check_weights(parse_config(small, "bench"), a, "bench")
    assert SHAPES["small"]["hidden_size"] < SHAPES["large"]["hidden_size"]
    assert bench_config("small")["vocab_size"] == bench_config("large")["vocab_size"] == 49152
