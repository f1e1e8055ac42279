"""Text from the API made safe to print on a terminal: its control characters shown, not obeyed.

Whatever the CLI prints that it did not write itself (names, a job's conditions, which its
tenant may write through the status subresource, annotations, the kubelet's reasons, an API
error's message, a container's log) may hold characters a terminal obeys rather than shows:
ESC starts sequences that move the cursor, recolour, retitle the window or open hyperlinks; CR
and LF start a line that can pass for a row of the output; bidi overrides (U+202E) reorder what
follows. kubectl escapes ESC and CR for the same reason (CVE-2021-25743); :func:`escape` escapes
every such character, printed visibly (``\\x1b``, ``\\n``, ``\\u202e``), so one field stays
on one line and nothing reaches the terminal raw.

:func:`text` is how API text becomes output: a rich ``Text`` of the escaped string, never read
as rich markup (``[link=...]`` in a field would otherwise open a hyperlink), and
:class:`Table`'s ``str`` cells go through it. The CLI's own styles and line breaks are rich's,
added around the text, so they stay. Called by :mod:`mpijob.console.render`,
:mod:`mpijob.console.topology`, :mod:`mpijob.console.plot` and :mod:`mpijob.console.main`.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Iterator
from typing import Any, Final

import rich.table
from rich.text import Text

#: Unicode categories a terminal may obey: controls (C0, DEL, C1), format characters (bidi
#: embeddings, overrides and isolates, zero-width characters, tags), the line and paragraph
#: separators, and lone surrogates (which cannot be written out as UTF-8 at all).
UNSAFE_CATEGORIES: Final = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})

#: Printable ASCII is safe as it is; only runs of other characters are looked at.
_SUSPECT: Final = re.compile(r"[^\x20-\x7e]+")
_NAMED: Final = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}

#: What a log keeps: its own line breaks and tabs (the container's output, line by line).
LOG_KEEPS: Final = "\n\t"


def visible(char: str) -> str:
    """How an unsafe character is printed: ``\\n``, ``\\r``, ``\\t``, else its code point as a
    Python string literal writes it (``\\x1b``, ``\\u202e``, ``\\U000e0041``)."""
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def unsafe(char: str) -> bool:
    return unicodedata.category(char) in UNSAFE_CATEGORIES


def escape(value: str, *, keep: str = "") -> str:
    """``value`` with every character a terminal may obey written visibly (:func:`visible`),
    except those in ``keep``; printable text, any script's, is left as it is."""

    def replace(match: re.Match[str]) -> str:
        run = match.group()
        if run.isprintable():  # no Cc, Cf, Zl, Zp or Cs in it: text of another script
            return run
        return "".join(visible(c) if c not in keep and unsafe(c) else c for c in run)

    return _SUSPECT.sub(replace, value)


def text(value: object, style: str = "") -> Text:
    """``value`` as API text is printed: escaped, in ``style``, never read as markup."""
    return Text(escape(str(value)), style=style)


def escape_log(chunks: Iterable[str]) -> Iterator[str]:
    """A container's log, chunk by chunk as it streams, escaped but for its line breaks and
    tabs. A CRLF line end is a line end: the CR that ends a chunk waits for the next one, so
    a CRLF split between two chunks is read as one too."""
    pending = ""
    for chunk in chunks:
        joined = pending + chunk
        whole, pending = (joined[:-1], "\r") if joined.endswith("\r") else (joined, "")
        if whole:
            yield escape(whole.replace("\r\n", "\n"), keep=LOG_KEEPS)
    if pending:
        yield escape(pending)


class Table(rich.table.Table):
    """rich's table whose ``str`` cells are API text (:func:`text`); other renderables are
    added as they are, so a styled cell is made with :func:`text` by its caller."""

    @classmethod
    def grid(cls, *headers: Any, **options: Any) -> Table:
        """rich's borderless grid, as this table (rich builds it with ``cls``)."""
        table = super().grid(*headers, **options)
        if not isinstance(table, cls):  # a rich that no longer builds grids with cls
            raise TypeError(f"rich's Table.grid made a {type(table).__name__}")
        return table

    def add_row(self, *renderables: Any, **options: Any) -> None:
        super().add_row(
            *(text(cell) if isinstance(cell, str) else cell for cell in renderables), **options
        )
