"""Runs ``python -m mpijob`` with tracemalloc on, for finding what a long-running operator keeps.

``python -m bench.memtrace DIR run ...`` is ``python -m mpijob run ...`` with every allocation
traced (``MEMTRACE_FRAMES`` frames each, default 12) and SIGUSR2 writing a snapshot to
``DIR/<n>.snap`` (n counting from 0). ``bench.soak --trace-memory`` sends it at each checkpoint
and prints what grew between the first and the last; ``top`` does the same for any two:
``python -m bench.memtrace top A.snap B.snap``. Tracing slows the operator down several times:
for finding growth, never for timing.
"""

from __future__ import annotations

import gc
import itertools
import json
import os
import runpy
import signal
import sys
import tracemalloc
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
    return {"kinds": dict(kinds.most_common()), "names": names}


def _serve(out: Path) -> None:
    counter = itertools.count()

    def dump(signum: int, frame: FrameType | None) -> None:
        path = out / f"{next(counter)}.snap"
        path.with_suffix(".objects.json").write_text(json.dumps(_objects(), indent=1))
        tracemalloc.take_snapshot().dump(str(path.with_suffix(".tmp")))
        path.with_suffix(".tmp").rename(path)  # whole or absent: the reader polls for it

    out.mkdir(parents=True, exist_ok=True)
    tracemalloc.start(int(os.environ.get("MEMTRACE_FRAMES", "12")))
    signal.signal(signal.SIGUSR2, dump)
    sys.argv = ["mpijob", *sys.argv[2:]]
    runpy.run_module("mpijob", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["top"]:
        print("\n".join(growth(Path(sys.argv[2]), Path(sys.argv[3]))))
    else:
        _serve(Path(sys.argv[1]))
