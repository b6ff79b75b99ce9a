"""The runtime tests' fixtures: tiny random-weight models of each supported family
(`tests/helpers/hf_parity.py`, for the engine's and the kernels' tests), built once per
session, and a private model cache."""

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


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    """A private, empty model cache (`TOKENROUTER_CACHE`), for tests that watch the cache
    itself or convert files into it."""
    root = tmp_path / "cache"
    monkeypatch.setenv("TOKENROUTER_CACHE", str(root))
    return root
