"""Fixtures for every test folder: the tiny model pair, one torch thread."""

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
