"""The engine tests' fixture: tiny random-weight models of each supported family
(`tests/helpers/hf_parity.py`), built once per session."""

from __future__ import annotations

import pytest

from tests.helpers.hf_parity import build_hf


@pytest.fixture(scope="session")
def tiny():
    """family -> (hf model, ModelConfig, state dict), built once per session."""
    cache = {}

    def get(family: str):
        if family not in cache:
            model, cfg = build_hf(family)
            cache[family] = (model, cfg, {k: v.clone() for k, v in model.state_dict().items()})
        return cache[family]

    return get
