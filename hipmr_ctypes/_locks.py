"""The package's two locks, and the one rule every lock of the package follows.

The garbage collector can run a finalizer at any allocation of a Python container (a list, a
dict, an exception, a frame...), and from Python 3.12 on wherever the interpreter checks for
pending work (as right after a C call returns), also in a thread that holds a lock in the
middle of an update; a finalizer that frees memory through the same object would then
deadlock on a plain ``threading.Lock`` (or, with an ``RLock``, run in the middle of the
update).  A :class:`DeferringLock` counts as held by a thread from before it takes its inner
lock until after it lets go of it (``_moving`` covers the moments when ``owner`` is not yet or
no longer set).  So every lock of the package is one of:

* a section that allocates no Python container (a few list / dict / int operations on
  existing objects): the collector cannot run inside it, nothing can re-enter;
* a :class:`DeferringLock`: code a finalizer can reach (every free) first checks
  :meth:`DeferringLock.held_here` and :meth:`~DeferringLock.defer`\\ s itself instead;
  deferred calls run, in order, right after the lock is let go.  No hot path takes one:
  the sub-allocators' fast paths are single atomic operations on built-in lists and dicts;
* a :class:`TokenMutex` around int operations only.

Errors are built after the lock is let go.  ``tests/reliability/test_gc_locks.py`` runs a
collection that frees through the same resource inside every lock of the package.

Interpreter exit: once the interpreter finalizes, only the finalizing thread runs Python code;
every other thread is stopped for good at its next attempt to run any, so a lock it holds is
never let go.  A :class:`DeferringLock` held by another thread then raises
:class:`AbandonedLockError` at once instead of waiting forever, and a :class:`TokenMutex`
waits at most ``TIMEOUT`` seconds (docs/internals.md, "Interpreter exit and locks").

A leaf module: it imports only the standard library, so every layer may use it.
"""
from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from collections import deque
from typing import Any, Callable, Deque, List, Optional, Set

__all__ = ["AbandonedLockError", "DeferringLock", "TokenMutex", "wait_token",
           "reset_after_fork", "FREE_THREADED", "atomic_slot", "on_forked_child",
           "run_forked_child_hooks"]


#: every DeferringLock, held weakly: a forked child makes free those that a thread of the
#: parent held (:func:`reset_after_fork`)
_every: "weakref.WeakSet[DeferringLock]" = weakref.WeakSet()


class AbandonedLockError(RuntimeError):
    """A lock of the package is held by a thread the interpreter stopped at exit: it will
    never be let go, so the call that needs it fails instead of hanging the exit."""


class DeferringLock:
    """A non-reentrant lock with an owner and a queue of calls deferred until its release."""

    __slots__ = ("_lock", "owner", "_moving", "_deferred", "__weakref__")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.owner: Optional[int] = None
        #: the threads between taking the inner lock and setting ``owner``, or between
        #: clearing it and letting go: the collector can run a finalizer there too (from
        #: Python 3.12 on it runs wherever the interpreter checks for pending work, as right
        #: after a C call returns), and that finalizer must see the lock as held here
        self._moving: Set[int] = set()
        self._deferred: List[Any] = []
        _every.add(self)

    def held_here(self) -> bool:
        """True when the calling thread holds the lock, or is taking or letting go of it."""
        me = threading.get_ident()
        return self.owner == me or me in self._moving

    def acquire(self) -> None:
        """Take the lock (blocking).  RuntimeError, not a deadlock, when the calling thread
        holds it already (a finalizer or signal handler run inside the section that did not
        defer itself)."""
        me = threading.get_ident()
        moving = self._moving
        if self.owner == me or me in moving:
            raise RuntimeError("a lock of hipmr_ctypes was re-entered by the thread that holds "
                               "it (from a finalizer or a signal handler)")
        moving.add(me)
        try:
            if not self._lock.acquire(False):
                self._wait()
            self.owner = me
        finally:
            moving.discard(me)

    def _wait(self, _finalizing: Callable[[], bool] = sys.is_finalizing) -> None:
        """Block until the lock is free, except while the interpreter finalizes: its holder is
        then a thread that can never run again (module docstring), so AbandonedLockError.
        (No race: the finalizing thread cannot start finalizing while it waits here.)"""
        if _finalizing():
            raise AbandonedLockError("a lock of hipmr_ctypes is held by a thread that the "
                                     "interpreter stopped at exit")
        self._lock.acquire()

    def release(self) -> None:
        """Let go of the lock, then run the calls deferred meanwhile (their errors are
        dropped: they come from finalizers, which have nobody to report to)."""
        me = threading.get_ident()
        moving = self._moving
        moving.add(me)
        self.owner = None
        self._lock.release()
        moving.discard(me)
        while self._deferred:
            try:
                call, args = self._deferred.pop(0)
            except IndexError:
                return
            try:
                call(*args)
            except Exception:  # noqa: BLE001
                pass

    def __enter__(self) -> "DeferringLock":
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def defer(self, call: Callable[..., Any], *args: Any) -> None:
        """Run ``call(*args)`` once the lock is let go."""
        self._deferred.append((call, args))


