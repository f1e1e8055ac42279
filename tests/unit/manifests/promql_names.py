"""The metric names a PromQL expression reads, for checking dashboards and rules offline.

A small scanner, not a parser: it drops strings, label matchers, ``by``/``without``/``on``/
``ignoring`` label lists, ranges, durations and numbers; what remains are function
names (followed by ``(``), keywords and metric names.
"""

from __future__ import annotations

import re

KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless"}
    | {"offset", "bool", "inf", "nan"}
)
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_LABEL_LISTS = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_RANGES = re.compile(r"\[[^\[\]]*\]")
#: Numbers and durations (``0.99``, ``1e3``, ``5m``, ``1h30m``), not preceded by a name's letter.
_NUMBERS = re.compile(r"(?<![a-zA-Z0-9_:])\d[a-zA-Z0-9_.]*")
_IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def metric_names(expr: str) -> set[str]:
    text = _STRING.sub(" ", expr)
    text = _MATCHERS.sub(" ", text)
    text = _LABEL_LISTS.sub(" ", text)
    text = _RANGES.sub(" ", text)
    text = _NUMBERS.sub(" ", text)
    names = set()
    for match in _IDENT.finditer(text):
        rest = text[match.end() :].lstrip()
        word = match.group()
        if rest.startswith("(") or word.lower() in KEYWORDS:
            continue
        names.add(word)
    return names
