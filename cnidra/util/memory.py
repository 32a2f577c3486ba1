"""The process's memory: glibc gives each thread that allocates its own malloc arena (up to 8 per
core), and the driver's threads (gRPC's, asyncio's workers for fsync and links) each keep
megabytes of freed memory in theirs. Two arenas are plenty for a process whose work is on one
event loop. And asyncio gives each TLS connection a read buffer of 256 KiB, zeroed whole when
the connection is made: the driver's 20-odd connections to the apiserver held 5 MiB in them."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
from asyncio import sslproto

log = logging.getLogger(__name__)
M_ARENA_MAX = -8  # glibc <malloc.h>
# bytes a TLS connection reads from its socket at once: four TLS records of the largest kind
# (16 KiB); a longer answer is read in more turns of the loop, as the kernel has it
TLS_READ_BYTES = 64 * 1024


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


def small_tls_reads(size: int = TLS_READ_BYTES) -> int:
    """Bound the read buffer of the TLS connections made from here on (asyncio's
    SSLProtocol.max_size, 256 KiB in Python 3.11; never raised); the size now in force."""
    sslproto.SSLProtocol.max_size = min(sslproto.SSLProtocol.max_size, size)
    return sslproto.SSLProtocol.max_size


def freeze_startup_heap() -> int:
    """Once started: what the process holds then (its modules, classes, schemas, clients; the
    bulk of its heap) collected once and set aside from the cyclic garbage collector, whose
    full collections then walk only what was made since; the number of objects set aside.
    Without it each full collection of the driver walked the whole heap, about 70 ms on the
    event loop, in the middle of a NodePrepareResources (a batch's p99). What is set aside is
    still freed by reference counting as before; only a reference cycle among those objects is
    never collected (startup's are there for the process's life)."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