class TokenMutex:
    """A mutex for critical sections of a few int operations: one token in a ``deque``.

    ``take_nowait()`` pops the token and ``put(True)`` appends it back; both are single atomic
    operations on a built-in deque (also without the GIL), cheaper than a ``threading.Lock``
    acquire / release pair in CPython (the figure: ``benchmarks/results/history.md``).  (A
    deque rather than a list: a list emptied by ``pop`` frees its storage and ``append``
    allocates it again, on every take and put; a deque keeps its block.)  When the token is out, ``take()`` yields until it is back,
    so it suits sections that make no call which can block or take long: the holder always
    comes back at once.  Not reentrant: code that a finalizer may re-enter (a deallocation run
    by the garbage collector inside the section) must not take it; such code appends to a
    deque that the holder drains instead.  A wait of more than ``TIMEOUT`` seconds can only be
    such a re-entry (or a token lost to an asynchronous exception between take and ``try``)
    and raises RuntimeError instead of hanging.

    Hot paths keep the deque itself (``tokens = m.tokens``) and call ``tokens.pop()`` /
    ``tokens.append(True)``: CPython specializes those calls of a method named at the call
    site (a bound method of a deque, like ``take_nowait``, goes the generic way).  They call
    :func:`wait_token` ``(tokens.pop)`` only when ``tokens.pop()`` raises IndexError.
    """

    __slots__ = ("tokens", "take_nowait", "put")

    #: seconds a waiter yields before it gives up
    TIMEOUT = 5.0

    def __init__(self) -> None:
        #: the token, when no thread holds the mutex
        self.tokens: Deque[bool] = deque([True])
        tokens = self.tokens
        #: pop the token; IndexError when another thread holds it
        self.take_nowait: Callable[[], Any] = tokens.pop
        #: give the token back (exactly once per successful take)
        self.put: Callable[[Any], None] = tokens.append

    def take(self) -> None:
        """Wait for the token and take it."""
        wait_token(self.take_nowait)

    def __enter__(self) -> "TokenMutex":
        self.take()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.put(True)


def wait_token(take: Callable[[], Any]) -> None:
    """Wait for the token of the :class:`TokenMutex` whose ``take_nowait`` is ``take``, and
    take it (a module function, so that hot paths need keep only ``take`` at hand)."""
    deadline = None
    spins = 0
    while True:
        try:
            take()
            return
        except IndexError:
            pass
        spins += 1
        if spins < 100:
            time.sleep(0)  # let the holder run
            continue
        now = time.monotonic()
        if deadline is None:
            deadline = now + TokenMutex.TIMEOUT
        elif now > deadline:
            raise RuntimeError(
                f"a mutex was held for over {TokenMutex.TIMEOUT} s: re-entered from a "
                "finalizer or signal handler of the thread that holds it?")
        time.sleep(0.0001)


