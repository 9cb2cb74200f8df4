"""Sizes, as every part of the package takes them: the one grammar.

A size is one of

* an int (or anything ``operator.index`` accepts, not a bool): that many bytes;
* a string with a unit: a non-negative number, optional spaces and a unit, case-insensitive:
  ``B``; SI ``kB MB GB TB PB EB`` (powers of 1000); binary ``KiB MiB GiB TiB PiB EiB`` (powers
  of 1024): ``"4GiB"``, ``"2 GB"``, ``"1.5GiB"``, ``"512kib"``.  A fraction of a byte is dropped;
* a number with no unit: digits alone (``"1000"``) are bytes, and so is a whole number above
  1 written with an exponent (``"1e3"``, ``"1.5e3"``);
* a fraction of the device's total memory: a percentage (``"80%"``), a float ``0 < x <= 1``
  (``0.8``), or a unitless number in ``(0, 1]`` written with a point or an exponent
  (``"0.8"``, ``"1.0"``, ``"0.5e0"``, ``"5e-1"``), as RMM and dask-cuda read them: a
  :class:`DeviceFraction`, a value that knows nothing of devices.
  ``hipmr_ctypes._device_sizes`` resolves it against the device the size is for (the current
  device where nothing says which), rounded down to a multiple of 256 bytes
  (:meth:`DeviceFraction.of`).

The one rule for what is ambiguous: a single-letter unit (``"2k"``, ``"512M"``: 1000 or
1024?) is refused, and so is any other unitless number above 1 that is not one of the byte
forms above (``"1.5"``, ``"2.0"``, ``"1.5e0"``: bytes or a fraction?); the notation never
changes the reading, only the value does (``"1.5e0"`` is read as ``"1.5"``, ``"0.5e0"`` as
``"0.5"``); the message says what to write instead.  Where a fraction makes no sense (a block size, the
emulator's memory) it is refused.

A leaf: it imports nothing of the package, so the binding may use it too (the emulator reads
``HIPMR_EMULATED_MEMORY`` with :func:`parse_bytes`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional, SupportsIndex, Tuple, Union

if TYPE_CHECKING:
    import re

__all__ = ["parse_bytes", "parse_size", "DeviceFraction", "Size", "FRACTION_GRANULE"]

#: What a configured size may be: an int (or int-like), a float fraction or a size string.
Size = Union[SupportsIndex, float, str]

#: A fraction of the device's memory is rounded down to a multiple of this many bytes.
FRACTION_GRANULE = 256

_UNITS: Dict[str, int] = {"": 1, "b": 1}
for _i, _prefix in enumerate("kmgtpe", start=1):
    _UNITS[_prefix + "b"] = 1000 ** _i
    _UNITS[_prefix + "ib"] = 1024 ** _i

_SIZE_PATTERN = r"\s*(\d+(?:\.\d*)?|\.\d+)(?:e([+-]?\d{1,3}))?\s*([a-z]*)\s*"
_PERCENT_PATTERN = r"\s*(\d+(?:\.\d*)?|\.\d+)\s*%\s*"
_patterns: "List[re.Pattern[str]]" = []   # compiled by the first size string read


def _compiled() -> "List[re.Pattern[str]]":
    """[size, percent] patterns (compiled at the first string: a program that passes ints
    never compiles them)."""
    if not _patterns:
        import re
        _patterns[:] = [re.compile(_SIZE_PATTERN, re.IGNORECASE), re.compile(_PERCENT_PATTERN)]
    return _patterns


_EXAMPLES = "such as '4GiB', '2 GB', '512kib', '80%' or '0.8'"


class DeviceFraction:
    """A size given as a fraction of the device's total memory (``"80%"``, ``0.8``)."""

    __slots__ = ("fraction", "text", "_ratio")

    def __init__(self, fraction: float, text: str,
                 ratio: Optional[Tuple[int, int]] = None) -> None:
        self.fraction = fraction
        self.text = text
        #: the exact value as (numerator, denominator): the text's own digits where it was
        #: text, else the float's exact value
        self._ratio = ratio if ratio is not None else float(fraction).as_integer_ratio()

    def of(self, total: int) -> int:
        """The size in bytes for a device of ``total`` bytes (a multiple of 256, rounded down)."""
        num, den = self._ratio
        size = total * num // den
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


