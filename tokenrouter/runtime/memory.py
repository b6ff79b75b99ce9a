"""glibc's allocator, tuned for serving: a heap that does not creep up, without paying for it
in page faults (`bound_heap_growth`, for a subserver's whole life), and the memory loading
freed handed back (`release_load_temporaries`, once an engine is built).

`bound_heap_growth`:

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
import ctypes.util

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number
MMAP_THRESHOLD_BYTES = 32 << 20


def _glibc(function: str):
    """glibc's `function`, None where there is no glibc."""
    name = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(name), function) if name else None
    except (OSError, AttributeError):
        return None


def bound_heap_growth() -> bool:
    """Fix glibc's mmap threshold for this process; False where there is no glibc."""
    mallopt = _glibc("mallopt")
    return mallopt is not None and bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))


def release_load_temporaries() -> bool:
    """Hand the memory that loading freed back to the OS: glibc keeps the freed float copies,
    decode buffers and plan-measuring tensors in its arenas, so a quantised engine's RSS after
    load varied from 680 to 1,090 MB run to run on the embedded SmolLM2 Q4_1 file, and is
    619-624 MB every time after `malloc_trim`. False where there is no glibc (nothing to do)."""
    trim = _glibc("malloc_trim")
    if trim is None:
        return False
    trim(0)
    return True