def reset_after_fork() -> None:
    """In a forked child (``os.register_at_fork``): every DeferringLock that a thread of the
    parent held at the fork (a thread that does not exist here, so it would never let go) is
    made free again, in place, and its deferred calls are dropped.  A lock the forking thread
    itself holds stays held: that thread goes on in the child and lets go of it."""
    me = threading.get_ident()
    for lock in list(_every):
        inner = lock._lock
        lock._moving.intersection_update((me,))   # the parent's other threads are gone
        if lock.owner == me or not inner.locked():
            continue
        reinit = getattr(inner, "_at_fork_reinit", None)
        if reinit is not None:
            reinit()
        else:  # pragma: no cover - every supported CPython has it (3.9+)
            inner.release()
        lock.owner = None
        del lock._deferred[:]


os.register_at_fork(after_in_child=reset_after_fork)

#: what a child forked after the runtime started must also refuse (the layers above the
#: binding register here: this leaf is the one place both may reach); run by the binding's
#: fork handler once it has refused the runtime (``hipmr_ctypes._hip.fork``).  Held weakly: a
#: hook lives as long as its module, and this leaf (torn down last at exit) keeps no other
#: module's globals alive through it
_forked_child_hooks: List["weakref.ref[Callable[[], None]]"] = []


def on_forked_child(hook: Callable[[], None]) -> None:
    """Run ``hook()`` in a child forked after the runtime started in its parent (``hook``
    must be kept alive by its owner, a module-level function for example)."""
    _forked_child_hooks.append(weakref.ref(hook))


def run_forked_child_hooks() -> None:
    """Run every live hook of :func:`on_forked_child` (their errors dropped: nobody to
    report to inside ``fork``)."""
    for ref in list(_forked_child_hooks):
        hook = ref()
        if hook is None:
            continue
        try:
            hook()
        except Exception:  # noqa: BLE001
            pass


# ---- exactly-once claims on a slot, atomic on every build ----------------------------------
# - The claim: ``free = obj.slot; del obj.slot``; only the caller whose ``del`` succeeds frees
#   (``Buffer._free`` and the other owning slots).
# - With the GIL it is atomic (one C call; a second ``del`` raises AttributeError), and
#   :func:`atomic_slot` does nothing: the hot paths are unchanged.
# - On a free-threaded build CPython 3.13 tests the slot outside the object's lock (two threads
#   could both delete it and both free), so :func:`atomic_slot` puts a ``property`` in the
#   slot's place: the slot's own C getter and setter, and a deleter that tests and deletes
#   under one lock; the claim sites are the same code on every build.
# - That lock is an ``RLock`` around the delete of one slot only (the value was read first, so
#   the delete never drops its last reference); a finalizer the collector runs there that
#   claims another slot re-enters it, so no lock waits on itself.

#: True on a free-threaded build (PEP 703), whether or not the GIL was turned on at run time
FREE_THREADED: bool = ("t" in getattr(sys, "abiflags", "")
                       or "free-threading" in sys.version)


def atomic_slot(cls: type, name: str) -> None:
    """Make ``del obj.<name>`` on instances of ``cls`` (a slot of ``cls``) an atomic claim on
    this build: exactly one of several concurrent deletes succeeds, the others raise
    AttributeError as when the slot is unset.  Nothing to do with the GIL."""
    if not FREE_THREADED:
        return
    member = cls.__dict__[name]          # the slot's member descriptor
    delete = member.__delete__
    lock = threading.RLock()

    def claim(obj: Any) -> None:
        with lock:          # every delete of the slot in turn: its test for "unset" too
            delete(obj)     # AttributeError: unset (another caller claimed it first)

    setattr(cls, name, property(member.__get__, member.__set__, claim,
                                f"the slot {name} (claimed atomically)"))
