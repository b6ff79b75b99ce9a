"""Fixtures for every test folder: the tiny model pair, one torch thread; the tiers.

Two tiers: the full suite (`pytest`, the README's test command and CI's) and a fast one
(`pytest -m "not slow"`) for the edit-run loop. A test is `slow` when it is marked so, or
marked `real_weights` (it loads the embedded SmolLM2: seconds each) or `browser`."""

import pytest

from tests.helpers import tiny


@pytest.fixture(scope="session")
def pair(tmp_path_factory):
    """Paths of a tiny small/large model pair sharing one vocabulary: {"slm": ..., "llm": ...}."""
    return tiny.make_pair(str(tmp_path_factory.mktemp("pair")))


def pytest_configure(config):
    # The tests share two cores with each other's subserver processes: one torch thread
    # here avoids oversubscription, which slows small steps down tenfold.
    import torch
    torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("real_weights") or item.get_closest_marker("browser"):
            item.add_marker(pytest.mark.slow)
