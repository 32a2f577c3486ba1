"""The process's memory: glibc gives each thread that allocates its own malloc arena (up to 8 per
core), and the driver's threads (gRPC's, asyncio's workers for fsync and links) each keep
megabytes of freed memory in theirs. Two arenas are plenty for a process whose work is on one
event loop."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)
M_ARENA_MAX = -8  # glibc <malloc.h>


def cap_malloc_arenas(arenas: int = 2) -> bool:
    """mallopt(M_ARENA_MAX); False where the C library is not glibc. Call before threads
    start."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        return bool(libc.mallopt(M_ARENA_MAX, arenas))
    except (OSError, AttributeError) as exc:
        log.debug("mallopt not available: %s", exc)
        return False
