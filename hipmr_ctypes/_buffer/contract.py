"""What the buffer's helpers read of a Buffer: :class:`BufferView`.

``copies``, ``host_views`` and ``foreign`` take a Buffer as a ``BufferView``; ``buffer.py``,
which imports them, passes ``self``, and type checkers hold ``Buffer`` to this protocol there.
The helpers import it for type checkers only (``if TYPE_CHECKING``): nothing here runs on a
Buffer's path, and no helper depends on ``buffer`` at run time.
"""
from __future__ import annotations

from typing import Protocol

from .state import _State

__all__ = ["BufferView"]


class BufferView(Protocol):
    """The private members of ``Buffer`` its helpers use: nothing else of it is theirs."""

    @property
    def _size(self) -> int:
        """The size in bytes."""
        ...

    @property
    def _state(self) -> _State:
        """Device, host-only, closed, stream object held, ... (``state._State``)."""
        ...

    @property
    def _ref(self) -> object:
        """The resource or ref the memory came from (``foreign`` asks whether it is its own
        ``ForeignMemory``)."""
        ...

    def _live(self) -> int:
        """The address; ValueError once the buffer is closed."""
        ...

    def _own_stream(self) -> int:
        """The handle of the buffer's stream; ValueError when its ``Stream`` was closed."""
        ...

    def _memory_kind(self) -> str:
        """"device", "pinned", "managed" or "host", found once."""
        ...

    def _wait_own(self) -> None:
        """Wait for the work on the buffer's stream, on its device."""
        ...

    def _mutable(self) -> _State:
        """The buffer's own state, copied from the shared one first if need be."""
        ...
