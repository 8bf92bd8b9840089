"""A binary min-heap over three parallel arrays (time, key, id), for the list schedulers
(:mod:`placetool.search.listsched`). The simulator's own queues are sorted arrays
(:mod:`placetool.costmodel.engine.queues`).

heap_push and heap_pop move the three arrays in step and so read alike, but push sifts a
key up and pop sifts the last key down from the root: opposite walks, not one logic. The
engine's evq_push moves the same three arrays but inserts into a sorted array, which suits
its queue of at most one event per device and link, not the list schedulers' queues of
ready ops (every op whose priority is known can wait in one at once).
"""

from __future__ import annotations

import numpy as np
from numba import njit

U64 = np.uint64


@njit(cache=True, inline="always")
def _less(ta, ka, tb, kb):
    return ta < tb or (ta == tb and ka < kb)


@njit(cache=True)
def heap_push(ev_t, ev_k, ev_id, size, t, k, i):
    """Push (t, k) -> i onto a min-heap ordered by (t, k) in three parallel arrays; returns the new size."""
    j = U64(size)  # unsigned positions: no negative-index wraparound per access
    while j > 0:
        parent = (j - U64(1)) >> U64(1)
        if _less(t, k, ev_t[parent], ev_k[parent]):
            ev_t[j] = ev_t[parent]
            ev_k[j] = ev_k[parent]
            ev_id[j] = ev_id[parent]
            j = parent
        else:
            break
    ev_t[j] = t
    ev_k[j] = k
    ev_id[j] = i
    return size + 1

@njit(cache=True)
def heap_pop(ev_t, ev_k, ev_id, size):
    """Remove the root of a heap_push heap; returns the new size."""
    size -= 1
    t, k, i = ev_t[size], ev_k[size], ev_id[size]
    j = 0
    while True:
        c = 2 * j + 1
        if c >= size:
            break
        if c + 1 < size and _less(ev_t[c + 1], ev_k[c + 1], ev_t[c], ev_k[c]):
            c += 1
        if _less(ev_t[c], ev_k[c], t, k):
            ev_t[j] = ev_t[c]
            ev_k[j] = ev_k[c]
            ev_id[j] = ev_id[c]
            j = c
        else:
            break
    if size > 0:
        ev_t[j] = t
        ev_k[j] = k
        ev_id[j] = i
    return size


