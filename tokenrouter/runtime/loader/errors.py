"""The errors loading can raise. All are `LoadError`, so a command prints one line, not a traceback."""

from __future__ import annotations


class LoadError(ValueError):
    """A model or tokenizer could not be loaded; the message says what to fix."""


class MissingFile(LoadError):
    """A path or a file a checkpoint needs does not exist."""


class UnsupportedArchitecture(LoadError):
    """The checkpoint is of an architecture (or tokenizer kind) the engine does not implement."""


class ShapeMismatch(LoadError):
    """The weights do not have the shapes the config implies (or some are missing)."""


class UnsupportedQuantization(LoadError):
    """A GGUF tensor is stored in a quantisation we cannot dequantise."""
