"""Hugging Face checkpoint folders: weights and config come back as saved; bad folders give
one clear error each."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.helpers.checkpoints import FAMILIES, engine_weights, hf_config, transformers_model, write_hf_folder
from tokenrouter.runtime.loader import (LoadError, MissingFile, ShapeMismatch, UnsupportedArchitecture,
                                        load_model)


@pytest.mark.parametrize("family", FAMILIES)
def test_folder_loads_weights_config_and_tokenizer(family, tmp_path):
    config = hf_config(family, tie=family != "qwen2")
    model = transformers_model(config, seed=4)
    write_hf_folder(str(tmp_path), model, config)
    m = load_model(str(tmp_path), dtype=torch.float64)
    expected = engine_weights(model)
    assert set(m.weights) == set(expected)
    for name, w in expected.items():
        assert m.weights[name].dtype == torch.float64
        assert torch.equal(m.weights[name], w.double()), name
    assert m.config.architecture == family and m.config.qk_norm == (family == "qwen3")
    assert m.tokenizer.decode(m.tokenizer.encode("hello world")) == "hello world"


def test_tied_checkpoint_that_also_saves_lm_head_is_accepted(tmp_path):
    config = hf_config("llama", tie=True)
    model = transformers_model(config)
    write_hf_folder(str(tmp_path), model, config)
    sd = load_file(str(tmp_path / "model.safetensors"))
    sd["lm_head.weight"] = sd["model.embed_tokens.weight"].clone()
    save_file(sd, str(tmp_path / "model.safetensors"))
    assert "lm_head.weight" not in load_model(str(tmp_path)).weights


def test_sharded_weights(tmp_path):
    config = hf_config("qwen3")
    model = transformers_model(config)
    write_hf_folder(str(tmp_path), model, config)
    sd = load_file(str(tmp_path / "model.safetensors"))
    (tmp_path / "model.safetensors").unlink()
    names = sorted(sd)
    save_file({n: sd[n] for n in names[::2]}, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file({n: sd[n] for n in names[1::2]}, str(tmp_path / "model-00002-of-00002.safetensors"))
    assert len(load_model(str(tmp_path)).weights) == len(engine_weights(model))


def _folder(tmp_path, family="llama"):
    config = hf_config(family)
    write_hf_folder(str(tmp_path), transformers_model(config), config)
    return config


def test_shape_mismatch_names_the_tensor(tmp_path):
    config = _folder(tmp_path)
    config["intermediate_size"] = 128
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ShapeMismatch, match=r"model.layers.0.mlp.gate_proj.weight has shape \[96, 64\] .* \[128, 64\]"):
        load_model(str(tmp_path))


def test_missing_tensor(tmp_path):
    config = _folder(tmp_path)
    config["num_hidden_layers"] = 3
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ShapeMismatch, match="weights missing for model.layers.2"):
        load_model(str(tmp_path))


def test_unsupported_architecture(tmp_path):
    config = _folder(tmp_path)
    config.update(architectures=["GPT2LMHeadModel"], model_type="gpt2")
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedArchitecture, match="GPT2LMHeadModel"):
        load_model(str(tmp_path))


@pytest.mark.parametrize("remove,message", [("config.json", "no config.json"),
                                            ("model.safetensors", "no \\*.safetensors"),
                                            ("tokenizer.json", "no tokenizer.json")])
def test_missing_files(tmp_path, remove, message):
    _folder(tmp_path)
    (tmp_path / remove).unlink()
    with pytest.raises(MissingFile, match=message):
        load_model(str(tmp_path))


def test_bad_json_and_incomplete_config(tmp_path):
    config = _folder(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(LoadError, match="invalid JSON"):
        load_model(str(tmp_path))
    del config["hidden_size"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(LoadError, match="hidden_size"):
        load_model(str(tmp_path))


def test_not_a_model_path(tmp_path):
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(LoadError, match="checkpoint folder or a .gguf"):
        load_model(str(tmp_path / "notes.txt"))
    with pytest.raises(MissingFile, match="built-in name"):
        load_model("no-such-model-name")
