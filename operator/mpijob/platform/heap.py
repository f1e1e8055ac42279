"""Freed memory given back to the system, so that a long-running operator does not grow.

Every job brings allocations that go with it: watch events, bodies, plans, requests. CPython
returns its own arenas of small objects once they empty, but larger blocks come from the C
library's ``malloc``, and glibc keeps what is freed inside its heaps whenever a block still in
use sits above it. The process then grows with the number of jobs it has seen while the memory
it uses does not: in ``make bench-soak``, from 500 to 3,000 job lifecycles, the resident memory
rose from 90.3 to 91.6 MiB while what ``malloc_trim`` left stayed between 88.3 and 88.6 MiB
(docs/scale.md, "Long life").

:func:`give_back_forever` asks glibc to return its free pages (``malloc_trim(0)``) every
:data:`TRIM_SECONDS`, in a worker thread so that the event loop never waits for it. It needs no
Lease: a standby's memory is its own. Where the C library is not glibc there is no such call,
and nothing is done.

:func:`give_back_large_blocks`, called once when the process starts, keeps glibc's mmap
threshold fixed. The operator decodes every object it watches whole before its caches keep a
summary of it (:func:`mpijob.handlers.watches.kept_metadata`), and anyone with ``edit`` in a
namespace can make objects of a MiB (a ConfigMap's data, a pod's 256 KiB of annotations). glibc
serves a block of 128 KiB or more with its own mapping, returned when freed, but raises that
threshold to the size of every such block freed (up to 32 MiB): after the first few, MiB-sized
blocks come from the heap, whose freed space the process keeps. Measured
(``tests/integration/test_tenant_memory.py``, 40 pods and 40 ConfigMaps carrying 40 MiB): 9.5 MiB
kept with the moving threshold, 1.9 MiB with it fixed. It is what ``MALLOC_MMAP_THRESHOLD_``
does, set here so that every way of starting the operator gets it.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

#: How often freed memory is given back. A trim of the operator's heap takes a few
#: milliseconds in a thread; a minute keeps what is kept to one minute's churn.
TRIM_SECONDS = 60.0


#: glibc's ``M_MMAP_THRESHOLD`` (malloc.h); setting it also ends its dynamic adjustment.
_M_MMAP_THRESHOLD = -3
#: glibc's default: blocks from this size up have mappings of their own.
MMAP_THRESHOLD_BYTES = 128 * 1024


def _libc(function: str) -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    """The C library's ``function``, or None where it has none (musl, macOS)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return getattr(ctypes.CDLL(name), function)
    except (OSError, AttributeError):
        return None


def malloc_trim() -> Callable[[], object] | None:
    """glibc's ``malloc_trim(0)``, or None where the C library has none (musl, macOS)."""
    trim = _libc("malloc_trim")
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: trim(0)


def give_back_large_blocks() -> bool:
    """Fix glibc's mmap threshold at :data:`MMAP_THRESHOLD_BYTES`; False where the C library
    has no ``mallopt`` or refuses."""
    mallopt = _libc("mallopt")
    if mallopt is None:
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))


async def give_back_forever(
    interval: float = TRIM_SECONDS, trim: Callable[[], object] | None = None
) -> None:
    """Give freed memory back every ``interval`` seconds until cancelled."""
    trim = trim or malloc_trim()
    if trim is None:
        log.info("The C library has no malloc_trim: freed memory is left to it")
        return
    while True:
        await asyncio.sleep(interval)
        started = time.perf_counter()
        await asyncio.to_thread(trim)
        log.debug("Gave freed memory back in %.1f ms", 1000 * (time.perf_counter() - started))
