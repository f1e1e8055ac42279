"""Runs ``python -m mpijob`` so that what a long-running operator keeps can be found.

``python -m bench.memtrace DIR run ...`` is ``python -m mpijob run ...`` where SIGUSR2 writes a
reading ``DIR/<n>.json`` (n counting from 0): the Kubernetes objects alive in the process by
kind, with a chain of what holds one of each, and the resident memory before and after
``malloc_trim(0)`` (the part that is freed memory the C allocator had not given back). With
``MEMTRACE_FRAMES`` above 0 (default 12) every allocation is traced too and ``DIR/<n>.snap`` is
a tracemalloc snapshot (from the ``MEMTRACE_AFTER``-th reading on, when set: tracing starts
then); ``top`` prints what grew between two: ``python -m bench.memtrace top
A.snap B.snap``. Tracing slows the operator down several times: for finding growth, never for
timing. ``bench.soak --trace-memory`` takes a reading at each checkpoint.
"""

from __future__ import annotations

import ctypes
import gc
import itertools
import json
import os
import runpy
import signal
import sys
import tracemalloc
import types
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

# Allocations of the tracer itself and of the import system are noise in any diff.
_NOISE = (
    tracemalloc.Filter(False, tracemalloc.__file__),
    tracemalloc.Filter(False, "<frozen importlib._bootstrap>"),
    tracemalloc.Filter(False, "<frozen importlib._bootstrap_external>"),
)


def growth(first: Path, last: Path, limit: int = 12) -> list[str]:
    """The ``limit`` tracebacks whose traced memory grew most from ``first`` to ``last``."""
    old = tracemalloc.Snapshot.load(str(first)).filter_traces(_NOISE)
    new = tracemalloc.Snapshot.load(str(last)).filter_traces(_NOISE)
    lines = []
    total = sum(s.size for s in new.statistics("filename")) - sum(
        s.size for s in old.statistics("filename")
    )
    lines.append(f"traced memory grew {total / 1024:+.0f} KiB")
    for stat in new.compare_to(old, "traceback")[:limit]:
        lines.append(f"{stat.size_diff / 1024:+8.0f} KiB {stat.count_diff:+7d} blocks")
        lines.extend(f"      {frame}" for frame in stat.traceback.format()[-12:])
    return lines


def _objects() -> dict[str, Any]:
    """Kubernetes objects alive in the process (dicts with kind and metadata), counted by kind,
    with a few of their names: what the allocation tracebacks cannot say, who is kept."""
    gc.collect()
    kinds: Counter[str] = Counter()
    names: dict[str, list[str]] = {}
    for obj in gc.get_objects():
        if isinstance(obj, dict) and "metadata" in obj and isinstance(obj["metadata"], dict):
            kind = str(obj.get("kind") or "?")
            kinds[kind] += 1
            some = names.setdefault(kind, [])
            if len(some) < 5:
                some.append(str(obj["metadata"].get("name")))
    return {
        "kinds": dict(kinds.most_common()),
        "names": names,
        "held_by": _holders(names),
        "types": _types(),
    }


def _types() -> dict[str, int]:
    """Every object the collector tracks, counted by type (functions by name): what grows
    that is no Kubernetes object (tasks, handles, closures, models)."""
    counts: Counter[str] = Counter(_type_name(o) for o in gc.get_objects())
    return dict(counts.most_common(400))


def _type_name(obj: object) -> str:
    """Its type; for a function, which one (closures piling up are told apart by name)."""
    if isinstance(obj, types.FunctionType):
        return f"function {obj.__module__}.{obj.__qualname__}"
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def types_grown(first: dict[str, Any], last: dict[str, Any], limit: int = 15) -> list[str]:
    """The ``limit`` types whose count of live objects grew most between two readings."""
    old, new = first.get("types") or {}, last.get("types") or {}
    grown = sorted(((n - old.get(t, 0), t) for t, n in new.items()), reverse=True)[:limit]
    return [f"{diff:+8d}  {name} ({new[name]} alive)" for diff, name in grown if diff > 0]


def _describe(obj: object) -> str:
    if isinstance(obj, dict):
        return f"dict keys={list(obj)[:6]}"
    if isinstance(obj, (list, tuple, set)):
        return f"{type(obj).__name__} len={len(obj)}"
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    return f"{type(obj).__module__}.{type(obj).__qualname__} {name or ''}".strip()


def _holders(names: dict[str, list[str]], depth: int = 8) -> dict[str, list[str]]:
    """For the first object of each kind: a chain of what refers to it, ``depth`` steps out
    (each step the first referrer that is not a frame)."""
    wanted = {kind: name[0] for kind, name in names.items() if name}
    found: dict[str, object] = {}
    objects = gc.get_objects()
    for obj in objects:
        if isinstance(obj, dict) and isinstance(obj.get("metadata"), dict):
            kind = str(obj.get("kind") or "?")
            if kind not in found and obj["metadata"].get("name") == wanted.get(kind):
                found[kind] = obj
    del objects
    chains: dict[str, list[str]] = {}
    # This function's own containers refer to what it looks at: they are no holders.
    ignore = {id(found), id(chains)}
    for kind in list(found):
        here = found.pop(kind)
        chain: list[str] = []
        ignore.add(id(chain))
        for _ in range(depth):
            refs = [
                r
                for r in gc.get_referrers(here)
                if id(r) not in ignore and not isinstance(r, FrameType)
            ]
            ignore.add(id(refs))
            if not refs:
                break
            here = refs[0]
            chain.append(_describe(here))
        chains[kind] = chain
    return chains


def _rss_mib() -> float:
    status = Path("/proc/self/status").read_text()
    return int(next(x for x in status.splitlines() if x.startswith("VmRSS:")).split()[1]) / 1024


def _serve(out: Path) -> None:
    counter = itertools.count()

    frames = int(os.environ.get("MEMTRACE_FRAMES", "12"))
    # Tracing from the n-th reading on: the run gets to steady state at full speed first.
    after = int(os.environ.get("MEMTRACE_AFTER", "0"))
    libc = ctypes.CDLL("libc.so.6")

    def dump(signum: int, frame: FrameType | None) -> None:
        n = next(counter)
        path = out / f"{n}.json"
        reading: dict[str, Any] = _objects()
        if tracemalloc.is_tracing():
            tracemalloc.take_snapshot().dump(str(path.with_suffix(".snap")))
        elif frames and n + 1 == after:
            tracemalloc.start(frames)
        reading["rss_mib"] = _rss_mib()
        libc.malloc_trim(0)
        reading["rss_trimmed_mib"] = _rss_mib()
        path.with_suffix(".tmp").write_text(json.dumps(reading, indent=1))
        path.with_suffix(".tmp").rename(path)  # whole or absent: the reader polls for it

    out.mkdir(parents=True, exist_ok=True)
    if frames and not after:
        tracemalloc.start(frames)
    signal.signal(signal.SIGUSR2, dump)
    sys.argv = ["mpijob", *sys.argv[2:]]
    runpy.run_module("mpijob", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["top"]:
        print("\n".join(growth(Path(sys.argv[2]), Path(sys.argv[3]))))
    else:
        _serve(Path(sys.argv[1]))
