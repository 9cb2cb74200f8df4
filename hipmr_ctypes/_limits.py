"""Numeric limits the whole package shares, spelled once.  A leaf: it imports nothing, so the
binding and the model may both use it."""
from __future__ import annotations

__all__ = ["MAX_ADDRESS"]

#: The largest address, ``2**64 - 1``: pointers, stream handles and other 64-bit unsigned
#: values are ints in ``[0, MAX_ADDRESS]``.
MAX_ADDRESS = (1 << 64) - 1
