"""Numeric limits the whole package shares, spelled once.  A leaf: it imports nothing, so the
binding and the model may both use it."""
from __future__ import annotations

__all__ = ["MAX_ADDRESS", "MAX_ONE_DIGIT_INT"]

#: The largest address, ``2**64 - 1``: pointers, stream handles and other 64-bit unsigned
#: values are ints in ``[0, MAX_ADDRESS]``.
MAX_ADDRESS = (1 << 64) - 1
#: The largest int CPython stores in one 30-bit digit, ``2**30 - 1``: hot paths test sizes up
#: to it inline, since such ints compare without the generic path; larger ones take the
#: checked path.
MAX_ONE_DIGIT_INT = (1 << 30) - 1
