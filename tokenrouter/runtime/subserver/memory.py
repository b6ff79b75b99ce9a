"""Keep a long-running serving process's heap from creeping up, without paying for it in
page faults.

glibc raises its mmap threshold each time a large block is freed, so blocks of a few MB
(a step's activations, whose size changes with the batch) end up in the heap, where freed
space fragments and RSS grows for hours. Measured: 1,200 oneDNN products of changing row
counts, then the same again, grew a process by 143-274 MB the second time round. Fixing the
threshold stops that, because it also stops glibc raising its trim threshold, so freed space
at the heap's top goes back to the system.

The threshold is fixed at 32 MB, the most glibc's own adjustment would reach. At 1 MB, every
activation over 1 MB was a fresh mapping whose pages faulted in on every step: the bench
pair's large model ran its ~170-row extends 13-25% slower per token than with glibc's
default (the serving step 1.3x the profile's), and the second sweep grew the process by
3-7 MB; at 8-64 MB the extends run at the default's speed and the second sweep grows it by
nothing measurable (`tests/runtime/test_process_memory.py`).
"""

from __future__ import annotations

import ctypes

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number
MMAP_THRESHOLD_BYTES = 32 << 20


def bound_heap_growth() -> bool:
    """Fix glibc's mmap threshold for this process; False where there is no glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
