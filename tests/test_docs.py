"""The recipes of docs/architecture.md ("Add a step feature", "Add an engine", and any recipe
added under its "Recipes" heading) name only files and folders that exist: each path a
recipe writes in backticks (`tokenrouter/compiler/features/catalog.py`,
`tests/compiler/golden/`) is looked up from the repository's root. The engine table of
docs/engines.md is the one the registry's capabilities make (`engines.engine_table`)."""

from __future__ import annotations

import re
from pathlib import Path

from tokenrouter import engines

REPO = Path(__file__).resolve().parents[1]
ARCHITECTURE = REPO / "docs" / "architecture.md"
ENGINES = REPO / "docs" / "engines.md"
_PATH = re.compile(r"`([A-Za-z0-9_.-]+/(?:[A-Za-z0-9_.-]+/?)*)`")


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


def test_the_engine_table_is_the_registrys():
    """Regenerate it with: python -c "from tokenrouter import engines; print(engines.engine_table())"."""
    assert engines.names() == tuple(r.name for r in engines.BUILTIN), "run without other engines installed"
    assert engines.engine_table() in ENGINES.read_text(encoding="utf-8")
