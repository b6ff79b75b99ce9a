"""Where vLLM cannot be imported, serving a program with a writer on vLLM says in one line
which extra to install, and starts nothing; checking it needs no vLLM. (The Python run
here has vLLM's import blocked, as on a host without the extra.)"""

import os
import subprocess
import sys

import pytest

from tests.helpers import tiny
from tests.helpers import vllm as vh

pytestmark = pytest.mark.slow  # a subprocess that imports the CLI: seconds

BLOCKED = "import sys; sys.modules['vllm'] = None; from tokenrouter.cli import main; sys.exit(main())"


def _route(tmp_path, pair) -> str:
    llm = vh.write_model(str(tmp_path / "llm"), seed=5)
    path = tmp_path / "p.route"
    path.write_text(f'''tokenrouter 1
model slm = "{pair['slm']}"
model llm = "{llm}" {{ engine = vllm }}
route {{
  start slm
  slm -> llm when entropy(slm, normalized) > 0.3 rewrite
  llm -> slm when entropy(llm, normalized) <= 0.3 keep
}}
''')
    return str(path)


def _run(*argv):
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    return subprocess.run([sys.executable, "-c", BLOCKED, *argv], capture_output=True, text=True, timeout=120,
                          env=env)


def test_serve_without_vllm_names_the_extra(tmp_path, pair):
    route = _route(tmp_path, pair)
    p = _run("serve", route, "--port", "0")
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip().splitlines() == [
        'error: a writer served by vLLM (engine = vllm) needs the "vllm" extra (vllm is not installed): '
        'pip install "tokenrouter[vllm]"']
    assert _run("check", route).returncode == 0  # checking a program needs no engine
