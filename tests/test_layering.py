"""The import rules of docs/architecture.md, read from the source with `ast` (nothing is imported):

- a layer imports only the layers before it: dsl -> protocol (what the compiler, the
  generated routers and the runtime share) -> compiler -> runtime -> tuner ->
  fit | eval | bench (side by side, not each other) -> commands and cli.py; so the dsl does
  not import the compiler, the compiler not the runtime, the runtime not the tuner, and
  nothing outside commands/ and cli.py imports tokenrouter.commands;
- no module uses another module's private names (`from x import _y`, or `x._y` on an
  imported module), at the top or inside a function.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "tokenrouter"
TESTS = Path(__file__).resolve().parent

# the order of the layers; fit, eval and bench share a rank and must not import each other
RANK = {"dsl": 0, "protocol": 0.5, "compiler": 1, "runtime": 2, "tuner": 3, "fit": 4, "eval": 4, "bench": 4,
        "commands": 5}



def modules(root: Path = PACKAGE) -> dict[str, tuple[Path, ast.Module]]:
    """Module name -> (path relative to the package's parent, syntax tree)."""
    out = {}
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root.parent)
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = (rel, ast.parse(p.read_text(encoding="utf-8"), str(p)))
    return out


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(module: str, path: Path, tree: ast.Module):
    """(line, imported module, names or None) for every import statement, top level or local."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name, None
        elif isinstance(node, ast.ImportFrom):
            yield node.lineno, _absolute(module, is_package, node), [a.name for a in node.names]


def layer(module: str) -> str | None:
    """tokenrouter.<layer>.x -> <layer>; cli.py belongs to the commands."""
    parts = module.split(".")
    if len(parts) < 2 or parts[0] != "tokenrouter":
        return None
    return "commands" if parts[1] == "cli" else parts[1]


def layering_violations(mods) -> list[str]:
    out = []
    for module, (path, tree) in mods.items():
        mine = layer(module)
        if mine is None:
            continue
        for line, target, names in imports(module, path, tree):
            targets = [target] if names is None else [target] + [f"{target}.{n}" for n in names]
            # `from tokenrouter import compiler` names the layer in `names`
            theirs = next((layer(t) for t in targets if layer(t) in RANK and layer(t) != mine), None)
            if theirs is None:
                continue
            if RANK[theirs] >= RANK[mine]:
                out.append(f"{path}:{line}: {mine} imports {target} ({theirs}): "
                           f"a layer imports only the layers before it (docs/architecture.md)")
    return out


def private_uses(mods) -> set[tuple[str, str, str]]:
    """(module, 'other.module._name', 'file:line') for each private name used across modules."""
    out = set()
    for module, (path, tree) in mods.items():
        where = lambda n: f"{path}:{n.lineno}"  # noqa: E731
        bound: dict[str, str] = {}  # local name -> tokenrouter module it refers to
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                src = _absolute(module, path.name == "__init__.py", node)
                for a in node.names:
                    if a.name.startswith("_") and not a.name.startswith("__") and src != module:
                        out.add((module, f"{src}.{a.name}", where(node)))
                    if src.startswith("tokenrouter"):
                        bound[a.asname or a.name] = f"{src}.{a.name}"
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("tokenrouter"):
                        bound[a.asname or a.name] = a.name if a.asname else a.name.split(".")[0]
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound
                    and node.attr.startswith("_") and not node.attr.startswith("__")
                    and bound[node.value.id] in mods and bound[node.value.id] != module):
                out.add((module, f"{bound[node.value.id]}.{node.attr}", where(node)))
    return out


def test_no_test_uses_another_modules_private_names():
    """Tests share helpers through `tests/helpers/` (or a conftest), by public names."""
    mods = {**modules(), **modules(TESTS)}
    found = sorted(f"{w}: {m} uses {name}" for m, name, w in private_uses(mods) if m.startswith("tests"))
    assert not found, "\n".join(found)


def test_each_layer_imports_only_the_layers_before_it():
    found = layering_violations(modules())
    assert not found, "\n".join(found)


def test_no_module_uses_another_modules_private_names():
    uses = private_uses(modules())
    found = sorted(f"{w}: {m} uses {name}" for m, name, w in uses)
    assert not found, "\n".join(found + ["make the name public where it is defined, or keep it inside its module"])


def test_the_checks_see_what_they_are_for(tmp_path):
    """Each rule, broken once in a throwaway package, is reported (top level and local)."""
    files = {
        "__init__.py": "",
        "dsl/ast.py": "from tokenrouter.compiler.ir import Span\n",
        "compiler/lower.py": "def f():\n    from tokenrouter.runtime.loader import resolve_folder\n",
        "compiler/ok.py": "from tokenrouter.dsl import ast\nfrom . import lower\n",
        "runtime/launcher.py": "def f():\n    from ..tuner import api\n",
        "bench/check.py": "from tokenrouter.commands.bench import default_program\n",
        "bench/peer.py": "from tokenrouter.eval import configs\n",
        "commands/bench.py": "from tokenrouter.bench import check\nimport tokenrouter.runtime.loader\n",
        "cli.py": "from tokenrouter.commands import bench\n",
        "fit/a.py": "from tokenrouter.fit.b import _helper\n",
        "fit/b.py": "def _helper():\n    pass\n",
        "fit/c.py": "from tokenrouter.fit import b\n\n\ndef g():\n    return b._helper()\n",
        "fit/d.py": "def h():\n    from .b import _helper\n",
    }
    for rel, text in files.items():
        path = tmp_path / "tokenrouter" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    mods = modules(tmp_path / "tokenrouter")
    found = layering_violations(mods)
    for what in ("tokenrouter/dsl/ast.py:1: dsl imports tokenrouter.compiler.ir",
                 "tokenrouter/compiler/lower.py:2: compiler imports tokenrouter.runtime.loader",
                 "tokenrouter/runtime/launcher.py:2: runtime imports tokenrouter.tuner",
                 "tokenrouter/bench/check.py:1: bench imports tokenrouter.commands.bench",
                 "tokenrouter/bench/peer.py:1: bench imports tokenrouter.eval"):
        assert any(f.startswith(what) for f in found), (what, found)
    assert len(found) == 5, found
    assert {(m, name) for m, name, _ in private_uses(mods)} == {
        ("tokenrouter.fit.a", "tokenrouter.fit.b._helper"),
        ("tokenrouter.fit.c", "tokenrouter.fit.b._helper"),
        ("tokenrouter.fit.d", "tokenrouter.fit.b._helper")}
