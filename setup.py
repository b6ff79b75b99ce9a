"""Build hook: ship grammars/route.lark inside the package.

The grammar's one source is grammars/route.lark at the repository root (the language's spec,
read by people and by the parser alike). A wheel only carries package directories, so the
build copies the file into `tokenrouter/grammars/`; `tokenrouter.dsl.grammar.grammar_path`
looks there first and falls back to the source tree for editable installs.
"""

import os

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithGrammar(build_py):
    def run(self):
        super().run()
        target = os.path.join(self.build_lib, "tokenrouter", "grammars")
        self.mkpath(target)
        self.copy_file(os.path.join("grammars", "route.lark"), os.path.join(target, "route.lark"))


setup(cmdclass={"build_py": BuildPyWithGrammar})
