"""Log lines: time, level, logger, object and every error text, in klog's text and zap's JSON."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator

import kopf
import pytest

from mpijob.objects import about
from mpijob.platform import logs
from support.log_lines import restored_logging

pytestmark = pytest.mark.unit

#: klog's header: severity letter, MMDD, time with microseconds, thread (pid), file:line.
KLOG = re.compile(r'^([IWEF])(\d{4}) (\d\d:\d\d:\d\d\.\d{6}) +(\d+) ([\w.]+):(\d+)\] "(.*?)"(.*)$')


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    with restored_logging() as out:
        yield out


def pairs(rest: str) -> dict[str, str]:
    return {k: json.loads(v) for k, v in re.findall(r' (\w+)=("(?:[^"\\]|\\.)*"|\S+)', rest)}


def test_a_text_line_has_time_level_logger_object_and_the_extra_error(
    stream: io.StringIO,
) -> None:
    logs.configure(stream=stream)
    logging.getLogger("mpijob.platform.recorder").warning(
        "Failed to post event",
        extra={"reason": "MPIJobCreated", "error": 'denied: "no"', **about("MPIJob", "ns", "pi")},
    )
    line = stream.getvalue().rstrip("\n")
    assert "\n" not in line
    found = KLOG.match(line)
    assert found, line
    letter, _, _, _, file, _, msg, rest = found.groups()
    assert (letter, file, msg) == ("W", "test_platform_logs.py", "Failed to post event")
    assert pairs(rest) == {
        "logger": "mpijob.platform.recorder",
        "object": "ns/pi",
        "kind": "MPIJob",
        "reason": "MPIJobCreated",
        "error": 'denied: "no"',
    }


def test_a_json_line_is_zaps_with_the_object_and_the_error(stream: io.StringIO) -> None:
    logs.configure(json_lines=True, stream=stream)
    logging.getLogger("mpijob.platform.recorder").warning(
        "Failed to post event",
        extra={"reason": "MPIJobCreated", "error": "denied", **about("MPIJob", "ns", "pi")},
    )
    line = json.loads(stream.getvalue())
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", line.pop("ts"))
    assert re.fullmatch(r"test_platform_logs\.py:\d+", line.pop("caller"))
    assert line == {
        "level": "warn",
        "logger": "mpijob.platform.recorder",
        "msg": "Failed to post event",
        "object": {"kind": "MPIJob", "namespace": "ns", "name": "pi"},
        "namespace": "ns",
        "name": "pi",
        "reason": "MPIJobCreated",
        "error": "denied",
    }


def raise_and_log(name: str) -> None:
    try:
        raise ConnectionResetError("peer went away")
    except ConnectionResetError:
        logging.getLogger(name).exception("Failed to post event")


def test_an_exception_keeps_its_text_and_traceback(stream: io.StringIO) -> None:
    logs.configure(stream=stream)
    raise_and_log("text")
    head, *stack = stream.getvalue().rstrip("\n").split("\n")
    assert head.startswith("E")
    assert pairs(head)["error"] == "ConnectionResetError: peer went away"
    assert stack
    assert all(s.startswith("\t") for s in stack)
    assert "raise_and_log" in "".join(stack)

    logs.configure(json_lines=True, stream=stream)
    stream.truncate(0)
    stream.seek(0)
    raise_and_log("json")
    line = json.loads(stream.getvalue())
    assert (line["level"], line["error"]) == ("error", "ConnectionResetError: peer went away")
    assert "raise_and_log" in line["stacktrace"]


def test_kopf_object_lines_name_their_object_and_drop_kopfs_internals(
    stream: io.StringIO,
) -> None:
    """Kopf's per-object loggers put the object in ``k8s_ref`` with its settings beside it."""
    logs.configure(json_lines=True, stream=stream)
    settings = kopf.OperatorSettings()
    settings.posting.enabled = False  # as the operator runs it (Kopf's poster may be installed)
    ref = {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u", "namespace": "ns"}
    logging.getLogger("kopf.objects").error(
        "Handler 'x' failed", extra={"k8s_ref": ref, "k8s_skip": True, "settings": settings}
    )
    line = json.loads(stream.getvalue())
    assert line["object"] == {"kind": "Pod", "namespace": "ns", "name": "p"}
    assert "settings" not in line
    assert "k8s_skip" not in line
    assert "k8s_ref" not in line


def test_quiet_by_default_verbose_shows_debug_and_kopfs_object_and_probe_lines(
    stream: io.StringIO,
) -> None:
    routine = {
        "kopf.objects": "Handler 'x' succeeded.",
        "kopf.activities.probe": "Activity 'heartbeat_age_seconds' succeeded.",
        "aiohttp.access": '127.0.0.1 "GET /healthz HTTP/1.1" 200',
    }
    logs.configure(stream=stream)
    logging.getLogger("mpijob.x").debug("hidden")
    for name, line in routine.items():
        logging.getLogger(name).info(line)
    assert stream.getvalue() == ""
    logging.getLogger("kopf.activities.probe").error("Activity 'x' failed permanently")
    assert len(stream.getvalue().splitlines()) == 1
    logs.configure(verbose=True, stream=stream)
    logging.getLogger("mpijob.x").debug("shown")
    for name, line in routine.items():
        logging.getLogger(name).info(line)
    assert len(stream.getvalue().splitlines()) == 1 + 1 + len(routine)


def test_configuring_again_replaces_the_handler(stream: io.StringIO) -> None:
    logs.configure(stream=stream)
    logs.configure(stream=stream)
    logging.getLogger("mpijob.x").info("once")
    assert len(stream.getvalue().splitlines()) == 1


def test_pythons_warnings_are_lines_of_the_same_format(stream: io.StringIO) -> None:
    import warnings

    logs.configure(json_lines=True, stream=stream)
    warnings.warn_explicit("old thing", DeprecationWarning, "x.py", 3)
    line = json.loads(stream.getvalue())
    assert (line["level"], line["logger"]) == ("warn", "py.warnings")
    assert "old thing" in line["msg"]