def _fraction(given: Any, ratio: Optional[Tuple[int, int]] = None) -> DeviceFraction:
    """``given`` (a float, or text whose exact value is ``ratio``) as a fraction in (0, 1]."""
    pair: Tuple[int, int]
    if ratio is not None:
        pair = ratio
    elif given == given and abs(given) != float("inf"):
        pair = float(given).as_integer_ratio()
    else:                                # nan, inf: no fraction
        pair = (-1, 1)
    num, den = pair
    if not 0 < num <= den:
        raise ValueError(f"{given!r} as a fraction of the device's memory must be in (0, 1] "
                         "(0% < x <= 100%); for a number of bytes write an int or a unit")
    return DeviceFraction(num / den, given.strip() if isinstance(given, str) else repr(given),
                          pair)


def _exact(number: str, exponent: Optional[str]) -> Tuple[int, int]:
    """The value of ``number`` (digits with an optional point) times ``10**exponent``, exactly,
    as (numerator, denominator) with a denominator that is a power of 10."""
    whole, _, decimals = number.partition(".")
    num = int((whole + decimals) or "0")
    power = int(exponent or 0) - len(decimals)
    return (num * 10 ** power, 1) if power >= 0 else (num, 10 ** -power)


def _unitless(match: "re.Match[str]") -> Tuple[int, int, bool]:
    """A unitless number's exact value and whether it reads as bytes (see the module): digits
    alone, or a whole number above 1 with an exponent."""
    num, den = _exact(match.group(1), match.group(2))
    plain = match.group(2) is None and "." not in match.group(1)
    return num, den, plain or (match.group(2) is not None and num % den == 0 and num > den)


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
        return _fraction(value)
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
    size_pattern, percent_pattern = _compiled()
    percent = percent_pattern.fullmatch(value)
    if percent is not None:
        if not fraction:
            raise ValueError(f"{value!r}: a fraction of the device's memory is not a size here")
        num, den = _exact(percent.group(1), None)
        return _fraction(value, (num, den * 100))
    match = size_pattern.fullmatch(value)
    if match is not None and match.group(3) == "":
        num, den, as_bytes = _unitless(match)
        if not as_bytes:
            if num > den:
                raise _could_not(value, f"{value.strip()!r} has no unit: a unitless number "
                                        "with a point or an exponent is a fraction of the "
                                        "device's memory, in (0, 1], unless it is a whole "
                                        "number written with an exponent (1.5e3); for bytes "
                                        "write")
            if not fraction:
                raise ValueError(f"{value!r}: a fraction of the device's memory is not a size "
                                 f"here")
            return _fraction(value, (num, den))
    return parse_bytes(value)


def parse_bytes(text: str) -> int:
    """The number of bytes ``text`` names (a number and a unit, or digits; see the module);
    ``ValueError`` ("Could not parse ...") for anything else, fractions included."""
    if not isinstance(text, str):
        raise TypeError(f"a size string must be a str, not {type(text).__name__}")
    match = _compiled()[0].fullmatch(text)
    unit_text = match.group(3).lower() if match else ""
    unit = _UNITS.get(unit_text) if match else None
    if match is None or unit is None:
        if match is not None and unit_text in ("k", "m", "g", "t", "p", "e"):
            number = match.group(1)
            raise _could_not(text, f"a single-letter unit is ambiguous: write "
                                   f"{number}{unit_text.upper()}iB (powers of 1024) or "
                                   f"{number}{unit_text.upper()}B (powers of 1000); expected")
        raise _could_not(text)
    if match.group(3) == "" and not _unitless(match)[2]:
        raise _could_not(text, "a unitless number with a point or an exponent is a fraction "
                               "of the device's memory (unless it is a whole number above 1 "
                               "written with an exponent), not a number of bytes; expected")
    num, den = _exact(match.group(1), match.group(2))
    return num * unit // den
