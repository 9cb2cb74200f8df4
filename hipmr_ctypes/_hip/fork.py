"""A process forked after the runtime started is refused, clearly, on every platform.

A child made by ``os.fork`` (``multiprocessing``'s ``fork`` start method) inherits a copy of
the parent's memory: the package's tables (which blocks a pool holds, which are free), its
locks (some maybe held by threads that do not exist in the child) and the runtime's state.
No GPU runtime supports being used from such a child (CUDA fails every call with an
initialization error; HIP on AMD leaves it undefined), and on the emulated platform the child
would share the parent's IPC-enabled pools (shared memory): a child allocating from an
inherited pool was handed the parent's live block and overwrote it.

So, in a child forked after the parent created its runtime (``get_runtime()`` had returned:
the package had been used, not merely imported), :func:`after_fork_in_child` makes

* every use of the runtime raise :class:`ForkedChildError`, naming the cause and the cure
  (``spawn`` or ``forkserver``): the process-wide runtime is gone (``get_runtime`` raises
  it), the inherited runtime object (which resources and streams made before the fork keep)
  turns every failed call into that error, and the emulated runtime fails every call (as
  CUDA does), so nothing inherited hands out memory;
* the garbage collector free nothing the parent made (as at interpreter exit: see
  ``hipmr_ctypes._exit``, told through ``sys.modules`` when loaded): that memory is the
  parent's;
* ``get_runtime``'s lock free again if a thread of the parent held it (the package's other
  locks: ``hipmr_ctypes._locks.reset_after_fork``), so nothing waits on a thread that does
  not exist in the child;
* the hooks of ``hipmr_ctypes._locks.on_forked_child`` run: the pool and fixed-size
  sub-allocators then refuse every allocation and free (the blocks they cache are the
  parent's memory, shared with it on the emulated platform's IPC pools).

A child forked before the runtime started is an ordinary process.  Nothing here runs on a hot
path: the handler runs at ``fork`` only, registered when the runtime is first created.
"""
from __future__ import annotations

import os
import sys
from _thread import allocate_lock
from typing import Any, Dict, Optional

from .exceptions import HipError

__all__ = ["ForkedChildError", "MESSAGE", "install", "forked_child"]

MESSAGE = ("hipmr_ctypes cannot be used in a process forked (os.fork, multiprocessing's "
           "'fork' start method) after the runtime started in its parent: GPU runtimes do not "
           "survive fork, and the parent's memory and pools are not the child's. Start the "
           "child with multiprocessing.get_context('spawn') or 'forkserver', or fork before "
           "the package is first used")

_state: Dict[str, bool] = {"installed": False, "forked": False}


class ForkedChildError(HipError):
    """The package was used in a child forked after the runtime started in its parent (see
    the module docstring).  ``code`` is None: no runtime call made it."""

    def __init__(self, call: Optional[str] = None) -> None:
        super().__init__(None, None, MESSAGE, call)

    def _format(self) -> str:
        return MESSAGE + (f" (in {self.call})" if self.call else "")


def forked_child() -> bool:
    """True in a child forked after the runtime started in its parent."""
    return _state["forked"]


def _error(status: int, call: Optional[str] = None, **kw: Any) -> ForkedChildError:
    """The inherited runtime's ``error`` in the child: every failure names the fork."""
    return ForkedChildError(call)


def after_fork_in_child() -> None:
    """``os.register_at_fork(after_in_child=...)``: see the module docstring."""
    hip: Any = sys.modules.get("hipmr_ctypes._hip")
    if hip is None:
        return
    if hip._lock.locked():   # a parent thread was loading the runtime: it never will here
        hip._lock = allocate_lock()
    rt = hip._runtime
    if rt is None:
        return
    _state["forked"] = True
    exit_module: Any = sys.modules.get("hipmr_ctypes._exit")
    if exit_module is not None:
        exit_module._state["keep"] = True   # finalizers and Buffer.__del__ free nothing now
    hip._error = ForkedChildError()
    hip._runtime = None                    # get_runtime() raises _error from now on
    try:
        rt.error = _error
    except Exception:  # noqa: BLE001 - a runtime object that takes no attribute
        pass
    emulator = getattr(rt, "emulator", None)
    if emulator is not None:
        emulator.fail_after_fork()
    from .._locks import run_forked_child_hooks
    run_forked_child_hooks()   # the sub-allocators' cached blocks are the parent's too


def install() -> None:
    """Register :func:`after_fork_in_child` (once; called when the runtime is created)."""
    if not _state["installed"]:
        _state["installed"] = True
        os.register_at_fork(after_in_child=after_fork_in_child)
