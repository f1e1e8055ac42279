"""Field errors and the one exception the API layer raises, worded as Kubernetes words them.

Upstream reports an invalid MPIJob as a Warning Event ``ValidationError`` whose message is
``Found validation errors: <aggregate>``; the wording here reproduces apimachinery's
``field.Error`` and ``ErrorList.ToAggregate()`` so that users see the same text.
Used by :mod:`mpijob.api.validation` and :mod:`mpijob.api.parsing`; the handlers read
:attr:`InvalidMPIJob.message`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

#: Event messages are cut to this many bytes, as upstream's ``truncateMessage`` does.
EVENT_MESSAGE_LIMIT = 1024


@dataclass(frozen=True)
class FieldError:
    """One problem with one field: ``<path>: <message>``."""

    path: str
    """Field path in Kubernetes notation, e.g. ``spec.mpiReplicaSpecs[Worker].replicas``."""
    message: str
    """What is wrong, e.g. ``Required value: must define number of replicas``."""

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


def go_quote(value: str) -> str:
    """A string quoted as Go's ``%q`` quotes it (printable ASCII kept, the rest escaped)."""
    out = ['"']
    for char in value:
        code = ord(char)
        if char in '"\\':
            out.append("\\" + char)
        elif char == "\n":
            out.append("\\n")
        elif char == "\t":
            out.append("\\t")
        elif char == "\r":
            out.append("\\r")
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


def required(path: str, detail: str) -> FieldError:
    """apimachinery ``field.Required``."""
    return FieldError(path, f"Required value: {detail}")


def invalid(path: str, value: object, detail: str) -> FieldError:
    """apimachinery ``field.Invalid``: strings are quoted, numbers and booleans are not."""
    return FieldError(path, f"Invalid value: {_render(value)}: {detail}")


def forbidden(path: str, detail: str) -> FieldError:
    """apimachinery ``field.Forbidden``."""
    return FieldError(path, f"Forbidden: {detail}")


def not_supported(path: str, value: object, supported: Iterable[str]) -> FieldError:
    """apimachinery ``field.NotSupported``, listing the supported values in sorted order."""
    listed = ", ".join(go_quote(v) for v in sorted(supported))
    return FieldError(path, f"Unsupported value: {_render(value)}: supported values: {listed}")


def _render(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return go_quote(value)
    if isinstance(value, int | float):
        return str(value)
    return go_quote(repr(value))


def aggregate(errors: Sequence[FieldError]) -> str:
    """``ErrorList.ToAggregate().Error()``: duplicates dropped, brackets around two or more."""
    seen: list[str] = []
    for error in errors:
        text = str(error)
        if text not in seen:
            seen.append(text)
    if len(seen) == 1:
        return seen[0]
    return "[" + ", ".join(seen) + "]"


def truncate_message(message: str, limit: int = EVENT_MESSAGE_LIMIT) -> str:
    """Cut a message to ``limit`` bytes, the last three becoming ``...``, as upstream does."""
    raw = message.encode()
    if len(raw) <= limit:
        return message
    return raw[: limit - 3].decode(errors="ignore") + "..."


def validation_message(errors: Sequence[FieldError]) -> str:
    """The Warning Event message for an invalid job: ``Found validation errors: ...``."""
    return truncate_message(f"Found validation errors: {aggregate(errors)}")


class InvalidMPIJob(ValueError):
    """The MPIJob cannot be reconciled; :attr:`errors` says which fields and why."""

    def __init__(self, errors: Sequence[FieldError]) -> None:
        self.errors: list[FieldError] = list(errors)
        super().__init__(self.message)

    @property
    def message(self) -> str:
        """The upstream-worded aggregate, ready for a Warning Event and a condition."""
        return validation_message(self.errors)
