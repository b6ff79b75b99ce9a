"""Build the demo-pair candidates that are not built-in models, as checkpoint folders in the
model cache, and print the folder of each (so a candidate `.route` file can name it).

    python benchmarks/demo_pair/candidates.py lens16     # layers 0-15 of smollm2-135m + fitted lens

`lensK`: the first K decoder layers read through a ridge-fitted linear lens, the recipe of
the built-in `smollm2-135m-small` (K = 6) with a deeper cut (tokenrouter/runtime/loader/builtin/derive.py).
Built once (about a minute on 2 cores), then cached like every derived model.
"""

from __future__ import annotations

import re
import sys

from tokenrouter.runtime import cache
from tokenrouter.runtime.loader.builtin.derive import SMALL_RECIPE, small_entry
from tokenrouter.runtime.loader.builtin.registry import _smollm2_entry


def folder(name: str) -> str:
    m = re.fullmatch(r"lens(\d+)", name)
    if not m or not 1 <= int(m.group(1)) < 30:
        raise SystemExit(f"unknown candidate {name!r} (expected lensK, 1 <= K < 30)")
    recipe = {**SMALL_RECIPE, "keep_layers": list(range(int(m.group(1))))}
    return cache.get_or_build(*small_entry(_smollm2_entry(), recipe))


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(folder(arg))
