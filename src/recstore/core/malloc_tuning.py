"""glibc malloc tuning for the processes that move large messages: PS nodes and trainers.

Every data-path request and reply of a big batch allocates and frees buffers of
megabytes: the request's bytes, gRPC's copies of them, the rows pulled and
their gradients. glibc serves such a buffer with a fresh mmap(), or from a heap
whose free top it gives back to the kernel once it exceeds a small threshold;
either way the next step's buffers are fresh memory, and every 4 kB page of
them faults in (the kernel zeroes it) as it is first written. Raising the mmap
and trim thresholds keeps them in the heap for reuse: what the
``MALLOC_MMAP_THRESHOLD_``/``MALLOC_TRIM_THRESHOLD_``/``MALLOC_TOP_PAD_``
environment variables do, applied at run time with mallopt(3).

PS nodes apply it at start (``recstore ps-node --no-malloc-tuning`` leaves
malloc as it is). The SDK's gRPC backend and a reshard's runner
(``recstore.core.reshard.protocol.ReshardRun``: the provisioner's or the operator's process)
apply it once per process unless ``RECSTORE_MALLOC_TUNING`` is 0/false/no/off:
a trainer's step over gRPC paid page faults on megabytes of such buffers every
step, and a move on every page it copied (docs/sdk.md and docs/ps-node.md have
the figures). The cost is memory kept for reuse: at most the trim threshold at the
top of each heap.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import threading
from collections.abc import Mapping

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

#: set to 0, false, no or off: the SDK leaves this process's malloc as it is
ENV = "RECSTORE_MALLOC_TUNING"
_OFF = frozenset({"0", "false", "no", "off"})

_lock = threading.Lock()
_applied: bool | None = None  # None: the SDK has not decided yet


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


def wanted(environ: Mapping[str, str]) -> bool:
    """Whether the SDK may tune this process's malloc (``ENV`` unset, or not an off word)."""
    return environ.get(ENV, "").strip().lower() not in _OFF


def apply_once(environ: Mapping[str, str] = os.environ) -> bool:
    """The SDK's call: apply the settings the first time, unless ``ENV`` says not to;
    returns whether they are in effect. Later calls return the first answer."""
    global _applied
    with _lock:
        if _applied is None:
            _applied = wanted(environ) and apply()
        return _applied
