"""Sizes, as every part of the package takes them: the one grammar.

A size is one of

* an int (or anything ``operator.index`` accepts, not a bool): that many bytes;
* a string with a unit: a non-negative number, optional spaces and a unit, case-insensitive:
  ``B``; SI ``kB MB GB TB PB EB`` (powers of 1000); binary ``KiB MiB GiB TiB PiB EiB`` (powers
  of 1024): ``"4GiB"``, ``"2 GB"``, ``"1.5GiB"``, ``"512kib"``.  A fraction of a byte is dropped;
* a string of digits with no unit (``"1000"``, ``"1e3"``): bytes;
* a fraction of the device's total memory: a percentage (``"80%"``), a float ``0 < x <= 1``
  (``0.8``), or a string of such a decimal with a point (``"0.8"``, ``"1.0"``), as RMM and
  dask-cuda read them: a :class:`DeviceFraction`, a value that knows nothing of devices.
  ``hipmr_ctypes._device_sizes`` resolves it against the device the size is for (the current
  device where nothing says which), rounded down to a multiple of 256 bytes
  (:meth:`DeviceFraction.of`).

The one rule for what is ambiguous: a single-letter unit (``"2k"``, ``"512M"``: 1000 or
1024?) is refused, and so is a unitless decimal above 1 (``"1.5"``: bytes or a fraction?);
the message says what to write instead.  Where a fraction makes no sense (a block size, the
emulator's memory) it is refused.

A leaf: it imports nothing of the package, so the binding may use it too (the emulator reads
``HIPMR_EMULATED_MEMORY`` with :func:`parse_bytes`).
"""
from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any, Dict, SupportsIndex, Union

__all__ = ["parse_bytes", "parse_size", "DeviceFraction", "Size", "FRACTION_GRANULE"]

#: What a configured size may be: an int (or int-like), a float fraction or a size string.
Size = Union[SupportsIndex, float, str]

#: A fraction of the device's memory is rounded down to a multiple of this many bytes.
FRACTION_GRANULE = 256

_UNITS: Dict[str, int] = {"": 1, "b": 1}
for _i, _prefix in enumerate("kmgtpe", start=1):
    _UNITS[_prefix + "b"] = 1000 ** _i
    _UNITS[_prefix + "ib"] = 1024 ** _i

_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)(?:e([+-]?\d{1,3}))?\s*([a-z]*)\s*", re.IGNORECASE)
_PERCENT = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*%\s*")
_EXAMPLES = "such as '4GiB', '2 GB', '512kib', '80%' or '0.8'"


class DeviceFraction:
    """A size given as a fraction of the device's total memory (``"80%"``, ``0.8``)."""

    __slots__ = ("fraction", "text")

    def __init__(self, fraction: float, text: str) -> None:
        self.fraction = fraction
        self.text = text

    def of(self, total: int) -> int:
        """The size in bytes for a device of ``total`` bytes (a multiple of 256, rounded down)."""
        size = int(Decimal(total) * Decimal(self.fraction))
        return size - size % FRACTION_GRANULE

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DeviceFraction) and other.fraction == self.fraction

    def __hash__(self) -> int:
        return hash(self.fraction)

    def __repr__(self) -> str:
        return f"{self.text} of the device's memory"


def _could_not(text: str, why: str = "") -> ValueError:
    return ValueError(f"Could not parse {text!r} as a size: {why or 'expected'} a number and "
                      f"a unit {_EXAMPLES} (units: B, kB, MB, GB, TB, PB, EB, KiB, MiB, GiB, "
                      "TiB, PiB, EiB)")


def _fraction(value: float, given: Any) -> DeviceFraction:
    if not 0 < value <= 1:
        raise ValueError(f"{given!r} as a fraction of the device's memory must be in (0, 1] "
                         "(0% < x <= 100%); for a number of bytes write an int or a unit")
    return DeviceFraction(float(value), given.strip() if isinstance(given, str) else repr(given))


def parse_size(value: Any, fraction: bool = True) -> Union[int, DeviceFraction]:
    """``value`` read by the grammar above: an int of bytes, or a :class:`DeviceFraction`
    (refused when ``fraction`` is False).  TypeError for other types, ValueError for text
    the grammar does not read; the int is not range-checked here (see
    ``hipmr_ctypes._device_sizes.config_size``)."""
    if isinstance(value, bool):
        raise TypeError("a size must be an int number of bytes, a size string or a fraction, "
                        "not bool")
    if isinstance(value, float):
        if not fraction:
            raise TypeError("a size here must be an int number of bytes or a size string, "
                            "not float")
        return _fraction(value, value)
    if not isinstance(value, str):
        if isinstance(value, bytes) or value is None:
            raise TypeError(f"a size must be an int number of bytes, a size string or a "
                            f"fraction, not {type(value).__name__}")
        import operator
        try:
            return operator.index(value)
        except TypeError:
            raise TypeError(f"a size must be an int number of bytes, a size string or a "
                            f"fraction, not {type(value).__name__}") from None
    percent = _PERCENT.fullmatch(value)
    if percent is not None:
        if not fraction:
            raise ValueError(f"{value!r}: a fraction of the device's memory is not a size here")
        return _fraction(float(Decimal(percent.group(1)) / 100), value)
    match = _SIZE.fullmatch(value)
    if match is not None and match.group(3) == "" and "." in match.group(1) \
            and match.group(2) is None:
        number = Decimal(match.group(1))
        if number > 1:
            raise _could_not(value, f"{value.strip()!r} has no unit: a decimal without a unit "
                                    "is a fraction of the device's memory, in (0, 1]; for bytes"
                                    " write")
        if not fraction:
            raise ValueError(f"{value!r}: a fraction of the device's memory is not a size here")
        return _fraction(float(number), value)
    return parse_bytes(value)


def parse_bytes(text: str) -> int:
    """The number of bytes ``text`` names (a number and a unit, or digits; see the module);
    ``ValueError`` ("Could not parse ...") for anything else, fractions included."""
    if not isinstance(text, str):
        raise TypeError(f"a size string must be a str, not {type(text).__name__}")
    match = _SIZE.fullmatch(text)
    unit_text = match.group(3).lower() if match else ""
    unit = _UNITS.get(unit_text) if match else None
    if match is None or unit is None:
        if match is not None and unit_text in ("k", "m", "g", "t", "p", "e"):
            number = match.group(1)
            raise _could_not(text, f"a single-letter unit is ambiguous: write "
                                   f"{number}{unit_text.upper()}iB (powers of 1024) or "
                                   f"{number}{unit_text.upper()}B (powers of 1000); expected")
        raise _could_not(text)
    if match.group(3) == "" and "." in match.group(1) and match.group(2) is None:
        raise _could_not(text, "a decimal without a unit is a fraction of the device's "
                               "memory, not a number of bytes; expected")
    try:
        number = Decimal(match.group(1)) * Decimal(10) ** int(match.group(2) or 0)
    except InvalidOperation:  # pragma: no cover - the pattern only lets numbers through
        raise _could_not(text) from None
    return int(number * unit)

