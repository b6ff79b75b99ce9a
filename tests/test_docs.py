"""The recipes of docs/architecture.md ("Add a step feature", "Add an engine", and any recipe
added under its "Recipes" heading) name only files and folders that exist: each path a
recipe writes in backticks (`tokenrouter/compiler/features/catalog.py`,
`tests/compiler/backend/golden/`) is looked up from the repository's root. Every test file or
folder that the docs, the README and benchmarks/README.md name (`tests/...`) exists, so a
moved test cannot leave a stale name behind. The engine table of docs/engines.md is the one
the registry's capabilities make (`engines.engine_table`)."""

from __future__ import annotations

import re
from pathlib import Path

from tokenrouter import engines

REPO = Path(__file__).resolve().parents[1]
ARCHITECTURE = REPO / "docs" / "architecture.md"
ENGINES = REPO / "docs" / "engines.md"
_PATH = re.compile(r"`([A-Za-z0-9_.-]+/(?:[A-Za-z0-9_.-]+/?)*)`")
_TEST_PATH = re.compile(r"(?<![A-Za-z0-9_./-])tests/[A-Za-z0-9_./-]*[A-Za-z0-9_/]")
PROSE = [REPO / "README.md", REPO / "benchmarks" / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def recipes(markdown: str) -> dict[str, list[str]]:
    """{recipe title: the paths it names}, for each `### ` heading under `## Recipes`."""
    section = markdown.split("\n## Recipes\n", 1)[1].split("\n## ", 1)[0] if "\n## Recipes\n" in markdown else ""
    out = {}
    for block in section.split("\n### ")[1:]:
        title, _, body = block.partition("\n")
        out[title.strip()] = _PATH.findall(body)
    return out


def missing(markdown: str, root: Path) -> list[str]:
    return [f"{title}: {path}" for title, paths in recipes(markdown).items() for path in paths
            if not (root / path).exists()]


def test_every_file_the_recipes_name_exists():
    found = recipes(ARCHITECTURE.read_text(encoding="utf-8"))
    assert {"Add a step feature", "Add an engine"} <= set(found), list(found)
    assert all(found.values()), f"a recipe names no file: {found}"
    assert not missing(ARCHITECTURE.read_text(encoding="utf-8"), REPO)


def test_the_recipe_check_sees_what_it_is_for(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("")
    text = ("# Title\n\n## Recipes\n\n### Add a thing\n\n1. Edit `pkg/a.py` and `pkg/b.py`, then `pkg/`.\n"
            "2. Run `make`, `X=1` and `pkg/a.py:run`.\n\n### Add another\n\nSee `docs/nowhere.md`.\n\n"
            "## After\n\n`pkg/c.py`\n")
    assert recipes(text) == {"Add a thing": ["pkg/a.py", "pkg/b.py", "pkg/"], "Add another": ["docs/nowhere.md"]}
    assert missing(text, tmp_path) == ["Add a thing: pkg/b.py", "Add another: docs/nowhere.md"]


def missing_tests(texts: dict[str, str], root: Path) -> list[str]:
    """'file: path' for each `tests/...` path a text names that does not exist under root."""
    return [f"{name}: {path}" for name, text in texts.items() for path in sorted(set(_TEST_PATH.findall(text)))
            if not (root / path).exists()]


def test_every_test_the_docs_name_exists():
    texts = {str(p.relative_to(REPO)): p.read_text(encoding="utf-8") for p in PROSE}
    assert sum(len(_TEST_PATH.findall(t)) for t in texts.values()) > 20  # the docs do name tests
    assert not missing_tests(texts, REPO)


def test_the_test_path_check_sees_what_it_is_for(tmp_path):
    (tmp_path / "tests" / "a").mkdir(parents=True)
    (tmp_path / "tests" / "a" / "test_x.py").write_text("")
    text = ("Tested in `tests/a/test_x.py`, tests/a/ and tests/a/test_y.py. See `tests/b/`; "
            "not mytests/c.py.\n")
    assert missing_tests({"doc.md": text}, tmp_path) == ["doc.md: tests/a/test_y.py", "doc.md: tests/b/"]


def test_the_engine_table_is_the_registrys():
    """Regenerate it with: python -c "from tokenrouter import engines; print(engines.engine_table())"."""
    assert engines.names() == tuple(r.name for r in engines.BUILTIN), "run without other engines installed"
    assert engines.engine_table() in ENGINES.read_text(encoding="utf-8")
