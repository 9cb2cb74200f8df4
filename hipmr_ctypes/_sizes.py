"""Sizes given as strings where a size is configured (pool sizes, limits, ``reinitialize``).

``"4MiB"``, ``"2 GB"``, ``"512kib"``, ``"1.5GiB"``, ``"1000"``: a non-negative number, optional
spaces, and a unit, case-insensitive: ``B``; SI ``kB MB GB TB PB EB`` (powers of 1000); binary
``KiB MiB GiB TiB PiB EiB`` (powers of 1024).  A fraction of a byte is dropped.  A single-letter
unit such as ``"2k"`` is refused (is it 1000 or 1024?), as RMM refuses it.
"""
from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any, Dict, SupportsIndex, Union

from ._checks import check_size

__all__ = ["parse_bytes", "config_size", "Size"]

#: What a configured size may be: an int (or int-like) or a size string.
Size = Union[SupportsIndex, str]

_UNITS: Dict[str, int] = {"": 1, "b": 1}
for _i, _prefix in enumerate("kmgtpe", start=1):
    _UNITS[_prefix + "b"] = 1000 ** _i
    _UNITS[_prefix + "ib"] = 1024 ** _i

_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)(?:e([+-]?\d{1,3}))?\s*([a-z]*)\s*", re.IGNORECASE)


def parse_bytes(text: str) -> int:
    """The number of bytes ``text`` names (see the module's documentation); ``ValueError``
    ("Could not parse ...") for anything else."""
    if not isinstance(text, str):
        raise TypeError(f"a size string must be a str, not {type(text).__name__}")
    match = _SIZE.fullmatch(text)
    unit = _UNITS.get(match.group(3).lower()) if match else None
    if match is None or unit is None:
        raise ValueError(f"Could not parse {text!r} as a size: expected a number and a unit "
                         "such as '4MiB', '2 GB' or '512kib' (units: B, kB, MB, GB, TB, PB, "
                         "EB, KiB, MiB, GiB, TiB, PiB, EiB)")
    try:
        number = Decimal(match.group(1)) * Decimal(10) ** int(match.group(2) or 0)
    except InvalidOperation:  # pragma: no cover - the pattern only lets numbers through
        raise ValueError(f"Could not parse {text!r} as a size") from None
    return int(number * unit)


def config_size(value: Any, name: str) -> int:
    """A configured size: an int (or anything ``operator.index`` accepts) or a size string,
    validated like every other size (TypeError / ValueError naming ``name``)."""
    if isinstance(value, str):
        try:
            value = parse_bytes(value)
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from None
    return check_size(value, name)
