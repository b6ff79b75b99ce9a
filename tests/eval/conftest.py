import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "runtime"))


@pytest.fixture(scope="session")
def pair(tmp_path_factory):
    """Paths of a tiny small/large model pair sharing one vocabulary (tests/runtime/tiny.py)."""
    import tiny
    return tiny.make_pair(str(tmp_path_factory.mktemp("pair")))


def pytest_configure(config):
    import torch
    torch.set_num_threads(1)
