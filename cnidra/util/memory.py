"""The process's memory: glibc gives each thread that allocates its own malloc arena (up to 8 per
core), and the driver's threads (gRPC's, asyncio's workers for fsync and links) each keep
megabytes of freed memory in theirs. Two arenas are plenty for a process whose work is on one
event loop. And asyncio gives each TLS connection a read buffer of 256 KiB, zeroed whole when
the connection is made: the driver's 20-odd connections to the apiserver held 5 MiB in them.
And Python's cyclic garbage collector walks every tracked object at each full collection: the
driver's are, once it is up, mostly its modules' (about 400,000 objects), which never become
garbage, and a full collection in a burst of prepares stalled the loop for tens of
milliseconds."""

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
# objects allocated, less those freed, between two young collections (Python's default: 700):
# a prepare of 100 claims allocates tens of thousands, and made about 40 young collections
YOUNG_COLLECTION = 10_000


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


def settle_gc(young: int = YOUNG_COLLECTION) -> int:
    """Once the process is up: what it holds now (its modules, its wiring) is collected once and
    frozen, so no later collection walks it (gc.freeze), and the young generation is collected
    after `young` allocations rather than 700 (the older generations keep their ratios). Cyclic
    garbage is still collected, later and in fewer passes; what was frozen is still freed by
    reference counting, and only a reference cycle among those objects is never collected
    (start-up's live as long as the process). Without it, each full collection walked the whole
    heap, 60-70 ms on the event loop in the middle of a 100-claim prepare. The objects frozen."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(young, older, oldest)
    return gc.get_freeze_count()
