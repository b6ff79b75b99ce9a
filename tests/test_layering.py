"""The import rules of docs/architecture.md, read from the source with `ast` (nothing is imported):

- a layer imports only the layers before it: dsl -> engines (the engines' registry and
  capabilities, on extras) -> protocol (what the compiler, the generated routers and the
  runtime share) -> compiler -> runtime -> tuner ->
  fit | eval | bench (side by side, not each other) -> commands and cli.py; so the dsl does
  not import the compiler, the compiler not the runtime, the runtime not the tuner, and
  nothing outside commands/ and cli.py imports tokenrouter.commands;
- no module uses another module's private names (`from x import _y`, or `x._y` on an
  imported module), at the top or inside a function;
- imports stand at the top of their module, but for the stated exceptions (LAZY_MODULES,
  OPTIONAL below);
- no module reads an underscored attribute it does not define (`self._y` or `obj._y` where
  nothing in the module defines `_y`): a class keeps its private state to itself, and a
  mixin that works on its host's private attributes (or a host on its mixin's, or a
  subclass on its base's from another module) is caught. What "defines" means is read from
  names, not types (a def, a class, an assignment, a parameter or a keyword argument
  anywhere in the module), so it cannot tell two classes of one module apart, and it
  leaves alone attributes of objects imported from outside the package (`os._exit`);
- no module of the package is over 400 lines (read as text, not with `ast`).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "tokenrouter"
TESTS = Path(__file__).resolve().parent

# the order of the layers; fit, eval and bench share a rank and must not import each other (what two of them
# share sits below them: prompts.py, the prompt set files of fit and bench)
RANK = {"extras": 0, "dsl": 0, "prompts": 0, "engines": 0.25, "protocol": 0.5, "compiler": 1, "runtime": 2, "tuner": 3, "fit": 4, "eval": 4, "bench": 4,
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


@functools.cache
def repo_modules(root: Path = PACKAGE) -> dict[str, tuple[Path, ast.Module]]:
    """`modules` of the package (or of the tests), parsed once for the checks that read them
    (the checks only read the trees)."""
    return modules(root)


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


def throwaway_package(tmp_path: Path, files: dict[str, str]) -> dict[str, tuple[Path, ast.Module]]:
    """A `tokenrouter` package of the given files under tmp_path, read as `modules` reads ours
    (the self-tests break each rule in one)."""
    for rel, text in files.items():
        path = tmp_path / "tokenrouter" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return modules(tmp_path / "tokenrouter")


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


NAMEDTUPLE_API = {"_replace", "_asdict", "_fields", "_make", "_field_defaults"}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_attribute_reads(mods) -> list[str]:
    """'file:line: expression' for each read of an underscored attribute the module does
    not define (see the module docstring)."""
    out = []
    for module, (path, tree) in mods.items():
        defined: set[str] = set()
        outside: set[str] = set()  # local names of things imported from outside the package
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                defined.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del)):
                defined.add(node.attr)
            elif isinstance(node, ast.keyword) and node.arg:
                defined.add(node.arg)  # set_defaults(_run=...), SimpleNamespace(_x=...)
            elif isinstance(node, ast.arg):
                defined.add(node.arg)
            elif isinstance(node, ast.Import):
                outside |= {(a.asname or a.name).split(".")[0] for a in node.names
                            if not a.name.startswith("tokenrouter")}
            elif isinstance(node, ast.ImportFrom) and not node.level:
                if not (node.module or "").startswith("tokenrouter"):
                    outside |= {a.asname or a.name for a in node.names}
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and _private(node.attr)):
                continue
            if node.attr in defined or node.attr in NAMEDTUPLE_API:
                continue
            root = node.value
            while isinstance(root, (ast.Attribute, ast.Call, ast.Subscript)):
                root = root.func if isinstance(root, ast.Call) else root.value
            if isinstance(root, ast.Name) and root.id in outside:
                continue
            out.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
    return sorted(out)


def test_no_module_reads_underscored_attributes_it_does_not_define():
    found = private_attribute_reads(repo_modules())
    assert not found, "\n".join(found + ["a class's private state is its own: make the name public, or pass "
                                         "what is needed in (a callable, an object with public names)"])


def test_no_test_uses_another_modules_private_names():
    """Tests share helpers through `tests/helpers/` (or a conftest), by public names."""
    mods = {**repo_modules(), **repo_modules(TESTS)}
    found = sorted(f"{w}: {m} uses {name}" for m, name, w in private_uses(mods) if m.startswith("tests"))
    assert not found, "\n".join(found)


def test_each_layer_imports_only_the_layers_before_it():
    found = layering_violations(repo_modules())
    assert not found, "\n".join(found)


def test_no_module_uses_another_modules_private_names():
    uses = private_uses(repo_modules())
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
        # a mixin on its host's private state, the host using the mixin's; os._exit is not ours
        "runtime/host.py": ("from tokenrouter.runtime.mixin import Watch\n\n\nclass Front(Watch):\n"
                            "    def __init__(self):\n        self._reqs = {}\n\n"
                            "    def go(self):\n        self._check()\n"),
        "runtime/mixin.py": ("import os\n\n\nclass Watch:\n    def _check(self):\n        self._reqs.clear()\n"
                             "        os._exit(0)\n"),
        "runtime/ok.py": ("class A:\n    def __init__(self):\n        self._n = 0\n\n\n"
                          "def f(a: A, args):\n    return a._n, args._run\n\n\n"
                          "def g(parser):\n    parser.set_defaults(_run=f)\n"),
    }
    mods = throwaway_package(tmp_path, files)
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
    assert private_attribute_reads(mods) == ["tokenrouter/fit/c.py:5: b._helper",
                                             "tokenrouter/runtime/host.py:9: self._check",
                                             "tokenrouter/runtime/mixin.py:6: self._reqs"]


# ------------------------------------------------------------------ inside the runtime

# The runtime's parts (its sub-packages and top-level modules) in the order they import each
# other, read from the code: a part imports only the parts of lower rank, at the top of a
# module or inside a function, so no two of them form a cycle. host, cache, metrics, logs, memory and cores import
# nothing of the runtime; the kernels (C library, bindings, weight formats, measured plans)
# only those; the engine runs the kernels; the loader builds engines' inputs (and derives
# models with an engine); the transport moves messages and knows no model; the frontend (submit,
# streams, liveness, recovery) needs only the transport, and the subservers load writers and
# step engines, side by side; the engines' adapters sit above the subserver (native is
# tokenrouter's engine, vllm an engine served by vLLM: each implements the subserver's engine
# interface, and the subserver finds its writer's engine by name in `tokenrouter/engines.py`);
# the launcher starts subservers and connects a frontend to them; http serves the frontend;
# the offline API, the single-request reference and the baselines sit on top, side by side.
RUNTIME_ORDER = (("host", "cache", "metrics", "logs", "memory", "cores"), ("kernels",), ("engine",), ("loader",),
                 ("transport",), ("frontend", "subserver"), ("native", "vllm"), ("launch",), ("http",),
                 ("offline", "reference", "baselines"))
RUNTIME_RANK = {part: rank for rank, parts in enumerate(RUNTIME_ORDER) for part in parts}


def runtime_part(module: str) -> str | None:
    """tokenrouter.runtime.<part>.x -> <part> (a sub-package or a top-level module)."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["tokenrouter", "runtime"] else None


