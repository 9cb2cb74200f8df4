"""Large fresh host destinations ask the kernel for huge pages before a copy fills them.

A copy from the device into memory nobody has touched yet (the new ``bytes`` of
``Buffer.tobytes()``, the new ``bytearray`` of ``Buffer.copy_to_host()``) faults every page in
while the runtime writes it; with 4 KiB pages that fault rate, not the link, sets the speed.
Where the kernel has transparent huge pages in ``madvise`` (or ``always``) mode,
``madvise(MADV_HUGEPAGE)`` over the new memory makes the faults 512 times fewer, as NumPy does
for its own large arrays.  Linux only; anywhere else, or where the call is refused, nothing
happens (it is advice: the copy is right either way).
"""
from __future__ import annotations

import os

from .._hip.native import madvise

#: below this the advice is not given (NumPy's own threshold).  Whether a fresh block is
#: faulted in already depends on what the process freed before: glibc's ``malloc`` serves a
#: block under 32 MiB (its largest mmap threshold on 64-bit hosts) from memory freed before,
#: and maps every larger block anew.  A smaller block is faulted in already only while the
#: process keeps memory of its size, so the advice is given from NumPy's threshold rather
#: than glibc's: a copy into a block whose memory was given back is bound by page faults
#: (the runs: benchmarks/results/history.md)
THRESHOLD = 4 << 20
MADV_HUGEPAGE = 14
# (os, not mmap, whose import ``import hipmr_ctypes.buffer`` would otherwise pay for)
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def advise(address: int, size: int) -> None:
    """Ask for huge pages over the whole pages inside ``[address, address + size)`` when
    ``size`` is at least :data:`THRESHOLD`; never raises."""
    if size < THRESHOLD:
        return
    fn = madvise()
    if fn is None:
        return
    start = (address + _PAGE - 1) & ~(_PAGE - 1)
    end = (address + size) & ~(_PAGE - 1)
    if end > start:
        fn(start, end - start, MADV_HUGEPAGE)   # a refusal (EINVAL: no THP) changes nothing
