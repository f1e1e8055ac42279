"""Where an operator process spends its CPU: py-spy's samples, summed per function.

``bench.reconcile --profile`` records the operator with ``py-spy record --format raw`` (samples
of the threads that run, idle ones left out) and prints :func:`top` of the file. ``python -m
bench.profile FILE`` prints it again. Each raw line is one stack, outermost frame first, and how
many samples saw it; a function's *self* share is of the samples it was the innermost frame of,
its *total* share of the samples it was anywhere in.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

# "name (path/to/file.py:123)": the line number is dropped, so a function is one row.
_FRAME = re.compile(r"^(?P<name>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")


def _function(frame: str) -> str:
    match = _FRAME.match(frame.strip())
    if not match:
        return frame.strip()
    path = match["file"]
    for marker in ("/site-packages/", "/operator/", "/lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{match['name']} ({path})"


def tally(raw: str) -> tuple[Counter[str], Counter[str], int]:
    """Self and total samples per function, and all samples, of py-spy's raw output."""
    own: Counter[str] = Counter()
    anywhere: Counter[str] = Counter()
    samples = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        samples += n
        frames = [_function(f) for f in stack.split(";") if f]
        # A thread's name can be the outermost "frame"; it is in every stack of that thread.
        frames = [f for f in frames if "(" in f]
        if frames:
            own[frames[-1]] += n
        for f in set(frames):
            anywhere[f] += n
    return own, anywhere, samples


def top(path: Path, limit: int = 15) -> list[str]:
    own, anywhere, samples = tally(path.read_text(errors="replace"))
    if not samples:
        return [f"{path}: no samples"]
    lines = [f"{samples} samples in {path.name}; self share (innermost frame):"]
    lines += [f"  {n / samples:6.1%}  {f}" for f, n in own.most_common(limit)]
    lines.append("total share (anywhere on the stack), the operator's own functions:")
    mine = [(f, n) for f, n in anywhere.most_common() if "(mpijob/" in f]
    lines += [f"  {n / samples:6.1%}  {f}" for f, n in mine[:limit]]
    return lines


if __name__ == "__main__":
    print("\n".join(top(Path(sys.argv[1]))))
