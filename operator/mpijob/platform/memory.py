"""The process's allocator: large blocks go back to the system as soon as they are freed.

The operator decodes every object it watches whole before its caches keep a summary of it
(:func:`mpijob.handlers.watches.kept_metadata`), and anyone with ``edit`` in a namespace can
make an object of a MiB or more (a ConfigMap's data, a pod's 256 KiB of annotations). glibc
serves a block of 128 KiB or more with its own mapping, returned when freed, but it raises that
threshold to the size of every such block freed (up to 32 MiB): after the first few, MiB-sized
blocks come from the heap, whose freed space the process keeps. Measured here (40 pods and 40
ConfigMaps carrying 40 MiB, ``tests/integration/test_tenant_memory.py``): 9.5 MiB kept for good
with the moving threshold, 1.8 MiB with it fixed. Fixing it is what ``MALLOC_MMAP_THRESHOLD_``
does, set here so that every way of starting the operator gets it.
"""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger(__name__)

#: glibc's ``M_MMAP_THRESHOLD`` (malloc.h); setting it also ends its dynamic adjustment.
_M_MMAP_THRESHOLD = -3
#: glibc's default: blocks from this size up have mappings of their own.
MMAP_THRESHOLD_BYTES = 128 * 1024


def give_back_large_blocks() -> bool:
    """Fix glibc's mmap threshold at :data:`MMAP_THRESHOLD_BYTES`; False where the C library
    has no ``mallopt`` (musl) or refuses."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
