"""The conversion cache: built once, rebuilt when the source changes, safe when two processes
build the same entry at once."""

import os
import subprocess
import sys

import pytest
import torch

from tests.helpers.checkpoints import hf_config, transformers_model, write_gguf
from tokenrouter.runtime.loader import load_model


def _entries(root):
    return sorted(p for p in os.listdir(root))


def test_second_load_reads_the_cache(tmp_path, tmp_cache):
    config = hf_config("qwen2")
    path = str(tmp_path / "m.gguf")
    write_gguf(path, transformers_model(config), config)
    first = load_model(path)
    st = os.stat(os.path.join(first.folder, "model.safetensors"))
    second = load_model(path)
    assert second.folder == first.folder and str(tmp_cache) in first.folder
    assert os.stat(os.path.join(second.folder, "model.safetensors")).st_mtime_ns == st.st_mtime_ns
    assert _entries(tmp_cache) == [os.path.basename(first.folder)]


def test_changed_source_makes_a_new_entry(tmp_path, tmp_cache):
    config = hf_config("llama")
    path = str(tmp_path / "m.gguf")
    write_gguf(path, transformers_model(config, seed=1), config)
    a = load_model(path)
    write_gguf(path, transformers_model(config, seed=2), config)
    os.utime(path, ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns + 10**9))
    b = load_model(path)
    assert a.folder != b.folder
    name = "model.layers.0.mlp.up_proj.weight"
    assert not torch.equal(a.weights[name], b.weights[name])


@pytest.mark.slow
def test_two_processes_building_at_once(tmp_path, tmp_cache):
    config = hf_config("qwen3", layers=4)
    path = str(tmp_path / "m.gguf")
    write_gguf(path, transformers_model(config), config)
    code = ("import sys; from tokenrouter.runtime.loader import load_model; "
            "m = load_model(sys.argv[1]); print(m.folder, sum(float(w.sum()) for w in m.weights.values()))")
    env = dict(os.environ, TOKENROUTER_CACHE=str(tmp_cache))
    procs = [subprocess.Popen([sys.executable, "-c", code, path], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1] for o in outs]
    assert len({o[0] for o in outs}) == 1  # same folder, same weights
    assert len(_entries(tmp_cache)) == 1  # no temporary folders left behind


def test_a_quantised_load_and_the_facts_cache_no_weights(tmp_path, tmp_cache):
    """native, int4, int8 and the compiler's model facts read a GGUF's weights from the file:
    the cache gets one entry without weights (config, tokenizer, the file's identity), a few
    KiB; quant=none adds the float checkpoint."""
    from tokenrouter.compiler.weights.files import folder_fingerprint
    from tokenrouter.runtime.loader import model_facts
    config = hf_config("qwen2", tie=False)
    path = str(tmp_path / "m.gguf")
    write_gguf(path, transformers_model(config, seed=3), config, qtype="Q8_0")
    for quant in ("native", "int4", "int8"):
        assert load_model(path, quant=quant).source == os.path.realpath(path)
    facts = model_facts(path, True)
    assert facts.tokenizer and _entries(tmp_cache) == [os.path.basename(facts.folder)]
    assert sorted(os.listdir(facts.folder)) == ["cache_key.json", "config.json", "derived.json", "tokenizer.json",
                                               "tokenizer_config.json"]
    assert sum(os.path.getsize(os.path.join(facts.folder, f)) for f in os.listdir(facts.folder)) < 64 << 10
    floats = load_model(path)
    assert os.path.isfile(os.path.join(floats.folder, "model.safetensors")) and len(_entries(tmp_cache)) == 2
    # the fingerprint names the file's weights: another file with the same config differs
    other = str(tmp_path / "other" / "m.gguf")
    os.makedirs(os.path.dirname(other))
    write_gguf(other, transformers_model(config, seed=4), config, qtype="Q8_0")
    assert folder_fingerprint(facts.folder) != folder_fingerprint(model_facts(other, True).folder)


@pytest.mark.parametrize("quant", ["int4", "int8"])
def test_int4_and_int8_of_a_gguf_quantise_its_dequantised_values(tmp_path, tmp_cache, quant):
    """Read from the file's blocks and dequantised in memory, the values int4/int8 quantise are
    the float checkpoint's: the same engine, bit for bit (with a float head: by default a
    GGUF's requantised head also rescores its best logits from the file's rows, which a float
    checkpoint has not)."""
    from tokenrouter.runtime.engine.engine import Engine
    from tokenrouter.runtime.engine.options import EngineOptions
    config = hf_config("llama", tie=False)
    path = str(tmp_path / "m.gguf")
    write_gguf(path, transformers_model(config, seed=5), config, qtype="Q8_0")
    opts = EngineOptions(block_size=4, num_blocks=32, max_model_len=64, quant=quant, kernel_plan="onednn",
                         head_quant="none")
    from_file = Engine(*(lambda m: (m.config, m.weights))(load_model(path, quant=quant)), opts)
    from_floats = Engine(*(lambda m: (m.config, m.weights))(load_model(path)), opts)
    batch = [(0, [3, 4, 5, 6]), (1, [9, 8])]
    assert torch.equal(from_file.step(batch).logits, from_floats.step(batch).logits)
