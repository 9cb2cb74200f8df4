"""Sizes as the resources and adaptors take them: read by the one grammar (``_sizes``),
checked like every size (``_checks.check_size``), a fraction of a device's memory resolved
against that device's total memory.

``_sizes`` is a leaf that knows nothing of devices (the binding uses it too); resolving a
:class:`~hipmr_ctypes._sizes.DeviceFraction` needs a device, so it lives here, above
``device``.
"""
from __future__ import annotations

from typing import Any, Optional, Union

from ._checks import check_size
from ._sizes import DeviceFraction, parse_size
from .device import Device

__all__ = ["parse_config_size", "resolve_size", "config_size"]


def resolve_size(size: Union[int, DeviceFraction], name: str,
                 device: Optional[int] = None) -> int:
    """``size`` in bytes: a fraction resolved against ``device`` (None: the current one),
    then checked like every size (``[0, 2**63]``, ValueError naming ``name``)."""
    if isinstance(size, DeviceFraction):
        size = size.of(int(Device(device).memory_info()[1]))
    return check_size(size, name)


def parse_config_size(value: Any, name: str,
                      fraction: bool = True) -> Union[int, DeviceFraction]:
    """:func:`~hipmr_ctypes._sizes.parse_size`, its errors naming the argument ``name``; an
    int is range-checked (a fraction is checked once resolved): everything a caller can check
    before it knows the device."""
    if type(value) is not int:
        try:
            value = parse_size(value, fraction)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{name}: {exc}") from None
        if isinstance(value, DeviceFraction):
            return value
    return check_size(value, name)


def config_size(value: Any, name: str, device: Optional[int] = None,
                fraction: bool = True) -> int:
    """A configured size in bytes: anything the grammar reads (see ``_sizes``), a fraction
    resolved against ``device`` (None: the current device; refused when ``fraction`` is
    False), checked like every other size; TypeError / ValueError naming ``name``."""
    return resolve_size(parse_config_size(value, name, fraction), name, device)
