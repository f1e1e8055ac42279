"""The one exponential backoff: the request adapter's retries, the work queue's per-key delays
and the Event recorder's retries all wait by :func:`exponential`."""

from __future__ import annotations


def exponential(first: float, tries: int, most: float) -> float:
    """The wait after ``tries`` failed tries (1 or more): ``first``, doubled with each further
    failure, never more than ``most``."""
    return min(first * 2.0 ** max(0, tries - 1), most)
