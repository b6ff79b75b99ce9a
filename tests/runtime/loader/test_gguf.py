"""GGUF files of each family, written as llama.cpp's converter writes them, load back to the
Hugging Face weights: exactly for F32, to the quantisation's own dequantisation otherwise."""

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize

from tests.helpers.checkpoints import FAMILIES, engine_weights, hf_config, transformers_model, write_gguf
from tokenrouter.runtime.loader import (LoadError, MissingFile, UnsupportedArchitecture,
                                        UnsupportedQuantization, load_model)
from tokenrouter.runtime.loader.gguf_loader import unpermute, permute_rows


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("tie", [True, False])
def test_f32_gguf_round_trips_exactly(family, tie, tmp_path, tmp_cache):
    config = hf_config(family, tie=tie)
    model = transformers_model(config, seed=1)
    path = str(tmp_path / "m.gguf")
    write_gguf(path, model, config)
    m = load_model(path)
    expected = engine_weights(model)
    assert set(m.weights) == set(expected)
    for name, w in expected.items():
        assert torch.equal(m.weights[name], w), name
    c = m.config
    assert (c.architecture, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
            c.tie_word_embeddings, c.qk_norm, c.attention_bias) == \
        (family, 2, 4, 2, 16, tie, family == "qwen3", family == "qwen2")
    assert c.rope_theta == 10000.0 and abs(c.rms_norm_eps - 1e-5) < 1e-9
    assert m.tokenizer.eos_token_ids == (2,)
    assert m.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}]) == \
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_quantised_gguf_matches_its_dequantisation(tmp_path, tmp_cache):
    config = hf_config("llama")
    model = transformers_model(config, seed=2)
    path = str(tmp_path / "q.gguf")
    write_gguf(path, model, config, qtype="Q8_0")
    m = load_model(path)
    w = model.state_dict()["model.layers.1.mlp.down_proj.weight"].numpy()
    expected = dequantize(quantize(w, Q.Q8_0), Q.Q8_0)
    assert np.array_equal(m.weights["model.layers.1.mlp.down_proj.weight"].numpy(), expected)
    # q rows come back un-permuted: close to the original, not merely to a permutation of it
    q = model.state_dict()["model.layers.0.self_attn.q_proj.weight"]
    assert (m.weights["model.layers.0.self_attn.q_proj.weight"] - q).abs().max() < 0.01 * q.abs().max()


def test_unpermute_inverts_the_converter_permutation():
    w = torch.arange(8 * 3 * 5, dtype=torch.float32).reshape(24, 5)
    assert torch.equal(unpermute(permute_rows(w, 3), 3), w)
    assert not torch.equal(permute_rows(w, 3), w)


def test_transformers_reads_our_test_gguf_the_same_way(tmp_path, tmp_cache):
    """transformers' own GGUF reader (an independent un-permutation) agrees with ours."""
    pytest.importorskip("accelerate")
    from transformers import AutoModelForCausalLM
    config = hf_config("llama", tie=False)
    model = transformers_model(config, seed=3)
    write_gguf(str(tmp_path / "t.gguf"), model, config)
    ref = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="t.gguf", dtype=torch.float32)
    ours = load_model(str(tmp_path / "t.gguf"))
    ref_sd = ref.state_dict()
    for name, w in ours.weights.items():
        assert torch.equal(w, ref_sd[name]), name


def test_unsupported_quantisation_is_a_clear_error(tmp_path, tmp_cache):
    config = hf_config("llama")
    model = transformers_model(config)
    path = str(tmp_path / "odd.gguf")
    write_gguf(path, model, config, odd_tensor="model.layers.0.mlp.up_proj.weight")
    with pytest.raises(UnsupportedQuantization, match="blk.0.ffn_up.weight.*I32"):
        load_model(path)


def test_unsupported_architecture_is_a_clear_error(tmp_path, tmp_cache):
    config = hf_config("llama")
    path = str(tmp_path / "phi.gguf")
    write_gguf(path, transformers_model(config), config, arch="phi3")
    with pytest.raises(UnsupportedArchitecture, match="'phi3'"):
        load_model(path)


def test_sentencepiece_gguf_tokenizer_is_a_clear_error(tmp_path, tmp_cache):
    config = hf_config("llama")
    path = str(tmp_path / "spm.gguf")
    write_gguf(path, transformers_model(config), config, tokenizer_model="llama")
    with pytest.raises(UnsupportedArchitecture, match="tokenizer model 'llama'"):
        load_model(path)


def test_missing_and_garbage_files(tmp_path, tmp_cache):
    with pytest.raises(MissingFile, match="no such model"):
        load_model(str(tmp_path / "nope.gguf"))
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf at all" * 10)
    with pytest.raises(LoadError, match="not a readable GGUF"):
        load_model(str(bad))


@pytest.mark.parametrize("qtype", ["F32", "Q8_0", "Q4_K_M"])
def test_the_header_reader_gives_what_the_gguf_package_reads(tmp_path, qtype):
    """`gguf_file.read_header` (one pass over the header) against the `gguf` package's reader:
    the same metadata values and the same tensors, types, shapes and data offsets."""
    import gguf

    from tokenrouter.runtime.loader.gguf_file import read_header
    config = {**hf_config("qwen2", tie=False), "hidden_size": 256, "intermediate_size": 512, "head_dim": 64}
    path = str(tmp_path / "m.gguf")
    write_gguf(path, transformers_model(config, seed=4), config, qtype=qtype)
    meta, tensors = read_header(path)
    reader = gguf.GGUFReader(path)
    assert meta == {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert [(t.name, t.kind, t.shape, t.offset, t.nbytes) for t in tensors] == \
        [(t.name, t.tensor_type.name, tuple(int(d) for d in t.shape), t.data_offset, t.n_bytes) for t in reader.tensors]
    data = open(path, "rb").read()
    (tmp_path / "cut.gguf").write_bytes(data[:len(data) - 100])
    with pytest.raises(LoadError, match="runs past the end of the file"):
        read_header(str(tmp_path / "cut.gguf"))
    (tmp_path / "head.gguf").write_bytes(data[:3000])
    with pytest.raises(LoadError, match="not a readable GGUF"):
        read_header(str(tmp_path / "head.gguf"))
