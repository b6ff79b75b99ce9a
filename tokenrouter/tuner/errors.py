"""The tuner's one error type: whatever is wrong with a profile, a run-length fit or the
system description, callers catch `TuneError` and fall back (or report it) in one place."""


class TuneError(ValueError):
    """The tuner cannot answer: a bad or incomplete profile, run lengths, or system."""
