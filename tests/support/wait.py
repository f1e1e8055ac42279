"""Waiting on observed state with a deadline (never a fixed sleep)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """The awaited state was not reached before the deadline."""


def wait_until(
    probe: Callable[[], T | None],
    *,
    timeout: float = 60.0,
    interval: float = 0.25,
    what: str = "condition",
) -> T:
    """Call ``probe`` until it returns a truthy value, and return that value.

    On timeout, fail with the description and the last value seen, so a red test says what
    state it was stuck in.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            last = probe()
        except Exception as exc:  # a transient API error is a state too: keep polling
            last = exc
        else:
            if last:
                return last
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}")
        time.sleep(interval)


def stays(
    probe: Callable[[], bool], *, duration: float, interval: float = 0.25, what: str = "state"
) -> None:
    """Assert that ``probe`` holds during the whole ``duration`` (for "stays Pending" checks)."""
    deadline = time.monotonic() + duration
    while time.monotonic() < deadline:
        assert probe(), f"{what} no longer holds"
        time.sleep(interval)
