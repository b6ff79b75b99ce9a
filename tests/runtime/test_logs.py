"""The log's repeat filter: a flood of one message is one line a window with a count, but a
message about a thing (a subserver) is folded only with the same message about the same
thing, so two subservers' deaths are two lines. Through a real logger and handler, as
`logs.configure` sets them up."""

import io
import logging
import time

from tokenrouter.runtime.logs import LineFormatter, RepeatFilter, about


def _logger(window_s: float) -> tuple[logging.Logger, io.StringIO]:
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(LineFormatter("tokenrouter"))
    handler.addFilter(RepeatFilter(window_s))
    log = logging.getLogger(f"tokenrouter.test_logs.{window_s}")
    log.handlers[:] = [handler]
    log.propagate = False
    log.setLevel(logging.INFO)
    return log, buf


def test_two_subjects_give_two_lines_and_one_subject_repeated_is_folded():
    log, buf = _logger(60.0)
    for w in ("small", "large", "small", "large", "small"):
        log.error("subserver %s is down (%s); recovering its requests", w, "its process exited", extra=about(w))
    assert buf.getvalue().splitlines() == [
        "tokenrouter error: subserver small is down (its process exited); recovering its requests",
        "tokenrouter error: subserver large is down (its process exited); recovering its requests"]


def test_a_flood_of_one_message_without_a_subject_is_one_line_then_a_count():
    log, buf = _logger(0.3)
    for i in range(5):  # the same message whatever the frame: one kind
        log.warning("dropped a frame: %s", f"frame {i} is not JSON")
    time.sleep(0.35)
    log.warning("dropped a frame: %s", "frame 5 is not JSON")
    assert buf.getvalue().splitlines() == [
        "tokenrouter warning: dropped a frame: frame 0 is not JSON",
        "tokenrouter warning: dropped a frame: frame 5 is not JSON (4 more like this in the last 0 s)"]


def test_progress_lines_are_never_folded():
    log, buf = _logger(3600.0)
    for w in ("small", "small"):
        log.info("%s: warming up", w)
    assert len(buf.getvalue().splitlines()) == 2
