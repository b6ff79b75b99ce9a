import pytest


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    """A private, empty model cache for tests that watch the cache itself."""
    root = tmp_path / "cache"
    monkeypatch.setenv("TOKENROUTER_CACHE", str(root))
    return root