def runtime_violations(mods) -> list[str]:
    """Every import between two parts of the runtime that goes against `RUNTIME_ORDER`
    (upward, or sideways between parts of one rank), and every part the order does not place."""
    order = " -> ".join("(" + ", ".join(parts) + ")" if len(parts) > 1 else parts[0] for parts in RUNTIME_ORDER)
    out = []
    for module, (path, tree) in mods.items():
        mine = runtime_part(module)
        if mine is None:
            continue
        if mine not in RUNTIME_RANK:
            out.append(f"{path}: runtime/{mine} has no place in the runtime's order ({order}): "
                       f"add it to RUNTIME_ORDER in tests/test_layering.py")
            continue
        for line, target, names in imports(module, path, tree):
            targets = [target] if names is None else [target] + [f"{target}.{n}" for n in names]
            theirs = next((runtime_part(t) for t in targets if runtime_part(t) not in (None, mine)), None)
            if theirs is None:
                continue
            if theirs not in RUNTIME_RANK or RUNTIME_RANK[theirs] >= RUNTIME_RANK[mine]:
                out.append(f"{path}:{line}: runtime/{mine} imports {target} (runtime/{theirs}): the runtime's "
                           f"parts import only the parts before them ({order})")
    return out


def test_the_runtimes_parts_import_each_other_in_one_direction():
    found = runtime_violations(repo_modules())
    assert not found, "\n".join(found)


