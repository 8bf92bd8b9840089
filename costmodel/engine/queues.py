"""The event loop's queues: sorted arrays, not heaps.

**The event queue** orders (time, kind * key_span + key). It is a sorted array, the next
event last (:func:`evq_push`): at most one event per device and per link is pending, and
on so short a queue one insertion scan costs fewer instructions and branch misses than a
binary heap's push and pop (synthetic-10k, random placements: 868 instructions and 16.4
branch misses per op, against 929 and 17.2 with the heap). Its compares take the times'
bit patterns as int64 (event times are finite and never negative, so they order alike).

**Ready queues**: per device, a sorted array of int64 op keys ``(epoch << 32) | rank``
(the epoch counts distinct event instants; ready times only grow, so (epoch, rank) orders
exactly like (ready time, rank)), and a sorted array of send/receive tasks keyed by
``(epoch << 32 | producer rank, (tensor * D + destination) * 2 + kind - 1)``. Both are
slices of shared buffers, sized by how many ops (tasks) each device can hold. A new key is
never below a key of an earlier instant, so it is inserted by a short scan back from the
end (:func:`readyq_push`, :func:`taskq_push`), and the next entry is the slice's first: a
pop moves the slice's start (``rq_base``, ``tq_base``) one on. Binary heaps had sifted
through ~7 levels per pop on the zoo graphs, whose devices hold a hundred or more ready
ops on average at a pop (variables and constants are all ready at time 0). A ready-op
insertion passes at most ``READY_SCAN`` keys; past that it leaves the slice unsorted
(``rq_unsorted``) and the slice is sorted once before the device's next pop or a
checkpoint, so a wide fan-out whose edges list its consumers in falling rank costs a sort,
not a quadratic number of shifts.

Every index is cast to unsigned (``U64``): see :mod:`placetool.costmodel.engine.loop`.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .state import U64


@njit(cache=True)
def time_bits(ev_t, ev_b, j, t):
    """Time ``t`` as an int64 that orders as the times do (its float64 bit pattern; event
    times are finite and never negative), written to and read back from free slot ``j``
    of ``ev_t`` and its int64 view ``ev_b``: the event queue (:func:`evq_push`) is sorted
    on these integers (fewer instructions and no unordered case per compare)."""
    ev_t[U64(j)] = t
    return ev_b[U64(j)]


@njit(cache=True)
def evq_push(ev_b, ev_k, ev_id, size, b, k, i):
    """Insert event (b, k) -> i into the event queue: ``size`` entries sorted by
    decreasing (b, k), so the next event is the last and a pop is ``size - 1``.
    Returns the new size. At most one event per device and per link is pending, so
    the queue is short, and the one data-dependent exit of this scan mispredicts less
    often than a heap's sifts, which branch on every level of a push and a pop."""
    # Shaped like search/heaps.py's heap_push (three parallel arrays moved in step), but
    # an insertion into a sorted array, not a heap's sift-up: the two queues differ in size
    # and use (heaps.py's docstring), so neither serves the other.
    j = U64(size)
    while j > U64(0):
        pb = ev_b[j - U64(1)]
        if pb < b or (pb == b and ev_k[j - U64(1)] < k):
            ev_b[j] = pb
            ev_k[j] = ev_k[j - U64(1)]
            ev_id[j] = ev_id[j - U64(1)]
            j -= U64(1)
        else:
            break
    ev_b[j] = b
    ev_k[j] = k
    ev_id[j] = i
    return size + 1


#: the most keys a ready-queue insertion passes before it leaves the slice unsorted
READY_SCAN = 8


@njit(cache=True)
def readyq_push(rq, base, size, key):
    """Insert an int64 key into a device's ready queue rq[base:base+size], kept sorted
    (the next op first); False if it left the slice unsorted instead.

    Keys only grow in their epoch (the high half), so a new key belongs after every key
    of an earlier instant: the scan back stops at the first of them, after passing only
    the keys of this instant with a higher rank (usually none). An instant that queues
    many ops on one device in falling rank order would make that quadratic, so past
    ``READY_SCAN`` keys the key takes the free place where the scan stands, and the
    caller sorts the slice before its next pop (:func:`readyq_sort`)."""
    h = U64(base)
    j = U64(size)
    steps = 0
    while j > 0:
        q = rq[h + j - U64(1)]
        if key < q:
            if steps == READY_SCAN:
                rq[h + j] = key
                return False
            rq[h + j] = q
            j -= U64(1)
            steps += 1
        else:
            break
    rq[h + j] = key
    return True


#: readyq_sort's insertion-sorted blocks, merged pairwise after
SORT_BLOCK = 16


@njit(cache=True)
def readyq_sort(rq, base, size):
    """Sort a device's ready queue that :func:`readyq_push` left unsorted: blocks of
    ``SORT_BLOCK`` by insertion, then merged pairwise. (numba's quicksort degrades on the
    runs readyq_push leaves, and its merge sort took a second of a cold start to compile.)"""
    a = rq[base:base + size]
    for lo in range(0, size, SORT_BLOCK):
        for i in range(lo + 1, min(lo + SORT_BLOCK, size)):
            key = a[i]
            j = i
            while j > lo and a[j - 1] > key:
                a[j] = a[j - 1]
                j -= 1
            a[j] = key
    if size <= SORT_BLOCK:
        return
    src, dst = a, np.empty_like(a)
    width = SORT_BLOCK
    while width < size:
        for lo in range(0, size, 2 * width):
            mid, hi = min(lo + width, size), min(lo + 2 * width, size)
            i, j = lo, mid
            for k in range(lo, hi):
                if j >= hi or (i < mid and src[i] <= src[j]):
                    dst[k] = src[i]
                    i += 1
                else:
                    dst[k] = src[j]
                    j += 1
        src, dst = dst, src
        width *= 2
    if src is not a:
        for k in range(size):  # a loop: a slice assignment compiles numba's shape-error message
            a[k] = src[k]


@njit(cache=True)
def taskq_push(k1, k2, ids, base, size, a, b, i):
    """Insert task (a, b) -> i into a device's task queue, the slices [base:base+size]
    of ``k1``, ``k2`` and ``ids`` kept sorted by (a, b), the next task first; returns the
    new size. Like :func:`readyq_push`: ``a`` never goes back in epoch, so the scan back
    is short."""
    h = U64(base)
    j = U64(size)
    while j > 0:
        q = k1[h + j - U64(1)]
        if a < q or (a == q and b < k2[h + j - U64(1)]):
            k1[h + j] = q
            k2[h + j] = k2[h + j - U64(1)]
            ids[h + j] = ids[h + j - U64(1)]
            j -= U64(1)
        else:
            break
    k1[h + j] = a
    k2[h + j] = b
    ids[h + j] = i
    return size + 1
