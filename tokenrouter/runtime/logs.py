"""A repeated log message is written once per window, with a count, not once per occurrence.

A fault that repeats fast (a flood of invalid frames, a client storm, descriptors running
out) would otherwise write the same line, or the same traceback, tens of thousands of times
a second and fill the disk. `RepeatFilter` lets the first record of each kind through,
counts the rest for `window_s`, and adds "(N more like this in the last S s)" to the next
one it lets through. A record's kind is its logger, level, message template (before its
arguments are filled in) and exception type, so "dropped a frame: %s" is one kind whatever
the frame. `quiet_repeats` puts it on every handler of the root logger and of the loggers
that have their own handlers (uvicorn's); `tokenrouter serve` and each subserver process
call it.
"""

from __future__ import annotations

import logging
import time

WINDOW_S = 60.0
MAX_KINDS = 4096  # kinds remembered; the oldest are forgotten beyond it


class RepeatFilter(logging.Filter):
    def __init__(self, window_s: float = WINDOW_S):
        super().__init__()
        self.window_s = window_s
        self.kinds: dict[tuple, list] = {}  # kind -> [time it was last let through, repeats since]

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[0].__name__ if record.exc_info and record.exc_info[0] else None
        kind = (record.name, record.levelno, str(record.msg), exc)
        now = time.monotonic()
        seen = self.kinds.get(kind)
        if seen is not None and now - seen[0] < self.window_s:
            seen[1] += 1
            return False
        if seen is not None and seen[1]:
            note = f" ({seen[1]} more like this in the last {now - seen[0]:.0f} s)"
            record.msg = str(record.msg) + (note.replace("%", "%%") if record.args else note)
        if seen is None and len(self.kinds) >= MAX_KINDS:
            self.kinds.pop(next(iter(self.kinds)))
        self.kinds[kind] = [now, 0]
        return True


def quiet_repeats(window_s: float = WINDOW_S) -> None:
    """Put a `RepeatFilter` on every handler in use (the root's and the loggers' own)."""
    loggers = [logging.getLogger()] + [lg for lg in logging.root.manager.loggerDict.values()
                                       if isinstance(lg, logging.Logger)]
    for lg in loggers:
        for h in lg.handlers:
            if not any(isinstance(f, RepeatFilter) for f in h.filters):
                h.addFilter(RepeatFilter(window_s))
