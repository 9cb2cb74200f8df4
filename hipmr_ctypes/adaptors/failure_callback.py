"""``FailureCallbackResource``: lets a callback free memory and retry when an allocation runs
out of memory."""
from __future__ import annotations

from typing import Any, Callable, Tuple

from ..properties import DEFAULT_ALIGNMENT
from .._checks import check_args, check_callable, check_stream
from ._base import BoundAdaptor
from ._checked import must_check_arguments, upstream_calls

__all__ = ["FailureCallbackResource"]


class FailureCallbackResource(BoundAdaptor):
    """``FailureCallbackResource(upstream, callback)``: on ``MemoryError`` (which includes
    ``OutOfMemoryError``) from the upstream, calls ``callback(bytes)``; while it returns a true
    value the allocation is retried, and once it returns a false one the error is raised.  An
    exception from the callback propagates.  Deallocation goes to the upstream (after the
    arguments are checked).  An async resource when the upstream is one; equal to another
    over an equal upstream with the same callback.
    """

    #: hands out its upstream's pointers unchanged (read by IPC: see Adaptor)
    passes_pointers_through = True

    def __init__(self, upstream: Any, callback: Callable[[int], Any]) -> None:
        ref = self._set_upstream(upstream)
        self._callback = check_callable(callback, "callback")
        self._bind(ref, callback)

    def _bind(self, ref: Any, callback: Callable[[int], Any]) -> None:
        up_alloc, _, up_alloc_async, _ = upstream_calls(ref)
        must_check = must_check_arguments(ref)  # a user-written upstream: check everything

        def allocate(bytes: int, alignment: int = DEFAULT_ALIGNMENT) -> int:
            if must_check:
                bytes, alignment = check_args(bytes, alignment)
            while True:
                try:
                    return up_alloc(bytes, alignment)
                except MemoryError:
                    if not callback(bytes):
                        raise

        def allocate_async(bytes: int, alignment: int, stream: Any) -> int:
            if must_check:
                bytes, alignment = check_args(bytes, alignment)
                check_stream(stream)
            while True:
                try:
                    ptr: int = up_alloc_async(bytes, alignment, stream)
                    return ptr
                except MemoryError:
                    if not callback(bytes):
                        raise

        self._build(allocate_async, allocate=allocate)  # frees pass straight through

    def _settings(self) -> Tuple[Any, ...]:
        return (self._callback,)

    @property
    def callback(self) -> Callable[[int], Any]:
        """The callback."""
        fn: Callable[[int], Any] = self._callback
        return fn

    def __repr__(self) -> str:
        return f"FailureCallbackResource({self._upstream.resource!r}, {self._callback!r})"
