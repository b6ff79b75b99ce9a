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