def test_the_runtime_order_places_every_part_of_the_runtime():
    parts = {p.stem for p in (PACKAGE / "runtime").iterdir()
             if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.stem != "__init__")}
    assert parts == set(RUNTIME_RANK), (sorted(parts - set(RUNTIME_RANK)), sorted(set(RUNTIME_RANK) - parts))


def test_the_runtime_check_sees_what_it_is_for(tmp_path):
    """Each way of breaking the runtime's order, once in a throwaway package, is reported: an
    upward import inside a function, a sideways one between parts of one rank (absolute and
    relative), a plain `import`, an import of a part the order does not place, and a part
    the order does not place; downward imports, top-level or local, are not."""
    files = {
        "__init__.py": "",
        "runtime/__init__.py": "",
        "runtime/host.py": "from tokenrouter.runtime.cache import cache_root\n",
        "runtime/cache.py": "import os\n",
        "runtime/kernels/__init__.py": "",
        "runtime/kernels/plan.py": "def f():\n    from tokenrouter.runtime.engine.layers import onednn_rows\n",
        "runtime/engine/__init__.py": "",
        "runtime/engine/model.py": "from tokenrouter.runtime.kernels import plan\nfrom tokenrouter.runtime import cache\n",
        "runtime/engine/sampler.py": "from tokenrouter.runtime.gadgets import thing\n",
        "runtime/loader/__init__.py": "def g():\n    from ..engine.model import Model\n",
        "runtime/transport/__init__.py": "",
        "runtime/transport/wire.py": "import tokenrouter.runtime.subserver.step\n",
        "runtime/offline.py": "from .reference import Reference\n",
        "runtime/reference.py": "from tokenrouter.runtime.loader import load_model\n",
        "runtime/gadgets/__init__.py": "",
    }
    found = runtime_violations(throwaway_package(tmp_path, files))
    for what in ("tokenrouter/runtime/host.py:1: runtime/host imports tokenrouter.runtime.cache",
                 "tokenrouter/runtime/kernels/plan.py:2: runtime/kernels imports tokenrouter.runtime.engine.layers",
                 "tokenrouter/runtime/engine/sampler.py:1: runtime/engine imports tokenrouter.runtime.gadgets",
                 "tokenrouter/runtime/transport/wire.py:1: runtime/transport imports tokenrouter.runtime.subserver.step",
                 "tokenrouter/runtime/offline.py:1: runtime/offline imports tokenrouter.runtime.reference",
                 "tokenrouter/runtime/gadgets/__init__.py: runtime/gadgets has no place"):
        assert any(f.startswith(what) for f in found), (what, found)
    assert len(found) == 6, found


# ------------------------------------------------------------ module size

MAX_LINES = 400  # a longer module holds more than one concept: split it along a seam


