"""The operator's log lines, Kopf's included, as Kubernetes' Go controllers print theirs.

Each line says when, how bad, which logger, and which object it is about, so that the person on
call can grep one job's story and a log pipeline can index it:

- ``text`` (the default) is klog's header and its structured ``key="value"`` pairs, as upstream
  mpi-operator and the Kubernetes components print them::

    W1127 00:02:12.345678      1 recorder.py:287] "Failed to post event" \
        logger="mpijob.platform.recorder" object="demo/pi" kind="MPIJob" error="(403) ..."

  (one line; broken here to fit).

  An exception's traceback follows on indented lines, as zap's console encoder prints a stack.

- ``json`` is controller-runtime's zap JSON (keys ``ts``, ``level``, ``logger``, ``caller``,
  ``msg``; the object as ``object`` with ``namespace`` and ``name`` beside it; an exception as
  ``error`` and ``stacktrace``)::

    {"ts":"2026-11-27T00:02:12.345678Z","level":"warn","logger":"mpijob.platform.recorder",...}

The object comes from the record's ``k8s_ref``: Kopf's per-object loggers set it, and the
operator's own lines pass :func:`mpijob.objects.about` as ``extra=``. Every other ``extra=``
field is printed too (Python's default format drops them, and with them the error text some
lines carry only there).

Kopf's own :func:`kopf.configure` is not called: it installs a second handler with Kopf's format;
its one other effect, silencing the ``asyncio`` logger, would hide a failed task's error.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from datetime import UTC, datetime
from typing import Any, TextIO

import orjson

from mpijob.objects import LOG_REF

#: LogRecord attributes that are the record itself, not ``extra=`` fields to print.
_RECORD_FIELDS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message",
    "asctime",
    "taskName",
}
#: ``extra=`` fields Kopf's object loggers add that are no part of the line.
_KOPF_FIELDS = frozenset({"settings", "k8s_skip", LOG_REF})

#: klog's severity letters; klog has no debug severity (its verbose lines are ``I``).
_KLOG_LETTER = {logging.DEBUG: "I", logging.INFO: "I", logging.WARNING: "W", logging.ERROR: "E"}
#: zap's level names.
_ZAP_LEVEL = {logging.DEBUG: "debug", logging.INFO: "info", logging.WARNING: "warn"}


def _object(record: logging.LogRecord) -> dict[str, Any]:
    ref = getattr(record, LOG_REF, None)
    return ref if isinstance(ref, dict) else {}


def _extra(record: logging.LogRecord) -> dict[str, Any]:
    return {
        k: v
        for k, v in vars(record).items()
        if k not in _RECORD_FIELDS and k not in _KOPF_FIELDS and not k.startswith("_")
    }


def _error(record: logging.LogRecord) -> tuple[str, str]:
    """The exception's one-line text and its traceback ("" without one)."""
    if not record.exc_info or record.exc_info[1] is None:
        return "", record.stack_info or ""
    error = record.exc_info[1]
    text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    stack = "".join(traceback.format_exception(*record.exc_info)).rstrip()
    return text, stack


def _value(v: Any) -> Any:
    """A value JSON can hold: itself, or its text."""
    return v if isinstance(v, (str, int, float, bool, type(None), list, dict)) else str(v)


class KlogFormatter(logging.Formatter):
    """klog's text format with structured key/value pairs."""

    def __init__(self) -> None:
        super().__init__()
        self._pid = os.getpid()

    def format(self, record: logging.LogRecord) -> str:
        at = datetime.fromtimestamp(record.created, UTC)
        letter = _KLOG_LETTER.get(record.levelno, "E" if record.levelno < logging.CRITICAL else "F")
        pairs: dict[str, Any] = {"logger": record.name}
        ref = _object(record)
        if ref.get("name"):
            ns = ref.get("namespace")
            pairs["object"] = f"{ns}/{ref['name']}" if ns else ref["name"]
            if ref.get("kind"):
                pairs["kind"] = ref["kind"]
        pairs |= _extra(record)
        error, stack = _error(record)
        if error and "error" not in pairs:
            pairs["error"] = error
        head = (
            f"{letter}{at:%m%d %H:%M:%S}.{at.microsecond:06d} {self._pid:>7} "
            f"{record.filename}:{record.lineno}] {_quote(record.getMessage())}"
        )
        line = " ".join([head, *(f"{k}={_quote(v)}" for k, v in pairs.items())])
        if stack:
            line += "\n" + "\n".join("\t" + s for s in stack.splitlines())
        return line


def _quote(v: Any) -> str:
    """klog's quoting: strings double-quoted with Go's escapes (JSON's, for what logs hold),
    numbers and booleans bare, anything else as JSON."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, str):
        return orjson.dumps(v).decode()
    return orjson.dumps(_value(v), default=str).decode()


class ZapJsonFormatter(logging.Formatter):
    """controller-runtime's zap JSON: one object a line."""

    def format(self, record: logging.LogRecord) -> str:
        at = datetime.fromtimestamp(record.created, UTC)
        line: dict[str, Any] = {
            "ts": f"{at:%Y-%m-%dT%H:%M:%S}.{at.microsecond:06d}Z",
            "level": _ZAP_LEVEL.get(
                record.levelno, "error" if record.levelno < logging.CRITICAL else "fatal"
            ),
            "logger": record.name,
            "caller": f"{record.filename}:{record.lineno}",
            "msg": record.getMessage(),
        }
        ref = _object(record)
        if ref.get("name"):
            line["object"] = {k: ref[k] for k in ("kind", "namespace", "name") if ref.get(k)}
            if ref.get("namespace"):
                line["namespace"] = ref["namespace"]
            line["name"] = ref["name"]
        for k, v in _extra(record).items():
            line.setdefault(k, _value(v))
        error, stack = _error(record)
        if error:
            line.setdefault("error", error)
        if stack:
            line["stacktrace"] = stack
        return orjson.dumps(line, default=str).decode()


#: Loggers whose info lines are routine, one per pod event or per probe: Kopf's per-object
#: lines ("Handler ... succeeded."), its probe activity's ("Activity ... succeeded." at every
#: liveness probe) and aiohttp's access log (a line per request that Kopf's probe and webhook
#: servers answer). Shown only with ``verbose``; their warnings and errors always.
QUIET_UNLESS_VERBOSE = ("kopf.objects", "kopf.activities.probe", "aiohttp.access")


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """The operator's handler, recognised when :func:`configure` runs again (tests)."""


def configure(
    *, verbose: bool = False, json_lines: bool = False, stream: TextIO | None = None
) -> None:
    """Every logger's lines to ``stream`` (stderr) in the text or JSON format; debug lines only
    with ``verbose``, and the routine lines of :data:`QUIET_UNLESS_VERBOSE` (one per pod event
    or per probe) only then too."""
    handler = _Handler(stream or sys.stderr)
    handler.setFormatter(ZapJsonFormatter() if json_lines else KlogFormatter())
    root = logging.getLogger()
    root.handlers[:] = [h for h in root.handlers if not isinstance(h, _Handler)]
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    for name in QUIET_UNLESS_VERBOSE:
        logging.getLogger(name).setLevel(logging.NOTSET if verbose else logging.WARNING)
    logging.captureWarnings(True)  # Python's warnings as lines of the same format (py.warnings)
