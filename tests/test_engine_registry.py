"""The engines' registry (`tokenrouter/engines.py`): the built-in engines, a name nobody
registered, a broken entry point, and an engine from another distribution: built and
pip-installed by the test, registered through the `tokenrouter.engines` entry point, then
checked, explained and served by `tokenrouter` as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request

import pytest

from tests.helpers.ports import free_port
from tests.helpers.serving import CLI, stop, wait_until_healthy
from tokenrouter import engines
from tokenrouter.compiler import ir
from tokenrouter.compiler.pipeline import check_source, load_program
from tokenrouter.runtime.engine.sampler import SamplingParams
from tokenrouter.runtime.loader import model_facts, program_tokenizer
from tokenrouter.runtime.reference import Reference

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def fresh_registry():
    """The registry reads the entry points again, before and after the test."""
    engines.registered.cache_clear()
    yield
    engines.registered.cache_clear()


def test_the_builtin_engines_and_a_name_nobody_registered():
    assert engines.names()[:2] == ("native", "vllm") and engines.DEFAULT == "native"
    assert engines.capabilities("vllm").tensor_parallel and not engines.capabilities("native").tensor_parallel
    with pytest.raises(engines.UnknownEngine, match="engine 'nope' is not registered.*native, vllm"):
        ir.Model("m", "smollm2-135m", engine="nope")
    program, diags = check_source('tokenrouter 1\nmodel m = "smollm2-135m" { engine = nope }\n'
                                  'route {\n  start m\n}\n', "nope.route")
    assert program is None
    assert any(d.code == "E203" and "'nope' is not a valid engine" in d.message for d in diags), diags


def _dist_info(root, name: str, entry: str) -> None:
    info = os.path.join(root, f"{name}-0.1.dist-info")
    os.makedirs(info)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    with open(os.path.join(info, "entry_points.txt"), "w") as f:
        f.write(f"[{engines.ENTRY_POINTS}]\n{entry}\n")


@pytest.mark.parametrize("entry, message", [
    ("bad = os.path:join", "entry point bad = os.path:join .* is a function, not a tokenrouter.engines.Registration"),
    ("gone = no_such_module:X", "entry point gone = no_such_module:X .* cannot be loaded: ModuleNotFoundError"),
    ("vllm = tokenrouter.engines:BUILTIN", "is a tuple"),
])
def test_a_broken_entry_point_is_a_clear_error(tmp_path, monkeypatch, fresh_registry, entry, message):
    _dist_info(tmp_path, "broken_engine", entry)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(engines.UnknownEngine, match=message):
        engines.names()


def test_an_engine_is_registered_once_under_its_entry_points_name(tmp_path, monkeypatch, fresh_registry):
    (tmp_path / "twice.py").write_text("from tokenrouter import engines\nAGAIN = engines.BUILTIN[1]\n")
    _dist_info(tmp_path, "twice", "vllm = twice:AGAIN")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(engines.UnknownEngine, match="registers 'vllm': an engine is registered once"):
        engines.names()


# ------------------------------------------------------------------ an engine from elsewhere

TOY_INIT = '''
"""A toy engine for tokenrouter: tokenrouter's own engine under another name, which hands a
router only the logits and runs float32 alone."""

from tokenrouter import engines

REGISTRATION = engines.Registration("toy", engines.Capabilities(
    title="the toy engine", summary="tokenrouter's engine, wrapped", devices=("cpu",), dtypes=("float32",),
    quants=("none",), gives=(engines.LOGITS,)), implementation="toy_engine.impl")
'''

TOY_IMPL = '''
"""The toy engine: a `NativeWriter` that writes down each step it takes (in $TOY_ENGINE_LOG)."""

import os

from tokenrouter.runtime import native
from tokenrouter.runtime.native import profile_steps, reference_model  # noqa: F401


class ToyWriter(native.NativeWriter):
    def step(self, reqs):
        with open(os.environ["TOY_ENGINE_LOG"], "a") as f:
            f.write(f"{self.writer} {len(reqs)}\\n")
        return super().step(reqs)


def load_writer(spec, phase_s, models=None):
    loaded = native.load_writer(spec, phase_s, models)
    e = loaded.engine
    loaded.engine = ToyWriter(e.writer, e.members, e.engines, e.router, e.phase_s)
    return loaded
'''

TOY_PYPROJECT = '''
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "tokenrouter-toy-engine"
version = "0.1"

[project.entry-points."tokenrouter.engines"]
toy = "toy_engine:REGISTRATION"

[tool.setuptools]
packages = ["toy_engine"]
'''


def _install_toy(tmp_path) -> str:
    """Build and pip-install the toy engine's distribution into a folder of its own: its path."""
    src, target = tmp_path / "toy-src", tmp_path / "site"
    (src / "toy_engine").mkdir(parents=True)
    (src / "pyproject.toml").write_text(TOY_PYPROJECT)
    (src / "toy_engine" / "__init__.py").write_text(TOY_INIT)
    (src / "toy_engine" / "impl.py").write_text(TOY_IMPL)
    p = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                        "--no-index", "--target", str(target), str(src)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return str(target)


