"""The wheel is a complete installation: built from the tracked sources, installed into a
fresh virtual environment with no source tree on the path, `tokenrouter check` and
`tokenrouter compile` work on an example (the grammar ships inside the package), and
`tokenrouter generate` serves a request on the embedded model, so the engine's C kernels are
built from the installed sources alone (headers included) into an empty cache.

The fresh environment gets the wheel only (`--no-deps`); its dependencies (lark, jinja2,
torch, ...) come from the test's own environment through a path file, so the test needs no
network and stays fast.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # every test here takes seconds: the fast tier (-m "not slow") skips them

REPO = Path(__file__).resolve().parents[2]


def _tracked_tree(dest: Path) -> None:
    """Copy the files git tracks (plus untracked, not ignored ones): what a clone would hold."""
    listing = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO, check=True, capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, listing):
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


@pytest.mark.slow
@pytest.mark.real_weights
@pytest.mark.timeout(900)
def test_wheel_installs_checks_an_example_and_generates(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("git is needed to list the tracked sources")
    src = tmp_path / "src"
    _tracked_tree(src)
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(wheels), str(src)], check=True, capture_output=True, timeout=200)
    (wheel,) = wheels.glob("tokenrouter-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "tokenrouter/grammars/route.lark" in names
    csrc = sorted(p.name for p in (REPO / "tokenrouter" / "runtime" / "kernels" / "csrc").iterdir() if p.is_file())
    assert {f"tokenrouter/runtime/kernels/csrc/{n}" for n in csrc} <= set(names)  # every file the kernels build from
    assert not any(n.startswith(("tests/", "grammars/")) for n in names)

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                    "--no-index", str(wheel)], check=True, capture_output=True, timeout=120)
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    # Dependencies from this environment, appended after the wheel's own site-packages.
    deps = sysconfig.get_paths()["purelib"]
    Path(site, "zz_test_deps.pth").write_text(deps + "\n")

    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(REPO / "examples" / "rstitch.route", work / "rstitch.route")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["TOKENROUTER_CACHE"] = str(tmp_path / "cache")
    where = subprocess.run([str(python), "-c", "import tokenrouter; print(tokenrouter.__file__)"],
                           cwd=work, env=env, check=True, capture_output=True, text=True).stdout
    assert where.startswith(site), where  # the wheel's copy, not the source tree
    tool = venv / "bin" / "tokenrouter"
    check = subprocess.run([str(tool), "check", "rstitch.route"], cwd=work, env=env,
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stderr
    out = subprocess.run([str(tool), "compile", "rstitch.route", "-o", "build"], cwd=work, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert {"router.py", "plan.json", "ir.json"} <= {p.name for p in (work / "build").iterdir()}
    gen = subprocess.run([str(tool), "generate", "The capital of France is", "--max-tokens", "4"], cwd=work,
                         env=env, capture_output=True, text=True, timeout=700)
    assert gen.returncode == 0, gen.stderr[-3000:]
    assert gen.stdout.strip(), gen.stderr[-3000:]
    built = list(Path(env["TOKENROUTER_CACHE"]).rglob("*.so"))
    assert built, "the C kernels were not built into the fresh cache"
