"""The free lists a resource has let go while a lock-free free may still hold them.

The pool and the fixed-size resource forget a stream's free lists (when they flush them, when
the stream is destroyed, when it has nothing cached); their frees take no lock, so a free may
have fetched such a list just before and append its block to it just after.  Whether anybody
still holds the list is not decided by counting references (CPython 3.14 borrows references on
the evaluation stack, so the count is not the same on every version); the program states it:

* before its last drain of a list it lets go, the resource records the list in
  :data:`DEAD` (:func:`let_go`) with its own ``rescue`` and what the blocks belong to;
* a free reads the table after its ``append`` (``if ANY and id(lst) in DEAD``: an empty
  table when no list is let go, which is almost always; module globals, not closure cells,
  which every call of the fast path would copy); a list found there gets its blocks moved
  back by the resource that let it go (:func:`rescue`), under that resource's lock.

Each append is seen by the last drain or by the free that made it: the table entry is made
before that drain, and the list's own operations order the append and the drain.  An entry
lives while the list does: a weak reference removes it when the last holder lets the list go,
so the table stays as small as the number of frees in flight.  Free lists are ``deque``\\ s
(a ``list`` takes no weak reference).
"""
from __future__ import annotations

import weakref
from typing import Any, Callable, Deque, Dict, List, Tuple

__all__ = ["ANY", "DEAD", "let_go", "owner", "rescue"]

#: ``id(list) -> (weak reference, the resource's rescue, what its blocks belong to)`` for every
#: list let go and still held, of every resource (one table: the fast paths read a module
#: global, not a closure cell)
DEAD: Dict[int, Tuple[Any, Callable[[Deque[int], Any], None], Any]] = {}
#: the keys of :data:`DEAD`, each added with its entry and removed with it: the fast paths test
#: ``if ANY`` first (a list's truth test is one of the interpreter's cheapest; a dict's is not)
ANY: List[int] = []


def let_go(lst: Deque[int], rescue_: Callable[[Deque[int], Any], None], belongs: Any) -> None:
    """Record ``lst`` as let go by a resource (before its last drain; the resource's lock
    held): a free that appended to it calls ``rescue_(lst, belongs)``."""
    key = id(lst)

    def gone(_ref: Any, pop: Any = DEAD.pop, remove: Any = ANY.remove) -> None:
        pop(key, None)   # (both atomic: the callback runs wherever the list dies)
        try:
            remove(key)
        except ValueError:
            pass

    DEAD[key] = (weakref.ref(lst, gone), rescue_, belongs)
    ANY.append(key)


def owner(lst: Deque[int]) -> Any:
    """What the blocks of ``lst`` (let go, still alive) belong to."""
    return DEAD[id(lst)][2]


def rescue(lst: Deque[int]) -> None:
    """Called by a free that appended to ``lst`` and found it in :data:`DEAD`: the resource
    that let it go moves its blocks back."""
    _, rescue_, belongs = DEAD[id(lst)]
    rescue_(lst, belongs)
