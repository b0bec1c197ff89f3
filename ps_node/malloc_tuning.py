"""glibc malloc tuning for large gRPC messages.

Every Pull/Push of a big batch allocates and frees buffers of tens of MB. By
default glibc serves those with fresh mmap()s and returns them at once, so each
request pays page faults on the whole buffer; raising the mmap and trim
thresholds keeps them in the heap for reuse (the same effect as the
MALLOC_MMAP_THRESHOLD_/MALLOC_TRIM_THRESHOLD_/MALLOC_TOP_PAD_ environment
variables, applied at start-up with mallopt(3)).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3

#: glibc caps the mmap threshold at 32 MiB on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX).
SETTINGS = {
    M_MMAP_THRESHOLD: 32 << 20,
    M_TRIM_THRESHOLD: 512 << 20,
    M_TOP_PAD: 64 << 20,
}


def apply() -> bool:
    """Apply the settings; False where the C library has no mallopt (not glibc)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    ok = all(mallopt(param, value) == 1 for param, value in SETTINGS.items())
    if not ok:
        log.warning("mallopt refused part of the malloc tuning")
    return ok
