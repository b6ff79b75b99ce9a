"""Fixtures for every test folder: the tiny model pair, the real coder pair, one torch
thread; the tiers.

Two tiers: the full suite (`pytest`, the README's test command and CI's) and a fast one
(`pytest -m "not slow"`) for the edit-run loop. A test is `slow` when it is marked so, or
marked `real_weights` (it loads the embedded SmolLM2: seconds each), `real_pair` or
`browser`. A `real_pair` test is skipped, with a reason that names the pull command, where
the Qwen2.5-Coder pair is not pulled into the cache."""

import pytest

from tests.helpers import tiny
from tokenrouter.runtime.loader.builtin.pypi import PULLABLE, is_pulled, pulled_path

REAL_PAIR = {"small": "qwen2.5-coder-0.5b-instruct", "large": "qwen2.5-coder-1.5b-instruct"}


@pytest.fixture(scope="session")
def pair(tmp_path_factory):
    """Paths of a tiny small/large model pair sharing one vocabulary: {"slm": ..., "llm": ...}."""
    return tiny.make_pair(str(tmp_path_factory.mktemp("pair")))


@pytest.fixture(scope="session")
def real_pair():
    """The pulled coder pair's GGUF files: {"small": path, "large": path} (the test is marked
    `real_pair`, so it is skipped where they are not pulled)."""
    return {role: pulled_path(PULLABLE[name]) for role, name in REAL_PAIR.items()}


def _real_pair_missing() -> list[str]:
    return [name for name in REAL_PAIR.values() if not is_pulled(PULLABLE[name])]


def pytest_configure(config):
    # The tests share two cores with each other's subserver processes: one torch thread
    # here avoids oversubscription, which slows small steps down tenfold.
    import torch
    torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    missing = None
    for item in items:
        if item.get_closest_marker("real_weights") or item.get_closest_marker("browser"):
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("real_pair"):
            item.add_marker(pytest.mark.slow)
            missing = _real_pair_missing() if missing is None else missing
            if missing:
                item.add_marker(pytest.mark.skip(reason=f"{', '.join(missing)} not pulled: run "
                                                        f"`tokenrouter models pull {' '.join(missing)}`"))