def _route(tmp_path, pair, name: str, llm_attrs: str, router: str = "") -> str:
    path = tmp_path / name
    path.write_text(f'''tokenrouter 1
model slm = "{pair['slm']}"
model llm = "{pair['llm']}" {{ {llm_attrs} }}
{router}
route {{
  start slm
  slm -> llm when entropy(slm, normalized) >= 0.0 rewrite
  llm -> slm when entropy(llm, normalized) >= 0.0 keep
}}
''')
    return str(path)


@pytest.mark.slow  # a pip install and a served program: tens of seconds
def test_an_engine_from_another_distribution_is_checked_explained_and_served(tmp_path, pair):
    site = _install_toy(tmp_path)
    log = tmp_path / "toy-steps.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, site]), "TOY_ENGINE_LOG": str(log)}
    run = lambda *argv: subprocess.run(CLI + list(argv), capture_output=True, text=True, timeout=300,  # noqa: E731
                                       env=env)
    route = _route(tmp_path, pair, "toy.route", "engine = toy")

    checked = run("check", route)
    assert checked.returncode == 0, checked.stderr
    # the checker reads the toy's capabilities: no hidden states, no float64
    bad = run("check", _route(tmp_path, pair, "bad.route", "engine = toy  dtype = float64",
                              'router r on llm = "r.safetensors" { inputs = [hidden(-1)] }'))
    assert bad.returncode == 1
    assert "model 'llm': the toy engine does not run float64" in bad.stderr
    assert "router 'r' reads hidden of 'llm', which the toy engine does not hand out" in bad.stderr
    explained = run("explain", route)
    assert explained.returncode == 0, explained.stderr
    assert "served by the toy engine" in explained.stdout and "engine: the toy engine, on cpu" in explained.stdout

    port = free_port()
    proc = subprocess.Popen(CLI + ["serve", route, "--port", str(port), "--num-blocks", "64", "--max-restarts", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(proc, url, timeout_s=240)
        body = json.dumps({"model": "toy", "prompt": "Hello from another distribution", "max_tokens": 12,
                           "temperature": 0}).encode()
        req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            got = json.load(r)
    finally:
        stop(proc, 30)
    # the same program on tokenrouter's own engine, which the toy wraps: the same tokens
    program = load_program(_route(tmp_path, pair, "native.route", ""), model_facts=model_facts)
    tk = program_tokenizer(program)
    want = Reference(program).generate(tk.encode("Hello from another distribution"),
                                       SamplingParams(max_tokens=12, stop_token_ids=tk.eos_token_ids))
    assert got["choices"][0]["token_ids"] == want.tokens
    assert got["tokens_by_model"] == want.written_by and want.written_by.get("llm", 0) > 0
    steps = log.read_text().split()
    assert steps[0::2] and set(steps[0::2]) == {"llm"}  # the toy stepped the large writer, and only it
