"""`FitError`: bad input to `tokenrouter fit`."""

from __future__ import annotations


class FitError(ValueError):
    """Bad input to `tokenrouter fit`: the message is meant for the user."""
