"""Interpreter exit: may the package still destroy what it owns?

At exit, ``weakref.finalize`` calls the finalizers of every object still alive: streams,
events, buffers, memory pools and pool chunks get destroyed and freed.  Daemon threads are
still running at that moment and may be using exactly those objects: destroying them under
a running thread would hand it closed objects, destroyed handles and freed memory.  So when
daemon threads are alive at exit, the package's finalizers (functions marked with
:func:`finalizer`) are switched off (``atexit = False``) and destroy nothing: the operating
system and the driver reclaim everything when the process ends.  Without daemon threads they
run as usual and free everything.

Hooks registered with :func:`run_at_exit` run from the same exit hook, before any finalizer,
only when no daemon thread is alive (``Buffer`` frees and closes every live buffer there).

Importing this module makes ``weakref`` register its exit hook first, then registers
:func:`_at_exit` after it: ``atexit`` runs hooks last-in first-out, so ``_at_exit`` runs
before any finalizer does.
"""
from __future__ import annotations

import atexit
import threading
import weakref
from typing import Any, Callable, List

__all__ = ["finalizer", "keep_at_exit", "run_at_exit"]

_state = {"keep": False}
_hooks: List[Callable[[], None]] = []


def finalizer(func: Callable[..., Any]) -> Callable[..., Any]:
    """Mark ``func`` as a finalizer function of the package (see the module docstring)."""
    func._hipmr_finalizer = True  # type: ignore[attr-defined]
    return func


def keep_at_exit() -> bool:
    """True once the interpreter exits with daemon threads still running: a finalizer that
    runs anyway must not destroy or free anything."""
    return _state["keep"]


def run_at_exit(func: Callable[[], None]) -> None:
    """Call ``func()`` at interpreter exit before any finalizer, unless daemon threads are
    still running then (errors are ignored)."""
    _hooks.append(func)


def _at_exit() -> None:
    if threading.active_count() <= 1:
        for func in list(_hooks):
            try:
                func()
            except Exception:  # noqa: BLE001 - the runtime may be going away
                pass
        return
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