def long_modules(root: Path = PACKAGE) -> dict[str, int]:
    """{path: lines} of every module under `root` over MAX_LINES (read as text, not with `ast`)."""
    return {str(p.relative_to(root.parent)): n for p in sorted(root.rglob("*.py"))
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}


def test_no_module_is_over_400_lines():
    long = long_modules()
    assert not long, f"over {MAX_LINES} lines: {long}"


def test_the_size_check_sees_what_it_is_for(tmp_path):
    files = {"__init__.py": "", "fit/big.py": "x = 1\n" * (MAX_LINES + 1), "fit/ok.py": "x = 1\n" * MAX_LINES,
             "runtime/deep/big.py": "\n" * (MAX_LINES + 5)}
    throwaway_package(tmp_path, files)
    assert long_modules(tmp_path / "tokenrouter") == {"tokenrouter/fit/big.py": MAX_LINES + 1,
                                                      "tokenrouter/runtime/deep/big.py": MAX_LINES + 5}


# ------------------------------------------------------------ where imports stand

# Function-level imports are allowed only for these stated reasons (docs/architecture.md):
# the command modules import the layers they drive inside `run` (`tokenrouter --help` builds
# every command's parser); the loader imports its weight readers where it loads (`tokenrouter
# check` asks it for model facts and must not pay for them); optional dependencies and
# matplotlib (its backend is chosen when a figure is drawn) are imported where used.
LAZY_MODULES = ("tokenrouter.commands", "tokenrouter.cli", "tokenrouter.runtime.loader",
                "tokenrouter.runtime.loader.builtin.registry", "tokenrouter.runtime.loader.tokenizer")
OPTIONAL = {"xllamacpp", "httpx", "transformers", "matplotlib", "vllm", "openai", "xgrammar", "outlines_core",
            "llguidance", "prometheus_client"}


def function_level_imports(mods) -> list[str]:
    """'file:line: module imports X inside a function' for every import that is not at the top
    of its module and has none of the reasons above."""
    out = []
    for module, (path, tree) in mods.items():
        if module in LAZY_MODULES or module.startswith("tokenrouter.commands."):
            continue
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    names = [_absolute(module, path.name == "__init__.py", node)]
                else:
                    continue
                for name in names:
                    if name.split(".")[0] not in OPTIONAL:
                        out.append(f"{path}:{node.lineno}: {module} imports {name} inside {fn.name}()")
    return sorted(set(out))


def test_imports_stand_at_the_top_of_their_module():
    found = function_level_imports(repo_modules())
    assert not found, "\n".join(found + ["import at the top of the module (docs/architecture.md, 'Layers')"])


def test_the_import_position_check_sees_what_it_is_for(tmp_path):
    files = {
        "__init__.py": "",
        "runtime/__init__.py": "",
        "runtime/frontend.py": "def start():\n    import zmq\n    from tokenrouter.runtime import wire\n",
        "runtime/ok.py": "import zmq\n\n\ndef draw():\n    import matplotlib.pyplot as plt\n",
        "runtime/loader/__init__.py": "def load_model():\n    import torch\n",
        "commands/serve.py": "def run(args):\n    from tokenrouter.runtime import offline\n",
        "bench/peer.py": "class Peer:\n    def __init__(self):\n        import xllamacpp\n        import torch\n",
    }
    found = function_level_imports(throwaway_package(tmp_path, files))
    assert sorted(f.split(": ", 1)[1] for f in found) == [
        "tokenrouter.bench.peer imports torch inside __init__()",
        "tokenrouter.runtime.frontend imports tokenrouter.runtime inside start()",
        "tokenrouter.runtime.frontend imports zmq inside start()"], found


# ------------------------------------------------------------ the test tree

