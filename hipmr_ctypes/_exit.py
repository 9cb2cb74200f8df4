"""Interpreter exit: the package frees and destroys nothing that may still be reachable.

At exit, user code still runs after the package could act: ``atexit`` hooks, ``__del__`` of
module-level objects while the modules are torn down, finalizers of objects in the last
garbage cycles (in any order), daemon threads until the interpreter stops them.  Any of them
may still read a ``Buffer``, write into memory a pool handed out, or free on a ``Stream``.
So the rule, for every object of the package that owns something native (streams, events,
buffers, memory pools, pool chunks):

* memory, streams, events and pools stay valid until nothing can reach them, buffers
  included: a buffer's memory may also be reached through views the package cannot see (a
  NumPy or CuPy array over it through DLPack, a raw pointer), so marking the ``Buffer``
  closed would not protect them;
* once the exit hook below has run (:func:`keep_at_exit` is true), an object the garbage
  collector finalizes frees or destroys nothing: during teardown, "unreachable" no longer
  means "unused" (a user ``__del__`` in the same garbage cycle may run after the package's
  finalizer), and a daemon thread may hold any lock.  The operating system and the driver
  reclaim everything when the process ends;
* an explicit call (``close()``, ``deallocate()``) still does what it says, also at exit.

:func:`finalize` is the package's ``weakref.finalize``: it runs its function when the object
is garbage-collected or when called, never at exit by itself, and does nothing when the
collector fires it after the exit hook.  Code with a ``__del__`` instead checks
:func:`keep_at_exit` first.  A leaf module: it imports only the standard library.
"""
from __future__ import annotations

import atexit
import sys
import weakref
from typing import Any, Callable, Dict, Optional, Set, Tuple

__all__ = ["finalize", "Finalizer", "finalizer", "keep_at_exit"]

#: "keep": true once the exit hook has run (finalizers then free and destroy nothing)
_state = {"keep": False}
#: every live Finalizer: claimed (removed) exactly once, by the collector, a call or detach()
_registry: Set["Finalizer"] = set()


def finalizer(func: Callable[..., Any]) -> Callable[..., Any]:
    """Mark ``func`` as a finalizer function of the package: the exit hook also stops a
    ``weakref.finalize`` made with it from running at exit."""
    func._hipmr_finalizer = True  # type: ignore[attr-defined]
    return func


def keep_at_exit() -> bool:
    """True once the interpreter is exiting (the package's exit hook has run): a finalizer
    run by the garbage collector must not free or destroy anything."""
    return _state["keep"]


class Finalizer:
    """``weakref.finalize``'s interface (``alive``, ``detach()``, calling it) without its exit
    behaviour: see the module docstring.  Claiming is one atomic ``set.remove``, so the
    function runs at most once even when the collector and ``close()`` race."""

    __slots__ = ("_ref", "_func", "_args", "__weakref__")

    def __init__(self, obj: Any, func: Callable[..., Any], *args: Any) -> None:
        self._func: Optional[Callable[..., Any]] = func
        self._args: Tuple[Any, ...] = args
        self._ref = weakref.ref(obj, self._collected)
        _registry.add(self)

    # the module's tables are bound as default arguments: the collector may run these while
    # shutdown clears module globals
    def _claim(self, _registry: Set["Finalizer"] = _registry
               ) -> Optional[Tuple[Callable[..., Any], Tuple[Any, ...]]]:
        try:
            _registry.remove(self)   # atomic on every build (one set operation)
        except KeyError:
            return None
        func, args = self._func, self._args
        self._func, self._args = None, ()
        return func, args  # type: ignore[return-value]

    def _collected(self, _ref: Any, _state: Dict[str, bool] = _state) -> None:
        if _state["keep"]:
            # after the exit hook: nothing is freed, and the object stays alive (not claimed),
            # since a ``__del__`` of the same garbage may still use it (the collector clears
            # weak references before it runs finalizers) and an explicit close() still works
            return
        claimed = self._claim()
        if claimed is not None:
            try:
                claimed[0](*claimed[1])
            except Exception:  # noqa: BLE001 - a finalizer has nobody to report to
                pass

    def __call__(self, _: Any = None) -> Any:
        """Run the function now if it has not run yet (returns its result, else None)."""
        claimed = self._claim()
        if claimed is not None:
            return claimed[0](*claimed[1])
        return None

    def detach(self) -> Optional[Tuple[Any, Callable[..., Any], Tuple[Any, ...], Dict[str, Any]]]:
        """``(obj, func, args, {})`` and never run, if still alive; else None."""
        obj = self._ref()
        if obj is None:
            return None
        claimed = self._claim()
        if claimed is None:
            return None
        return obj, claimed[0], claimed[1], {}

    @property
    def alive(self) -> bool:
        """True until the function has run or was detached."""
        return self in _registry


def warn_failed_free(who: str, ptr: int, size: int, exc: BaseException) -> None:
    """What a finalizer does when its free failed: a ``RuntimeWarning`` naming ``who``, the
    address and the size, pointing at the finalizer's caller; nothing while the interpreter
    shuts down, and never an exception (finalizers have nobody to raise to).  Finalizers take
    it as a default argument, so that it outlives module teardown."""
    try:
        if not sys.is_finalizing():
            import warnings
            warnings.warn(f"{who}: freeing {ptr:#x} ({size} bytes) failed: {exc}",
                          RuntimeWarning, stacklevel=3)
    except Exception:  # noqa: BLE001
        pass


def finalize(obj: Any, func: Callable[..., Any], *args: Any) -> Finalizer:
    """Call ``func(*args)`` when ``obj`` is garbage-collected (not after the exit hook), or
    when the returned :class:`Finalizer` is called."""
    return Finalizer(obj, func, *args)


def _at_exit() -> None:
    _state["keep"] = True
    registry = getattr(weakref.finalize, "_registry", None)  # CPython's table of finalizers
    if not isinstance(registry, dict):
        return
    for fin, info in list(registry.items()):
        if getattr(getattr(info, "func", None), "_hipmr_finalizer", False):
            fin.atexit = False


class _Anchor:
    pass


_anchor = _Anchor()
weakref.finalize(_anchor, int)  # registers weakref's exit hook now (if not already) ...
atexit.register(_at_exit)        # ... so that this one, registered after it, runs before it
