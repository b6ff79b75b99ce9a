"""tokenrouter: serve token-level LLM routing written in the .route language."""

__version__ = "0.1.0"
