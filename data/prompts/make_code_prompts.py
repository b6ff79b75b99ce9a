"""Write `code_train.jsonl` and `code_heldout.jsonl`: coding prompts for fitting routers of a
coder pair, none of them from HumanEval.

    .venv/bin/python data/prompts/make_code_prompts.py     # rewrites the two files (Python 3.11)

Two sources, both in this repository's reach without a data set:
- the `code` prompts of `train.jsonl` / `heldout.jsonl` (written for this project), kept in
  their split;
- functions of Python's standard library: for each public, pure-Python function of the
  modules below with a docstring, a request to write a function of that name and signature
  doing what the docstring's first paragraph says (the library's own code is not shown).
  Every fifth one, in a fixed order, is held out.
The output is deterministic for a given Python version; the committed files were made with
CPython 3.11.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))
MODULES = ("bisect", "base64", "calendar", "colorsys", "difflib", "fnmatch", "fractions", "functools", "glob",
           "heapq", "html", "ipaddress", "itertools", "json", "keyword", "linecache", "ntpath", "operator",
           "os.path", "posixpath", "pprint", "quopri", "random", "re", "shlex", "shutil", "statistics",
           "string", "textwrap", "tokenize", "urllib.parse", "uu", "uuid", "wave", "zipfile", "email.utils",
           "http.cookiejar", "mimetypes", "netrc", "csv", "configparser", "copy", "datetime", "decimal",
           "filecmp", "gettext", "graphlib", "locale", "numbers", "pathlib", "platform", "plistlib",
           "secrets", "smtplib", "sre_parse", "tarfile", "tempfile", "types", "typing", "unicodedata", "warnings")


def _first_paragraph(doc: str) -> str:
    para = inspect.cleandoc(doc).split("\n\n")[0]
    return re.sub(r"\s+", " ", para).strip()


def stdlib_prompts() -> list[dict]:
    seen, out = set(), []
    for name in MODULES:
        try:
            mod = importlib.import_module(name)
        except Exception:
            continue
        for fname, fn in sorted(vars(mod).items()):
            if fname.startswith("_") or not inspect.isfunction(fn) or fn.__module__ != mod.__name__:
                continue
            doc = fn.__doc__ or ""
            text = _first_paragraph(doc) if doc.strip() else ""
            if not 40 <= len(text) <= 400 or fname in seen or text.lower().startswith(("deprecated", "internal")):
                continue
            try:
                sig = str(inspect.signature(fn))
            except (TypeError, ValueError):
                continue
            if len(sig) > 80 or "<" in sig:  # a default shown as <function ... at 0x...> is not reproducible
                continue
            if not text.endswith((".", "!", "?")):
                text += "."
            seen.add(fname)
            out.append({"id": f"stdlib-{name}.{fname}", "kind": "code",
                        "prompt": f"Write a Python function `{fname}{sig}`. {text[0].upper()}{text[1:]} Do not import the `{name}` module."})
    return out


def project_prompts(file: str) -> list[dict]:
    with open(os.path.join(HERE, file), encoding="utf-8") as f:
        return [r for r in map(json.loads, f) if r["kind"] == "code"]


def main() -> None:
    lib = stdlib_prompts()
    train = project_prompts("train.jsonl") + [p for i, p in enumerate(lib) if i % 5 != 4]
    held = project_prompts("heldout.jsonl") + [p for i, p in enumerate(lib) if i % 5 == 4]
    for file, rows in (("code_train.jsonl", train), ("code_heldout.jsonl", held)):
        with open(os.path.join(HERE, file), "w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
        print(f"{file}: {len(rows)} prompts")


if __name__ == "__main__":
    main()
