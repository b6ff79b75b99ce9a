"""The results tables in README.md, benchmarks/README.md and docs/ are what
scripts/results_tables.py makes of the committed result JSON files: none is edited by hand,
none drifts from its JSON."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "results_tables.py"


def _script():
    spec = importlib.util.spec_from_file_location("results_tables", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module", autouse=True)
def _git_checkout():
    # a JSON file without a recorded date is dated by its last commit
    if subprocess.run(["git", "rev-parse", "--git-dir"], cwd=ROOT, capture_output=True).returncode:
        pytest.skip("not a git checkout")


def test_every_committed_table_is_what_the_script_makes_of_the_committed_json():
    r = subprocess.run([sys.executable, str(SCRIPT), "--check"], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, ("a results table differs from what its JSON gives: run "
                               f".venv/bin/python scripts/results_tables.py\n{r.stdout}{r.stderr}")


def test_a_figure_edited_by_hand_is_remade_and_an_unknown_table_is_an_error():
    rt = _script()
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    row = next(line for line in readme.splitlines() if line.startswith("| tokenrouter | "))
    edited = readme.replace(row, row.replace("| tokenrouter | ", "| tokenrouter | 9"), 1)
    assert edited != readme and rt.remade(edited, ROOT / "README.md", {}) == readme
    with pytest.raises(SystemExit, match="no table named 'nope'"):
        rt.remade("<!-- table: nope -->\n<!-- /table -->\n", ROOT / "README.md", {})


def test_a_table_over_several_runs_refuses_runs_from_different_hosts():
    rt = _script()
    with pytest.raises(SystemExit, match="one table holds one host"):
        rt.same_host([{"host": {"cpu": "AMD EPYC", "cores": 2}}, {"host": {"cpu": "Intel Xeon", "cores": 2}}],
                     ["a.json", "b.json"])


def test_a_rerun_command_uses_the_venv_and_the_scratch_folder():
    rt = _script()
    assert rt.rerun("tokenrouter bench --quick --out benchmarks/results/bench/quick --no-progress") == \
        ".venv/bin/tokenrouter bench --quick"
    assert rt.rerun("python benchmarks/bench_quant.py --rounds 2") == ".venv/bin/python benchmarks/bench_quant.py --rounds 2"


def test_a_llama_cpp_build_is_named_by_the_instruction_sets_its_system_info_turns_on():
    rt = _script()
    wheel = "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | LLAMAFILE = 1 | " \
            "OPENMP = 1 | REPACK = 1 | "
    assert rt.built_with(wheel) == ["SSE3", "SSSE3", "AVX", "AVX2", "F16C", "FMA", "BMI2", "LLAMAFILE"]
    native = "system_info: n_threads = 2 (n_threads_batch = 2) / 2 | CPU : AVX2 = 1 | AVX512 = 1 | " \
             "AVX512_VNNI = 1 | AVX512_BF16 = 0 | AMX_INT8 = 0 | OPENMP = 1 |"
    assert rt.built_with(native) == ["AVX2", "AVX512", "AVX512_VNNI"]
    assert rt.built_with(None) == []
