"""The operator's logging set-up in a unit test: changed for the test, given back after."""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Iterator

from mpijob.platform import logs


@contextlib.contextmanager
def restored_logging() -> Iterator[io.StringIO]:
    """A stream for the test's log lines; the root logger's handlers and level, warnings'
    capture and the quiet loggers' levels (``logs.QUIET_UNLESS_VERBOSE``) as they were, after."""
    root = logging.getLogger()
    quiet = [logging.getLogger(name) for name in logs.QUIET_UNLESS_VERBOSE]
    saved = root.handlers[:], root.level, [q.level for q in quiet]
    try:
        yield io.StringIO()
    finally:
        root.handlers[:], level, levels = saved
        root.setLevel(level)
        logging.captureWarnings(False)
        for q, was in zip(quiet, levels, strict=True):
            q.setLevel(was)
