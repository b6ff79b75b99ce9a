"""Shared fixtures of the tuner tests: synthetic profiles and a program over tiny models."""

from __future__ import annotations

import pytest

from tests.helpers.tiny import write_tiny_model
from tokenrouter.tuner.profile import Profile


@pytest.fixture
def paper_profile():
    """A closed-loop study's step times: 6.0 and 27.9 ms, +2% per extra request,
    co-located 1.5x slower."""
    return Profile.affine({"slm": (6.0, 0.12), "llm": (27.9, 0.558)}, colocation=0.5)


@pytest.fixture
def tiny_route(tmp_path):
    """A .route program over two tiny models (a seeded coin routes small -> large)."""
    small = write_tiny_model(str(tmp_path / "small"), 32, 1, 1)
    large = write_tiny_model(str(tmp_path / "large"), 64, 2, 2)
    path = tmp_path / "tiny.route"
    path.write_text(f'tokenrouter 1\nmodel small = "{small}"\nmodel large = "{large}"\n'
                    "route {\n  start small\n  small -> large when bernoulli(0.2, 7) rewrite\n"
                    "  visit large max 1 then small\n}\nserve {\n  batch large = auto\n  max_wait = 20ms\n}\n")
    return path
