"""Log lines for a person at a terminal: the progress of every step that can take more than
a few seconds (converting weights into the cache, building the C kernels, measuring a
kernel plan, a subserver becoming ready) is an INFO record of the module doing it, and
warnings say what went wrong; each is one line on stderr.

    configure("tokenrouter")          # the CLI: "tokenrouter: building smollm2-135m ..."
    configure("tokenrouter [slm]")    # a subserver process: "tokenrouter [slm]: ..."

`TOKENROUTER_LOG` (debug, info, warning, error) sets the level, INFO by default; a
library user sees these lines only once they configure logging themselves.
"""

from __future__ import annotations

import logging
import os

LEVEL_ENV = "TOKENROUTER_LOG"


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
    handler a previous call installed; the level is `level_name`, else `level()`."""
    root = logging.getLogger()
    for h in [h for h in root.handlers if isinstance(h.formatter, LineFormatter)]:
        root.removeHandler(h)
    handler = logging.StreamHandler()
    handler.setFormatter(LineFormatter(prefix))
    root.addHandler(handler)
    root.setLevel((level_name or level()).upper())
