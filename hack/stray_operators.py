#!/usr/bin/env python3
"""Refuses to run the tests while another of our operators could reconcile the tests' jobs.

Each integration test starts its own operator watching only the test's fresh namespace
(``t-<test>-<random>``, tests/conftest.py). Any other operator whose scope can include such a
namespace (one watching all namespaces, e.g. a demo operator left by an older ``make demo``, or
``make run``) reconciles the same jobs: two writers, and tests that fail at random. Operators
scoped to other namespaces (``make demo``'s watches ``demo``) are harmless and left alone.

Exit status 1, naming each such process and how to stop it; 0 when there is none.
"""

from __future__ import annotations

import contextlib
import re
import sys
from pathlib import Path

from hack import cluster

TEST_NAMESPACE_PREFIX = "t-"  # the `namespace` fixture of tests/conftest.py


def operator_args(argv: list[str]) -> list[str] | None:
    """The arguments after ``run`` when argv runs our operator, else None."""
    rest: list[str] | None = None
    if argv and Path(argv[0]).name == "mpijob-operator":
        rest = argv[1:]
    elif argv and Path(argv[0]).name.startswith("python"):
        # The interpreter's own options end at -m, -c or the script: what follows is the program's.
        i = 1
        while i < len(argv) and argv[i].startswith("-") and argv[i] not in ("-m", "-c"):
            i += 2 if argv[i] in ("-W", "-X") else 1
        if argv[i : i + 2] == ["-m", "mpijob"]:
            rest = argv[i + 2 :]
        elif i < len(argv) and Path(argv[i]).name == "mpijob-operator":
            rest = argv[i + 1 :]
    if rest and rest[0] == "run":
        return rest[1:]
    return None


def namespaces(args: list[str], environ: dict[str, str]) -> list[str]:
    """The namespace patterns of ``run`` (option or KUBEFLOW_NAMESPACE); empty means all."""
    found = []
    it = iter(args)
    for arg in it:
        if arg in ("--namespace", "-n"):
            found.append(next(it, ""))
        elif arg.startswith("--namespace="):
            found.append(arg.split("=", 1)[1])
        elif arg.startswith("-n") and not arg.startswith("--"):
            found.append(arg[2:])
    if not found and environ.get("KUBEFLOW_NAMESPACE"):
        # click splits a multiple option's environment variable on whitespace
        found = environ["KUBEFLOW_NAMESPACE"].split()
    return found


def may_watch_test_namespaces(patterns: list[str]) -> bool:
    """Whether Kopf's namespace patterns can match a namespace the tests create.

    Test namespaces end in a random suffix, so only a glob can match one: an inclusive glob
    whose literal start agrees with the tests' prefix, or a leading exclusion (an implied
    catch-all). Erring towards yes is safe: the message says how to stop the process.
    """
    if not patterns:
        return True
    for pattern in patterns:
        parts = [p.strip() for p in pattern.split(",") if p.strip()]
        if not parts or parts[0].startswith("!"):
            return True
        for part in parts:
            if part.startswith("!"):
                continue
            literal = re.split(r"[*?\[]", part, maxsplit=1)[0]
            if literal != part and (
                TEST_NAMESPACE_PREFIX.startswith(literal)
                or literal.startswith(TEST_NAMESPACE_PREFIX)
            ):
                return True
    return False


def process(pid: int) -> tuple[list[str], dict[str, str]] | None:
    """argv and environment of a process, or None once it is gone or unreadable."""
    proc = Path(f"/proc/{pid}")
    try:
        argv = proc.joinpath("cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return None
    environ: dict[str, str] = {}
    with contextlib.suppress(OSError):  # another user's process: its flags still tell
        for item in proc.joinpath("environ").read_bytes().decode(errors="replace").split("\0"):
            key, sep, value = item.partition("=")
            if sep:
                environ[key] = value
    return argv, environ


def watched_namespaces(pid: int) -> list[str] | None:
    """The namespace patterns of our operator running as pid (empty: all), or None."""
    found = process(pid)
    if found is None:
        return None
    argv, environ = found
    args = operator_args(argv)
    return None if args is None else namespaces(args, environ)


def strays() -> list[tuple[int, list[str], str]]:
    """(pid, namespaces, argv as text) of every operator that may watch the tests' namespaces."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or not cluster.alive(int(entry.name)):
            continue
        pid = int(entry.name)
        watched = watched_namespaces(pid)
        if watched is not None and may_watch_test_namespaces(watched):
            argv = process(pid)
            out.append((pid, watched, " ".join(argv[0]) if argv else "?"))
    return out


def main() -> int:
    found = strays()
    if not found:
        return 0
    pid_file = cluster.state_dir() / "operator.pid"
    demo_pid = -1
    with contextlib.suppress(OSError, ValueError):
        demo_pid = int(pid_file.read_text())
    print(
        "error: another mpijob operator may reconcile the tests' jobs (each test runs its own, "
        "scoped to the test's namespace); stop it first:",
        file=sys.stderr,
    )
    for pid, watched, argv in found:
        scope = "all namespaces" if not watched else "namespaces " + " ".join(watched)
        if pid == demo_pid:
            origin, how = (
                f", started by `make demo` ({pid_file})",
                f"make cluster-down (or kill {pid})",
            )
        else:
            origin, how = "", f"kill {pid}"
        print(f"  pid {pid} watches {scope}{origin}: {argv}", file=sys.stderr)
        print(f"    stop it: {how}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
