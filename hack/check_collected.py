#!/usr/bin/env python3
"""Fails when a test file under tests/ is not collected by pytest.

pytest drops folders silently: its default ``norecursedirs`` holds names such as ``build`` and
``dist``, and a file whose module fails to import or skips itself is easy to miss in a long run.
This compares the ``test_*.py`` files under tests/ with the distinct files ``pytest
--collect-only`` reports (the whole suite, no marker), prints both counts and names every file
that is missing. Extra arguments go to pytest (e.g. ``-o norecursedirs=...`` to try a setting).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"


def collected(extra: list[str]) -> tuple[set[str], subprocess.CompletedProcess[str]]:
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    files = set()
    for line in result.stdout.splitlines():
        # `-q` lists node ids (path::name); `-qq` (-q also in PYTEST_ADDOPTS) lists "path: count".
        if "::" in line:
            files.add(line.split("::", 1)[0])
        elif m := re.fullmatch(r"(\S+\.py): \d+", line.strip()):
            files.add(m.group(1))
    return files, result


def main() -> int:
    found = {p.relative_to(ROOT).as_posix() for p in TESTS.rglob("test_*.py")}
    files, result = collected(sys.argv[1:])
    # 0: collected; 5: nothing collected, which the comparison below reports file by file.
    if result.returncode not in (0, 5):
        sys.stdout.write(result.stdout[-6000:])
        sys.stderr.write(result.stderr[-3000:])
        print(
            f"error: pytest --collect-only exited {result.returncode}: the suite does not "
            "collect (see above)",
            file=sys.stderr,
        )
        return 1
    print(f"test files: {len(found)} found, {len(files)} collected")
    missing = sorted(found - files)
    if missing:
        print(
            f"error: {len(missing)} test file(s) under tests/ are not collected by pytest:",
            file=sys.stderr,
        )
        for path in missing:
            print(f"  {path}", file=sys.stderr)
        print(
            "Causes: a folder name in pytest's norecursedirs (its default holds build, dist, "
            "venv, *.egg, .*; see [tool.pytest.ini_options] in pyproject.toml), a module that "
            "skips itself, or a file with no test in it.",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
