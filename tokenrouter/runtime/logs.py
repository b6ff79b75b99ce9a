"""Log lines for a person at a terminal, and never a flood.

The progress of every step that can take more than a few seconds (converting weights into
the cache, building the C kernels, measuring a kernel plan, a subserver becoming ready) is
an INFO record of the module doing it, and warnings say what went wrong; each is one line
on stderr.

    configure("tokenrouter")          # the CLI: "tokenrouter: building smollm2-135m ..."
    configure("tokenrouter [slm]")    # a subserver process: "tokenrouter [slm]: ..."

`TOKENROUTER_LOG` (debug, info, warning, error) sets the level, INFO by default; a
library user sees these lines only once they configure logging themselves.

A repeated message is written once per window, with a count. A fault that repeats fast (a
flood of invalid frames, a client storm, descriptors running out) would otherwise write the
same line, or the same traceback, tens of thousands of times a second and fill the disk.
`RepeatFilter` lets the first warning or error of each kind through, counts the rest for `window_s`,
and adds "(N more like this in the last S s)" to the next one it lets through. A record's
kind is its logger, level, message template (before its arguments are filled in),
exception type and *subject*, so "dropped a frame: %s" is one kind whatever the frame, but
a message about a thing (a subserver: `log.error("subserver %s is down", w,
extra=about(w))`) is folded only with the same message about the same thing: two
subservers' deaths are two lines. `configure` puts it on its handler; `quiet_repeats` puts
it on every handler in use (uvicorn's too).
"""

from __future__ import annotations

import logging
import os
import time

LEVEL_ENV = "TOKENROUTER_LOG"
WINDOW_S = 60.0
MAX_KINDS = 4096  # kinds remembered; the oldest are forgotten beyond it


class LineFormatter(logging.Formatter):
    """`PREFIX: message` for progress, `PREFIX warning: message` for anything worse."""

    def __init__(self, prefix: str):
        super().__init__()
        self.prefix = prefix

    def format(self, record: logging.LogRecord) -> str:
        head = self.prefix if record.levelno < logging.WARNING else f"{self.prefix} {record.levelname.lower()}"
        text = f"{head}: {record.getMessage()}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def level(default: str = "INFO") -> str:
    """The level `TOKENROUTER_LOG` asks for (upper case), else `default`."""
    return (os.environ.get(LEVEL_ENV) or default).upper()


def configure(prefix: str, level_name: str | None = None) -> None:
    """One stderr handler on the root logger with `LineFormatter(prefix)`, replacing any
    handler a previous call installed. tokenrouter's own loggers log at `level_name`, else
    `level()`; other libraries' at WARNING at most (httpx's INFO line per request would
    drown the progress lines of a benchmark that sends thousands)."""
    root = logging.getLogger()
    for h in [h for h in root.handlers if isinstance(h.formatter, LineFormatter)]:
        root.removeHandler(h)
    handler = logging.StreamHandler()
    handler.setFormatter(LineFormatter(prefix))
    handler.addFilter(RepeatFilter())
    root.addHandler(handler)
    ours = logging.getLevelName((level_name or level()).upper())
    logging.getLogger("tokenrouter").setLevel(ours)
    root.setLevel(max(ours, logging.WARNING))


def about(subject: str) -> dict[str, str]:
    """A log call's `extra` naming what its message is about (`RepeatFilter` folds repeats
    per subject)."""
    return {"subject": subject}


class RepeatFilter(logging.Filter):
    def __init__(self, window_s: float = WINDOW_S):
        super().__init__()
        self.window_s = window_s
        self.kinds: dict[tuple, list] = {}  # kind -> [time it was last let through, repeats since]

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True  # progress lines repeat their template by design ("%s: warming up")
        exc = record.exc_info[0].__name__ if record.exc_info and record.exc_info[0] else None
        kind = (record.name, record.levelno, str(record.msg), exc, getattr(record, "subject", None))
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
