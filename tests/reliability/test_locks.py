"""The two locks of ``hipmr_ctypes._locks``: TokenMutex (the adaptors' counters) and the
rule that a deallocation through StatisticsResource / LimitingResource never waits for it
(a finalizer run by the garbage collector inside the holder's section must not deadlock)."""
import threading

import pytest

from hipmr_ctypes._locks import TokenMutex
from hipmr_ctypes.adaptors import LimitingResource, StatisticsResource
from hipmr_ctypes.resources import HostMemoryResource


@pytest.mark.parametrize("form", ["bound", "tokens"])
def test_token_mutex_excludes_threads(form):
    mutex = TokenMutex()
    if form == "bound":
        take, put = mutex.take_nowait, mutex.put
    else:   # what the hot paths use: the deque's own methods, named at the call site
        tokens = mutex.tokens

        def take():
            tokens.pop()

        def put(token):
            tokens.append(token)
    total = [0]

    def work():
        for _ in range(5000):
            try:
                take()
            except IndexError:
                mutex.take()
            try:
                value = total[0]
                threading.current_thread()   # a call in the section: a chance to switch
                total[0] = value + 1
            finally:
                put(True)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert total[0] == 8 * 5000
    take()        # exactly one token is left
    with pytest.raises(IndexError):
        take()
    assert len(mutex.tokens) == 0
    put(True)
    assert list(mutex.tokens) == [True]


def test_token_mutex_gives_up_instead_of_hanging(monkeypatch):
    monkeypatch.setattr(TokenMutex, "TIMEOUT", 0.05)
    mutex = TokenMutex()
    with mutex:
        with pytest.raises(RuntimeError, match="re-entered"):
            mutex.take()
    with mutex:   # given back by the with statement
        pass


@pytest.mark.parametrize("make", [StatisticsResource, lambda up: LimitingResource(up, 1 << 20)],
                         ids=["statistics", "limiting"])
def test_a_free_never_waits_for_the_mutex(make):
    r = make(HostMemoryResource())
    p = r.allocate(1000)
    q = r.allocate_async(500, 256, 0)
    r._mutex.take_nowait()           # as if this thread were inside the section
    done = []

    def free():
        r.deallocate(p, 1000)       # what a finalizer would do
        r.deallocate_async(q, 500, 256, 0)
        done.append(True)

    t = threading.Thread(target=free)
    t.start()
    t.join(10)
    r._mutex.put(True)
    assert done == [True]
    if isinstance(r, StatisticsResource):
        s = r.statistics
        assert (s.current_bytes, s.current_count, s.peak_bytes, s.total_count) == (0, 0, 1500, 2)
    else:
        assert r.get_allocated_bytes() == 0


def test_a_finalizer_run_as_the_lock_is_taken_or_let_go_sees_it_held():
    """From Python 3.12 on the collector runs wherever the interpreter checks for pending work,
    as right after the inner lock's acquire returns: a finalizer run there (or between
    clearing the owner and letting go) sees the lock as held by its thread, so it defers
    itself, and a nested acquire is refused instead of waiting on itself for ever (a
    free-threaded stress run hung that way, inside the emulator's lock)."""
    import threading
    from hipmr_ctypes._locks import DeferringLock
    lock = DeferringLock()
    seen = []

    class Inner:
        """The inner lock, with a 'finalizer' right after it is taken and let go."""

        def __init__(self):
            self.real = threading.Lock()

        def acquire(self, blocking=True):
            got = self.real.acquire(blocking)
            if got:
                seen.append(("taken", lock.held_here(), _nested(lock)))
            return got

        def release(self):
            self.real.release()
            seen.append(("let go", lock.held_here(), _nested(lock)))

        def locked(self):
            return self.real.locked()

    lock._lock = Inner()
    with lock:
        assert lock.held_here()
    assert seen == [("taken", True, "refused"), ("let go", True, "refused")]
    assert not lock.held_here() and lock._moving == set()
    with lock:   # and free for the next taker
        pass


def _nested(lock):
    try:
        lock.acquire()
    except RuntimeError:
        return "refused"
    lock.release()
    return "taken"