def unpackaged_test_folders(root: Path = TESTS) -> list[str]:
    """Folders under `root` (and `root` itself) that hold a test module or a conftest but no
    `__init__.py`, and imports of a test module or conftest by its bare name (`from test_x
    import`): pytest would put such a folder on sys.path, so a folder named like a library
    (`tests/runtime/vllm`) would hide it and two files of one name would collide."""
    out = []
    for p in sorted(root.rglob("*.py")):
        if (p.name.startswith("test_") or p.name == "conftest.py") and not (p.parent / "__init__.py").exists():
            out.append(f"{p.parent.relative_to(root.parent)}/ has no __init__.py")
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"), str(p))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
            out += [f"{p.relative_to(root.parent)}:{node.lineno}: imports {n} by its bare name" for n in names
                    if n.split(".")[0].startswith("test_") or n.split(".")[0] == "conftest"]
    return sorted(set(out))


def test_every_test_folder_is_a_package():
    found = unpackaged_test_folders()
    assert not found, "\n".join(found + ["add the __init__.py; import a test module as tests.<folder>.<module>"])


def test_the_test_tree_check_sees_what_it_is_for(tmp_path):
    root = tmp_path / "tests"
    for rel, text in {"__init__.py": "", "test_a.py": "", "ok/__init__.py": "", "ok/test_b.py": "",
                      "ok/test_c.py": "from tests.ok.test_b import f\n", "vllm/test_d.py": "",
                      "vllm/conftest.py": "def f():\n    from test_a import g\n", "data/x.py": "import conftest\n"}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    assert unpackaged_test_folders(root) == ["tests/data/x.py:1: imports conftest by its bare name",
                                             "tests/vllm/ has no __init__.py",
                                             "tests/vllm/conftest.py:2: imports test_a by its bare name"]


# tests/ folders that mirror no package: the distribution's tests (the wheel, the extras) and shared helpers
NOT_MIRRORED = {"packaging", "helpers"}
# packages with no test folder of their own: data only, or tested where stated
UNTESTED_PACKAGES = {"compiler/backend/templates": "the generated module's template, data (tests/compiler/backend/)",
                     "runtime/kernels/csrc": "C sources, tested through their bindings (tests/runtime/kernels/)"}


def unmirrored_test_folders(tests: Path = TESTS, package: Path = PACKAGE) -> list[str]:
    """Where the test tree and the package part ways: a folder of test modules that names no
    package (tests/x/y/ is for tokenrouter/x/y/), and a package with modules of its own but no
    test folder (UNTESTED_PACKAGES aside)."""
    folders = {p.parent.relative_to(tests).as_posix() for p in tests.rglob("test_*.py")} - {"."}
    packages = {p.parent.relative_to(package).as_posix() for p in package.rglob("*.*")
                if p.parent != package and "__pycache__" not in p.parts}
    out = [f"tests/{f}/ mirrors no package (no tokenrouter/{f}/)" for f in sorted(folders)
           if f not in packages and f.split("/")[0] not in NOT_MIRRORED]
    out += [f"tokenrouter/{p}/ has no tests/{p}/" for p in sorted(packages)
            if p not in folders and p not in UNTESTED_PACKAGES]
    return out


def test_the_tests_mirror_the_packages():
    found = unmirrored_test_folders()
    assert not found, "\n".join(found + ["a module's tests sit in the folder of its package (tests/runtime/cores.py's "
                                         "in tests/runtime/test_cores.py)"])


def test_the_mirror_check_sees_what_it_is_for(tmp_path):
    tests, package = tmp_path / "tests", tmp_path / "tokenrouter"
    for rel in ("tokenrouter/a/m.py", "tokenrouter/a/b/n.py", "tokenrouter/c/o.py", "tokenrouter/runtime/kernels/csrc/k.c",
                "tests/a/test_m.py", "tests/b/test_n.py", "tests/packaging/test_wheel.py", "tests/test_top.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    assert unmirrored_test_folders(tests, package) == ["tests/b/ mirrors no package (no tokenrouter/b/)",
                                                       "tokenrouter/a/b/ has no tests/a/b/",
                                                       "tokenrouter/c/ has no tests/c/"]
