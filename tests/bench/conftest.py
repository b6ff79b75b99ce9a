import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "runtime"))


@pytest.fixture(scope="session")
def pair(tmp_path_factory):
    """A tiny small/large pair sharing a vocabulary (the runtime tests' helper)."""
    import tiny
    return tiny.make_pair(str(tmp_path_factory.mktemp("benchpair")))


def pytest_configure(config):
    import torch
    torch.set_num_threads(1)
