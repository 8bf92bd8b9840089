"""The compiled simulation engine: one event loop for full and incremental runs.

Same rules as :mod:`placetool.costmodel.reference` (read its docstring), bit for bit. The
loop :func:`_run` handles the same events as the reference with the same steps
(dispatch; op, send, link and receive done, each a commented block mirroring the
reference's function of that name), on arrays packed in named tuples:

- :class:`Net`: the graph on the cluster (CSR adjacency, op times, links, device
  transfer costs), read only;
- :class:`Work`: the running state, allocated once and reused across calls (one per
  thread); nothing in it needs clearing between runs except what :func:`init_fresh`
  resets;
- :class:`Checkpoints` and :class:`Base`: the incremental simulator's saved states and
  its base run (see :mod:`placetool.costmodel.incremental`).

A full simulation is the incremental loop with no checkpoints: :func:`simulate_full`
runs :func:`_run` with the literal ``INCR=False``, which compiles the checkpoint and
convergence bookkeeping away.

Memory is tracked as *live* bytes (outputs and received copies) per device; parameter
bytes are constant over a run, so peak = parameters + peak live, added by the caller.
``copy_of[t * D + d]`` (the transfer bringing tensor t to device d) is never cleared:
it is read only for transfers made in this run (an op's inputs, a restored base run's
transfers). Whether tensor t already goes to device d is asked only while t's producer
ends, when all of t's transfers are made: ``sent[d]`` (the last transfer made to d in
this run; reset with each run and each restore) answers it if it lies among the
transfers made for t, so the loop never reads a stale entry of the large table (that
read missed the cache on most remote consumers).

The loop's footprint is kept small because it decides its speed once a graph outgrows
the core's cache: index arrays of the workspace are int32, each op's time on its device
is gathered once per placement (``tp``, 8 bytes an op instead of a row of ``T``), and a
plain run writes no trace (``trace``) and no instant times (read only by checkpoints).

Every array index inside the loop is cast to unsigned (``U64(...)``, free at run time):
numba then skips its negative-index wraparound, a sign test and a reload of the array's
length at every access, which was about a third of the loop's instructions. The indices
are never negative there (sentinels such as ``-1`` are tested before they index).

The event queue orders (time, kind * key_span + key). It is a sorted array, the next
event last (:func:`evq_push`): at most one event per device and per link is pending, and
on so short a queue one insertion scan costs fewer instructions and branch misses than a
binary heap's push and pop (synthetic-10k, random placements: 868 instructions and 16.4
branch misses per op, against 929 and 17.2 with the heap). Its compares take the times'
bit patterns as int64 (event times are finite and never negative, so they order alike).

Ready queues: per device, a sorted array of int64 op keys ``(epoch << 32) | rank`` (the
epoch counts distinct event instants; ready times only grow, so (epoch, rank) orders
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
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

# Event kinds, in the order events of one instant are handled (see reference.py).
OP_DONE = 0
SEND_DONE = 1
XFER_DONE = 2
RECV_DONE = 3
LOW = np.int64(0xFFFFFFFF)
U64 = np.uint64


# ---------------------------------------------------------- queues and heaps
# heap_push / heap_pop: a binary heap over three parallel arrays, used by the list
# schedulers (search.listsched); the event loop's queues are sorted arrays (below).
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


# ------------------------------------------------------------------- packing
class Net(NamedTuple):
    """The graph on the cluster, as the engine reads it (index arrays are int32)."""

    T: np.ndarray  # float64 [n, D]: op time on each device
    rank: np.ndarray  # [n] topological rank
    topo_order: np.ndarray  # [n] op of each rank
    out_bytes: np.ndarray  # int64 [n]
    tensor_op: np.ndarray  # [nt] producer
    tensor_bytes: np.ndarray  # int64 [nt]
    op_tensor_ptr: np.ndarray  # [n + 1] -> tensors (tensors are sorted by op)
    tensor_ptr: np.ndarray  # [nt + 1] -> tensor_cons
    tensor_cons: np.ndarray  # [n_data] consumer per data edge
    ctrl_ptr: np.ndarray  # [n + 1] -> ctrl_dst
    ctrl_dst: np.ndarray
    in_ptr: np.ndarray  # [n + 1] -> in_tensor
    in_tensor: np.ndarray  # [n_data] tensor per data edge into op
    n_inputs: np.ndarray  # [n] data + control edges in
    latency: np.ndarray  # float64 [D, D]
    bandwidth: np.ndarray  # float64 [D, D]
    xcost: np.ndarray  # float64 [4, D]: send_us, send_us_per_byte, recv_us, recv_us_per_byte
    has_tasks: bool  # some device has a nonzero send/receive cost
    fifo_links: bool  # transfers on one link run one at a time (cluster.link_queue "fifo"), else side by side


def make_net(graph, cluster, T) -> Net:
    """Pack a graph, cluster and op-time matrix for the engine."""
    c = graph.csr
    ip = np.int32  # half the memory traffic of intp; the loop widens on use

    def a(x, dt=ip):
        return np.ascontiguousarray(x, dt)

    xcost = np.ascontiguousarray(cluster.transfer_costs(), np.float64)
    return Net(
        T=a(T, np.float64), rank=a(graph.topo_rank), topo_order=a(graph.topo_order),
        out_bytes=a(graph.out_bytes, np.int64), tensor_op=a(graph.tensor_op),
        tensor_bytes=a(graph.tensor_bytes, np.int64), op_tensor_ptr=a(c.op_tensor_ptr), tensor_ptr=a(c.tensor_ptr),
        tensor_cons=a(c.tensor_cons), ctrl_ptr=a(c.ctrl_ptr), ctrl_dst=a(c.ctrl_dst), in_ptr=a(c.in_ptr),
        in_tensor=a(c.in_tensor), n_inputs=a(c.n_inputs), latency=a(cluster.latency_us, np.float64),
        bandwidth=a(cluster.bandwidth_bytes_per_us, np.float64), xcost=xcost, has_tasks=bool(np.any(xcost != 0)),
        fifo_links=cluster.link_queue == "fifo",
    )


class Work(NamedTuple):
    """The engine's running state (and the trace of the last run)."""

    live: np.ndarray  # int64 [D] output and copy bytes held now
    livepeak: np.ndarray  # int64 [D]
    seg: np.ndarray  # int64 [D] live peak since the last checkpoint
    busy: np.ndarray  # float64 [D]
    running: np.ndarray  # bool [D]
    rq: np.ndarray  # int64 [n] ready-op keys, one sorted slice per device
    rq_base: np.ndarray  # [D] start of each slice (moves on as ops are popped)
    rq_size: np.ndarray  # [D]
    tq_k1: np.ndarray  # int64 task queues, one sorted slice per device: (epoch << 32) | producer rank
    tq_k2: np.ndarray  # int64 (tensor * D + destination) * 2 + kind - 1
    tq_id: np.ndarray  # transfer * 2 + kind - 1
    tq_base: np.ndarray  # [D] start of each slice (moves on as tasks are popped)
    tq_size: np.ndarray  # [D]
    epoch_time: np.ndarray  # float64: time of each distinct event instant
    missing: np.ndarray  # [n] inputs not yet on the op's device
    out_refs: np.ndarray  # [n] holders of the op's outputs
    x_tensor: np.ndarray  # per transfer, in creation order
    x_src: np.ndarray
    x_dst: np.ndarray
    x_refs: np.ndarray  # consumers on the destination not yet finished
    x_next: np.ndarray  # next transfer in the link queue
    copy_of: np.ndarray  # [nt * D] transfer of (tensor, destination); see the module docstring
    link_head: np.ndarray  # [D * D]
    link_tail: np.ndarray
    link_busy: np.ndarray
    link_pending: np.ndarray  # link in ``pending`` (may start a transfer at the next dispatch)
    pending: np.ndarray
    ev_t: np.ndarray  # event queue, next event last: time, kind * key_span + (rank or transfer), op or transfer
    ev_k: np.ndarray
    ev_id: np.ndarray
    op_start: np.ndarray  # float64 [n] (traced runs only)
    op_end: np.ndarray  # float64 [n] (traced and incremental runs)
    x_start: np.ndarray  # float64 link start and end (traced runs only)
    x_end: np.ndarray
    x_task: np.ndarray  # float64 [n_data, 4] send start, end, receive start, end (traced; NaN set by the caller)
    moved: np.ndarray  # bool [n] ops a move changed (incremental only)
    mark: np.ndarray  # [n] scratch
    sc: np.ndarray  # int64 [4]: n_ev, n_x, n_checkpoints, epoch
    sf: np.ndarray  # float64 [2]: makespan, now (the last instant handled)
    dev_pending: np.ndarray  # bool [D] device in ``dpend`` (may start a task at the next dispatch)
    dpend: np.ndarray  # [D]
    tp: np.ndarray  # float64 [n] each op's time on its device (gathered by set_bases)
    sent: np.ndarray  # [D] the last transfer made to each device (see the module docstring)
    last_op: np.ndarray  # [D] the op each device started last (traced runs)
    op_prev: np.ndarray  # [n] the op its device started before it, -1 for its first (traced runs)
    rq_unsorted: np.ndarray  # bool [D] the device's ready queue needs readyq_sort before its next pop


def make_work(n, nt, n_data, D, fifo_links=True):
    """A Work for graphs of n ops, nt tensors and n_data data edges on D devices."""
    n1 = max(n, 1)
    m = max(n_data, 1)
    L = D * D
    cap = n + 3 * n_data + 1
    # pending events: at most one per device, one per link (links that do not queue: one
    # per transfer in flight), plus time_bits' free slot
    E = 2 * D + (L if fifo_links else max(L, m)) + 1
    ip = np.int32  # half the memory traffic of intp (see the module docstring)
    return Work(
        np.zeros(D, np.int64), np.zeros(D, np.int64), np.zeros(D, np.int64), np.zeros(D), np.zeros(D, np.bool_),
        np.zeros(n1, np.int64), np.zeros(D, ip), np.zeros(D, ip),
        np.zeros(2 * m, np.int64), np.zeros(2 * m, np.int64), np.zeros(2 * m, ip), np.zeros(D, ip), np.zeros(D, ip),
        np.zeros(cap + 1), np.zeros(n1, ip), np.zeros(n1, ip),
        np.zeros(m, ip), np.zeros(m, ip), np.zeros(m, ip), np.zeros(m, ip), np.zeros(m, ip),
        np.full(max(nt, 1) * D, -1, ip),
        np.full(L, -1, ip), np.full(L, -1, ip), np.zeros(L, np.bool_), np.zeros(L, np.bool_), np.zeros(L, ip),
        np.zeros(E), np.zeros(E, np.int64), np.zeros(E, ip),
        np.zeros(n1), np.zeros(n1), np.zeros(m), np.zeros(m), np.zeros((m, 4)),
        np.zeros(n1, np.bool_), np.zeros(n1, ip), np.zeros(4, np.int64), np.zeros(2),
        np.zeros(D, np.bool_), np.zeros(D, ip), np.zeros(n1), np.zeros(D, ip),
        np.full(D, -1, ip), np.full(n1, -1, ip), np.zeros(D, np.bool_),
    )


def work_for(net: Net) -> Work:
    """A Work sized for ``net``."""
    n, D = net.T.shape
    return make_work(n, net.tensor_op.shape[0], net.tensor_cons.shape[0], D, net.fifo_links)


class Checkpoints(NamedTuple):
    """Saved states of a base run (leading axis: checkpoint)."""

    f: np.ndarray  # float64 [C, 3]: next event time, makespan, now
    i: np.ndarray  # int64 [C, 8]: n_x, n_ev, epoch, clean, 2 checksums, task offset, task count
    busy: np.ndarray  # [C, D]
    live: np.ndarray
    livepeak: np.ndarray
    running: np.ndarray
    rqsize: np.ndarray
    tqsize: np.ndarray
    link: np.ndarray  # [C, 3, L] head, tail, busy
    ev_t: np.ndarray  # [C, E] the event queue
    ev_k: np.ndarray
    ev_id: np.ndarray
    op: np.ndarray  # [C, 2, n] missing, out_refs
    rq: np.ndarray  # [C, n] ready-op keys, device by device
    rqready: np.ndarray  # [C, n] their ready times
    x: np.ndarray  # [C, 2, n_data] refs, next
    seg: np.ndarray  # [C, D] live peak of the segment that starts at each checkpoint
    alive: np.ndarray  # [C] transfers with refs > 0
    tq_k1: np.ndarray  # [P] pool of saved task queues (checkpoint j at i[j, 6], i[j, 7] long)
    tq_k2: np.ndarray
    tq_id: np.ndarray
    tq_ready: np.ndarray


def make_checkpoints(C, n, n_data, D, pool):
    """Room for C checkpoints; ``pool`` queued send/receive tasks across all of them."""
    L, E = D * D, 2 * D + D * D
    n1, m, P = max(n, 1), max(n_data, 1), max(pool, 1)
    return Checkpoints(
        np.zeros((C, 3)), np.zeros((C, 8), np.int64), np.zeros((C, D)), np.zeros((C, D), np.int64),
        np.zeros((C, D), np.int64), np.zeros((C, D), np.bool_), np.zeros((C, D), np.intp), np.zeros((C, D), np.intp),
        np.zeros((C, 3, L), np.intp), np.zeros((C, E)), np.zeros((C, E), np.int64), np.zeros((C, E), np.intp),
        np.zeros((C, 2, n1), np.intp), np.zeros((C, n1), np.int64), np.zeros((C, n1)), np.zeros((C, 2, m), np.intp),
        np.zeros((C, D), np.int64), np.zeros(C, np.int64),
        np.zeros(P, np.int64), np.zeros(P, np.int64), np.zeros(P, np.intp), np.zeros(P),
    )


class Base(NamedTuple):
    """The base run's transfers (tensor, source, destination) and copy table."""

    x_tensor: np.ndarray
    x_src: np.ndarray
    x_dst: np.ndarray
    copy_of: np.ndarray


def make_base(nt, n_data, D):
    """Room for the base run's transfers."""
    m = max(n_data, 1)
    return Base(np.zeros(m, np.intp), np.zeros(m, np.intp), np.zeros(m, np.intp), np.full(max(nt, 1) * D, -1, np.intp))


# ------------------------------------------------------------------ set-up
@njit(cache=True)
def set_bases(net, w, placement):
    """Slice the ready-op and task buffers by device for ``placement``, and gather
    each op's time on its device into ``w.tp``.

    Device d's ready slice starts with room for all its ops, and its task slice with
    room for all the tasks it can be given; popping moves a slice's start on, and since
    each op (task) is queued at most once a run, or after a restore at most once beside
    those restored, pushes never pass the next device's slice."""
    net_in_ptr = net.in_ptr
    net_op_tensor_ptr = net.op_tensor_ptr
    net_tensor_ptr = net.tensor_ptr
    net_T = net.T
    w_live = w.live
    w_rq_base = w.rq_base
    w_rq_size = w.rq_size
    w_tp = w.tp
    w_tq_base = w.tq_base
    w_tq_size = w.tq_size
    D = w_live.shape[0]
    n = placement.shape[0]
    for d in range(D):
        w_rq_size[d] = 0  # used as a counter here
        w_tq_size[d] = 0
    for op in range(n):
        d = U64(placement[op])
        w_rq_size[d] += 1
        w_tp[op] = net_T[op, d]
    acc = 0
    for d in range(D):
        w_rq_base[d] = acc
        acc += w_rq_size[d]
    if net.has_tasks:
        # a device holds at most one send task per data edge out of its ops and one
        # receive task per data edge into them
        for op in range(n):
            d = U64(placement[op])
            w_tq_size[d] += (net_tensor_ptr[net_op_tensor_ptr[op + 1]] - net_tensor_ptr[net_op_tensor_ptr[op]]
                             + net_in_ptr[op + 1] - net_in_ptr[op])
        acc = 0
        for d in range(D):
            w_tq_base[d] = acc
            acc += w_tq_size[d]


@njit(cache=True, nogil=True)
def init_fresh(net, w, placement):
    """The state at time 0 before the first dispatch."""
    net_n_inputs = net.n_inputs
    net_topo_order = net.topo_order
    w_busy = w.busy
    w_epoch_time = w.epoch_time
    w_link_busy = w.link_busy
    w_link_head = w.link_head
    w_link_pending = w.link_pending
    w_link_tail = w.link_tail
    w_live = w.live
    w_livepeak = w.livepeak
    w_missing = w.missing
    w_out_refs = w.out_refs
    w_rq = w.rq
    w_rq_base = w.rq_base
    w_rq_size = w.rq_size
    w_running = w.running
    w_sc = w.sc
    w_seg = w.seg
    w_sent = w.sent
    w_last_op = w.last_op
    w_sf = w.sf
    w_tq_size = w.tq_size
    n = placement.shape[0]
    D = w_live.shape[0]
    set_bases(net, w, placement)
    for d in range(D):
        w_live[d] = 0
        w_livepeak[d] = 0
        w_seg[d] = 0
        w_busy[d] = 0.0
        w_running[d] = False
        w_rq_size[d] = 0
        w_tq_size[d] = 0
    for l in range(D * D):
        w_link_head[l] = -1
        w_link_tail[l] = -1
        w_link_busy[l] = False
        w_link_pending[l] = False
    for op in range(n):
        w_missing[op] = net_n_inputs[op]
        w_out_refs[op] = 0
    for r in range(n):  # in rank order, so that each key goes to the end of its queue
        op = net_topo_order[r]
        if w_missing[op] == 0:
            d = U64(placement[op])
            w_rq[w_rq_base[d] + w_rq_size[d]] = np.int64(r)
            w_rq_size[d] += 1
    w_epoch_time[0] = 0.0
    w.rq_unsorted[:] = False
    w_sent[:] = -1
    w_last_op[:] = -1
    w_sc[0] = 0
    w_sc[1] = 0
    w_sc[3] = 0
    w_sf[0] = 0.0
    w_sf[1] = 0.0


# ---------------------------------------------------------------- the loop
@njit(cache=True, error_model="numpy")  # as its callers: a division by zero gives inf, not an exception
def _run(net, w, ck, base, placement, moved_ops, start_ck, n_ck, record, every, check, INCR, trace):
    """Run from the state in ``w`` to the end of the step.

    With ``trace`` it records every op's and transfer's start and end (a flag tested at
    run time: one compiled loop serves both, and the test costs nothing measurable).

    With ``INCR`` (a literal): ``record`` saves a checkpoint every ``every`` events into
    the slots after ``start_ck``; ``check`` compares the state with the base run's
    checkpoints after ``start_ck`` (up to ``n_ck``) and stops at the first that matches.
    Returns the matched checkpoint or -1; the makespan is left in ``w.sf[0]``.

    A full run passes ``ck`` and ``base`` as None and literal constants for the rest:
    numba compiles a loop per set of literals, LLVM folds the ``INCR`` tests away, and
    numba drops the blocks under ``if ck is not None`` before typing them (it prunes
    branches on an argument's None-ness, not on a literal bool), so the first full
    simulation never compiles ``save``, ``converged`` or the checkpoint makers. ``_run``
    is a function of its own rather than inlined into its callers: inlining copied its IR
    into each, which cost about 7 s of the first incremental run's compile.
    """
    rank, topo_order, out_bytes = net.rank, net.topo_order, net.out_bytes
    tensor_op, tensor_bytes, op_tensor_ptr = net.tensor_op, net.tensor_bytes, net.op_tensor_ptr
    tensor_ptr, tensor_cons, ctrl_ptr, ctrl_dst = net.tensor_ptr, net.tensor_cons, net.ctrl_ptr, net.ctrl_dst
    in_ptr, in_tensor, latency, bandwidth, xcost = net.in_ptr, net.in_tensor, net.latency, net.bandwidth, net.xcost
    has_tasks, fifo_links = net.has_tasks, net.fifo_links
    lat_l, bw_l = latency.reshape(-1), bandwidth.reshape(-1)  # by link l = src * D + dst
    live, livepeak, seg, busy, running = w.live, w.livepeak, w.seg, w.busy, w.running
    rq, rq_base, rq_size = w.rq, w.rq_base, w.rq_size
    tq_k1, tq_k2, tq_id, tq_base, tq_size = w.tq_k1, w.tq_k2, w.tq_id, w.tq_base, w.tq_size
    epoch_time, missing, out_refs = w.epoch_time, w.missing, w.out_refs
    x_tensor, x_src, x_dst, x_refs, x_next, copy_of = w.x_tensor, w.x_src, w.x_dst, w.x_refs, w.x_next, w.copy_of
    link_head, link_tail, link_busy = w.link_head, w.link_tail, w.link_busy
    link_pending, pending = w.link_pending, w.pending
    ev_t, ev_k, ev_id = w.ev_t, w.ev_k, w.ev_id
    ev_b = ev_t.view(np.int64)  # event times as ordered integers (see time_bits)
    op_start, op_end, x_start, x_end, x_task, moved = w.op_start, w.op_end, w.x_start, w.x_end, w.x_task, w.moved
    dev_pending, dpend, tp, sent = w.dev_pending, w.dpend, w.tp, w.sent
    last_op, op_prev, rq_unsorted = w.last_op, w.op_prev, w.rq_unsorted

    D = live.shape[0]
    n = placement.shape[0]
    key_span = np.int64(max(n, tensor_cons.shape[0]) + 1)
    n_ev = w.sc[0]
    n_x = w.sc[1]
    epoch = w.sc[3]
    makespan = w.sf[0]
    now = w.sf[1]
    n_pending = 0
    # dispatch visits only devices that may start a task: every device first, then those
    # that fell idle or got a ready task while idle (an idle device has nothing ready
    # after a dispatch, and the order devices start in changes nothing)
    for d in range(D):
        dev_pending[d] = True
        dpend[d] = d
    n_dpend = D
    if INCR:
        # pending links are not part of a checkpoint: after a restore every link may start
        for l in range(D * D):
            link_pending[l] = False
            if not link_busy[l] and link_head[l] >= 0:
                link_pending[l] = True
                pending[n_pending] = l
                n_pending += 1
    if ck is not None:  # see the docstring: a full run's compile drops every block under this test
        ck_f = ck.f
        cap_ck = ck_f.shape[0]
        cap_ev = ck.ev_t.shape[1]
    n_moved = moved_ops.shape[0]
    n_moved_done = 0
    next_ck = start_ck + 1
    since = every if start_ck < 0 else 0
    cj = start_ck + 1  # next base checkpoint to compare against
    cj_t = np.inf  # its time: an instant before it needs no comparison
    if ck is not None and cj < n_ck:
        cj_t = ck.f[cj, 0]
    fresh = start_ck < 0  # no event handled yet
    # op-weighted sums of missing inputs and output references: a cheap first test of
    # whether two states can be equal (a restored checkpoint saved its own)
    wm = np.int64(0)
    wo = np.int64(0)
    if ck is not None:
        if start_ck >= 0:
            wm = ck.i[start_ck, 4]
            wo = ck.i[start_ck, 5]
        else:
            for op in range(n):
                wm += missing[op] * np.int64(op + 1)
                wo += out_refs[op] * np.int64(op + 1)

    matched = -1
    while True:
        # ---- dispatch: idle devices start their best ready task, idle links their oldest transfer
        for k in range(n_dpend):
            d = dpend[U64(k)]
            dev_pending[U64(d)] = False
            if running[U64(d)]:
                continue
            if rq_unsorted[U64(d)]:
                readyq_sort(rq, rq_base[U64(d)], rq_size[U64(d)])
                rq_unsorted[U64(d)] = False
            if has_tasks and tq_size[U64(d)] > 0 and (rq_size[U64(d)] == 0
                                                      or tq_k1[U64(tq_base[U64(d)])] < rq[U64(rq_base[U64(d)])]):
                task = tq_id[U64(tq_base[U64(d)])]
                tq_base[U64(d)] += 1
                tq_size[U64(d)] -= 1
                x = task >> 1
                recv = task & 1
                b = tensor_bytes[U64(x_tensor[U64(x)])]
                dur = xcost[U64(2 * recv), U64(d)] + b * xcost[U64(2 * recv + 1), U64(d)]
                running[U64(d)] = True
                busy[U64(d)] += dur
                if trace:
                    x_task[U64(x), U64(2 * recv)] = now
                    x_task[U64(x), U64(2 * recv + 1)] = now + dur
                n_ev = evq_push(ev_b, ev_k, ev_id, n_ev, time_bits(ev_t, ev_b, n_ev, now + dur),
                                 (SEND_DONE + 2 * recv) * key_span + x, x)
            elif rq_size[U64(d)] > 0:
                op = topo_order[U64(rq[U64(rq_base[U64(d)])] & LOW)]
                rq_base[U64(d)] += 1  # the slice's free room moves to its front (see set_bases)
                rq_size[U64(d)] -= 1
                running[U64(d)] = True
                end = now + tp[U64(op)]
                if trace:
                    op_start[U64(op)] = now
                    op_prev[U64(op)] = last_op[U64(d)]
                    last_op[U64(d)] = op
                if INCR or trace:
                    op_end[U64(op)] = end
                busy[U64(d)] += tp[U64(op)]
                live[U64(d)] += out_bytes[U64(op)]
                if live[U64(d)] > livepeak[U64(d)]:
                    livepeak[U64(d)] = live[U64(d)]
                if INCR and live[U64(d)] > seg[U64(d)]:
                    seg[U64(d)] = live[U64(d)]
                n_ev = evq_push(ev_b, ev_k, ev_id, n_ev, time_bits(ev_t, ev_b, n_ev, end),
                                 OP_DONE * key_span + rank[U64(op)], op)
        for k in range(n_pending):
            l = pending[U64(k)]
            link_pending[U64(l)] = False
            # reference.dispatch: a fifo link starts its oldest transfer when idle, a link
            # that does not queue every transfer queued on it
            while link_head[U64(l)] >= 0 and not (fifo_links and link_busy[U64(l)]):
                x = link_head[U64(l)]
                link_head[U64(l)] = x_next[U64(x)]
                if link_head[U64(l)] < 0:
                    link_tail[U64(l)] = -1
                link_busy[U64(l)] = fifo_links
                dd = x_dst[U64(x)]
                b = tensor_bytes[U64(x_tensor[U64(x)])]
                t_end = now + (lat_l[U64(l)] + b / bw_l[U64(l)])
                if trace:
                    x_start[U64(x)] = now
                    x_end[U64(x)] = t_end
                live[U64(dd)] += b
                if live[U64(dd)] > livepeak[U64(dd)]:
                    livepeak[U64(dd)] = live[U64(dd)]
                if INCR and live[U64(dd)] > seg[U64(dd)]:
                    seg[U64(dd)] = live[U64(dd)]
                n_ev = evq_push(ev_b, ev_k, ev_id, n_ev, time_bits(ev_t, ev_b, n_ev, t_end),
                                 XFER_DONE * key_span + x, x)
        n_pending = 0
        n_dpend = 0

        if n_ev == 0:
            break
        if ck is not None:
            if record and since >= every and next_ck < cap_ck and n_ev <= cap_ev:
                if save(ck, next_ck, w, placement, now, epoch, 1 if (now < ev_t[n_ev - 1] or fresh) else 0, n_ev,
                        n_x, makespan, wm, wo):
                    next_ck += 1
                    since = 0
            if check and ev_t[n_ev - 1] >= cj_t:
                while cj < n_ck and ck_f[cj, 0] < ev_t[n_ev - 1]:
                    cj += 1
                if cj < n_ck and ck_f[cj, 0] == ev_t[n_ev - 1]:
                    if n_moved_done == n_moved and converged(net, ck, base, cj, w, placement, moved_ops, n_ev, n_x,
                                                             key_span, wm, wo):
                        matched = cj
                        break
                    cj += 1
                cj_t = ck_f[cj, 0] if cj < n_ck else np.inf
        # ---- handle every event of the next instant
        if ev_t[n_ev - 1] > now:
            epoch += 1
            if INCR:  # only checkpoints read instants back
                epoch_time[U64(epoch)] = ev_t[n_ev - 1]
        now = ev_t[n_ev - 1]
        while n_ev > 0 and ev_t[U64(n_ev - 1)] == now:
            # pop the next event: the queue's last entry
            n_ev -= 1
            kind_key = ev_k[U64(n_ev)]
            i = ev_id[U64(n_ev)]
            if INCR:
                since += 1
                fresh = False
            if kind_key < key_span:
                # -- an op ended: free what its inputs held, hand its outputs on
                op = i
                d = placement[U64(op)]
                running[U64(d)] = False
                if not dev_pending[U64(d)]:
                    dev_pending[U64(d)] = True
                    dpend[U64(n_dpend)] = d
                    n_dpend += 1
                if INCR and moved[U64(op)]:
                    n_moved_done += 1
                if now > makespan:
                    makespan = now
                for e in range(in_ptr[U64(op)], in_ptr[U64(op + 1)]):
                    t = in_tensor[U64(e)]
                    prod = tensor_op[U64(t)]
                    if placement[U64(prod)] == d:
                        out_refs[U64(prod)] -= 1
                        wo -= prod + 1
                        if out_refs[U64(prod)] == 0:
                            live[U64(d)] -= out_bytes[U64(prod)]
                    else:
                        x = copy_of[U64(t * D + d)]
                        x_refs[U64(x)] -= 1
                        if x_refs[U64(x)] == 0:
                            live[U64(d)] -= tensor_bytes[U64(t)]
                refs = 0
                for t in range(op_tensor_ptr[U64(op)], op_tensor_ptr[U64(op + 1)]):
                    x_first = n_x
                    for e in range(tensor_ptr[U64(t)], tensor_ptr[U64(t + 1)]):
                        c = tensor_cons[U64(e)]
                        dc = placement[U64(c)]
                        if dc == d:
                            refs += 1
                            missing[U64(c)] -= 1
                            wm -= c + 1
                            if missing[U64(c)] == 0:
                                if not readyq_push(rq, rq_base[U64(dc)], rq_size[U64(dc)], (epoch << 32) | rank[U64(c)]):
                                    rq_unsorted[U64(dc)] = True
                                rq_size[U64(dc)] += 1
                            continue
                        x = sent[U64(dc)]
                        if x >= x_first:  # sent holds only this run's transfers (reset with the run)
                            x_refs[U64(x)] += 1  # already on its way there
                            continue
                        x = n_x
                        n_x += 1
                        sent[U64(dc)] = x
                        copy_of[U64(t * D + dc)] = x
                        x_tensor[U64(x)] = t
                        x_src[U64(x)] = d
                        x_dst[U64(x)] = dc
                        x_refs[U64(x)] = 1
                        refs += 1
                        if has_tasks and xcost[0, U64(d)] + tensor_bytes[U64(t)] * xcost[1, U64(d)] != 0.0:
                            x_next[U64(x)] = -1
                            tq_size[U64(d)] = taskq_push(tq_k1, tq_k2, tq_id, tq_base[U64(d)], tq_size[U64(d)],
                                                         (epoch << 32) | rank[U64(op)], (t * D + dc) * 2, x * 2)
                            continue
                        l = d * D + dc
                        x_next[U64(x)] = -1
                        if link_tail[U64(l)] >= 0:
                            x_next[U64(link_tail[U64(l)])] = x
                        else:
                            link_head[U64(l)] = x
                        link_tail[U64(l)] = x
                        if not link_pending[U64(l)]:
                            link_pending[U64(l)] = True
                            pending[U64(n_pending)] = l
                            n_pending += 1
                for e in range(ctrl_ptr[U64(op)], ctrl_ptr[U64(op + 1)]):
                    c = ctrl_dst[U64(e)]
                    missing[U64(c)] -= 1
                    wm -= c + 1
                    if missing[U64(c)] == 0:
                        dc = placement[U64(c)]
                        if not readyq_push(rq, rq_base[U64(dc)], rq_size[U64(dc)], (epoch << 32) | rank[U64(c)]):
                            rq_unsorted[U64(dc)] = True
                        rq_size[U64(dc)] += 1
                        if not running[U64(dc)] and not dev_pending[U64(dc)]:
                            dev_pending[U64(dc)] = True
                            dpend[U64(n_dpend)] = dc
                            n_dpend += 1
                out_refs[U64(op)] = refs
                wo += refs * np.int64(op + 1)
                if refs == 0:
                    live[U64(d)] -= out_bytes[U64(op)]
            elif kind_key < 2 * key_span:
                # -- a send task ended: the transfer joins its link's queue
                x = i
                s = x_src[U64(x)]
                running[U64(s)] = False
                if not dev_pending[U64(s)]:
                    dev_pending[U64(s)] = True
                    dpend[U64(n_dpend)] = s
                    n_dpend += 1
                l = s * D + x_dst[U64(x)]
                x_next[U64(x)] = -1
                if link_tail[U64(l)] >= 0:
                    x_next[U64(link_tail[U64(l)])] = x
                else:
                    link_head[U64(l)] = x
                link_tail[U64(l)] = x
                if not link_pending[U64(l)]:
                    link_pending[U64(l)] = True
                    pending[U64(n_pending)] = l
                    n_pending += 1
            else:
                x = i
                t = x_tensor[U64(x)]
                dd = x_dst[U64(x)]
                if kind_key < 3 * key_span:
                    # -- a link transfer ended: the link is free, the source copy may be
                    # freed, the tensor is on its destination unless a receive task runs first
                    s = x_src[U64(x)]
                    l = s * D + dd
                    link_busy[U64(l)] = False
                    if not link_pending[U64(l)]:
                        link_pending[U64(l)] = True
                        pending[U64(n_pending)] = l
                        n_pending += 1
                    prod = tensor_op[U64(t)]
                    out_refs[U64(prod)] -= 1
                    wo -= prod + 1
                    if out_refs[U64(prod)] == 0:
                        live[U64(s)] -= out_bytes[U64(prod)]
                    if has_tasks and xcost[2, U64(dd)] + tensor_bytes[U64(t)] * xcost[3, U64(dd)] != 0.0:
                        tq_size[U64(dd)] = taskq_push(tq_k1, tq_k2, tq_id, tq_base[U64(dd)], tq_size[U64(dd)],
                                                      (epoch << 32) | rank[U64(prod)], (t * D + dd) * 2 + 1,
                                                      x * 2 + 1)
                        if not running[U64(dd)] and not dev_pending[U64(dd)]:
                            dev_pending[U64(dd)] = True
                            dpend[U64(n_dpend)] = dd
                            n_dpend += 1
                        continue
                else:
                    # -- a receive task ended: dd is free, and the tensor is on it
                    running[U64(dd)] = False
                    if not dev_pending[U64(dd)]:
                        dev_pending[U64(dd)] = True
                        dpend[U64(n_dpend)] = dd
                        n_dpend += 1
                # -- the tensor is on dd: its consumers there have one input fewer to wait for
                for e in range(tensor_ptr[U64(t)], tensor_ptr[U64(t + 1)]):
                    c = tensor_cons[U64(e)]
                    # which consumers sit on dd depends on the placement alone, so a test
                    # of it mispredicts often: count it down without one (0 elsewhere)
                    other = placement[U64(c)] ^ dd
                    on_dd = np.int32(other == 0)
                    missing[U64(c)] -= on_dd
                    wm -= on_dd * (c + 1)
                    if (missing[U64(c)] | other) == 0:
                        if not readyq_push(rq, rq_base[U64(dd)], rq_size[U64(dd)], (epoch << 32) | rank[U64(c)]):
                            rq_unsorted[U64(dd)] = True
                        rq_size[U64(dd)] += 1
                        if not running[U64(dd)] and not dev_pending[U64(dd)]:  # a receive marked dd already
                            dev_pending[U64(dd)] = True
                            dpend[U64(n_dpend)] = dd
                            n_dpend += 1
    if ck is not None:
        if record and next_ck > 0 and matched < 0:
            for d in range(D):
                ck.seg[next_ck - 1, d] = seg[d]
    w.sc[0] = n_ev
    w.sc[1] = n_x
    w.sc[3] = epoch
    if INCR and record:
        w.sc[2] = next_ck
    w.sf[0] = makespan
    w.sf[1] = now
    return matched


# ---------------------------------------------------------- entry points
@njit(cache=True, error_model="numpy")
def simulate_full(net, w, placement, trace):
    """Simulate one placement from scratch; returns (makespan, n_transfers), or
    (inf, 0) if some op has no kernel on its device. Busy time and live peak are left
    in ``w``; with ``trace``, also op and link start and end, and in ``w.x_task`` the
    send and receive tasks that ran, over whatever it held before (fill it with NaN
    first)."""
    init_fresh(net, w, placement)
    for op in range(placement.shape[0]):
        if not np.isfinite(w.tp[op]):
            return np.inf, 0
    _run(net, w, None, None, placement, np.zeros(0, np.intp), -1, 0, False, 1, False, False, trace)
    return w.sf[0], w.sc[1]


@njit(cache=True)
def placement_violation(placement, op_group_first, T):
    """(first op not on its group's device, first op without a kernel on its device), -1 if none."""
    split = -1
    nok = -1
    for op in range(placement.shape[0]):
        if split < 0 and placement[op] != placement[U64(op_group_first[op])]:
            split = op
        if nok < 0 and not np.isfinite(T[op, U64(placement[op])]):
            nok = op
    return split, nok


@njit(cache=True)
def device_peak(livepeak, placement, param_bytes):
    """Peak memory per device: its parameters plus its peak live bytes."""
    peak = livepeak.copy()
    for op in range(placement.shape[0]):
        peak[U64(placement[op])] += param_bytes[op]
    return peak


@njit(cache=True, error_model="numpy", nogil=True)
def simulate_rows(net, w, placements, params, step, busy, peak, first, stride):
    """Simulate rows ``first``, ``first + stride``, ... of ``placements`` with the workspace
    ``w``; fills their step, busy and peak (``params``: parameter bytes per op). Threads
    share a batch between them by ``first`` (the GIL is released)."""
    B, n = placements.shape
    D = net.T.shape[1]
    # no trace, as a value LLVM cannot fold: with a literal False it inlines the whole
    # loop here and compiles it again
    trace = stride < 0
    for b in range(first, B, stride):
        ms, _ = simulate_full(net, w, placements[b], trace)
        step[b] = ms
        for d in range(D):
            busy[b, d] = w.busy[d]
            peak[b, d] = w.livepeak[d]
        for op in range(n):
            peak[b, placements[b, op]] += params[op]


@njit(cache=True, error_model="numpy", nogil=True)
def run_incremental(net, w, ck, base, placement, moved_ops, start_ck, n_ck, record, every, check):
    """Run on from the state in ``w`` (a fresh start or a restored checkpoint); see
    :func:`_run`. Returns the matched checkpoint or -1."""
    return _run(net, w, ck, base, placement, moved_ops, start_ck, n_ck, record, every, check, True, False)


# ------------------------------------------------------------ checkpoints
@njit(cache=True, inline="always")
def _saved_tasks(ck, j):
    """Offset in the task pool where checkpoint j's tasks go."""
    return 0 if j == 0 else ck.i[j - 1, 6] + ck.i[j - 1, 7]


@njit(cache=True)
def save(ck, j, w, placement, now, epoch, clean, n_ev, n_x, makespan, wm, wo):
    """Store the state at the top of the loop (every instant before the next event's handled)
    as checkpoint j; False (nothing stored) if its queued tasks do not fit the pool."""
    ck_alive = ck.alive
    ck_busy = ck.busy
    ck_ev_id = ck.ev_id
    ck_ev_k = ck.ev_k
    ck_ev_t = ck.ev_t
    ck_f = ck.f
    ck_i = ck.i
    ck_link = ck.link
    ck_live = ck.live
    ck_livepeak = ck.livepeak
    ck_op = ck.op
    ck_rq = ck.rq
    ck_rqready = ck.rqready
    ck_rqsize = ck.rqsize
    ck_running = ck.running
    ck_seg = ck.seg
    ck_tq_id = ck.tq_id
    ck_tq_k1 = ck.tq_k1
    ck_tq_k2 = ck.tq_k2
    ck_tq_ready = ck.tq_ready
    ck_tqsize = ck.tqsize
    ck_x = ck.x
    w_busy = w.busy
    w_epoch_time = w.epoch_time
    w_ev_id = w.ev_id
    w_ev_k = w.ev_k
    w_ev_t = w.ev_t
    w_link_busy = w.link_busy
    w_link_head = w.link_head
    w_link_tail = w.link_tail
    w_live = w.live
    w_livepeak = w.livepeak
    w_missing = w.missing
    w_out_refs = w.out_refs
    w_rq = w.rq
    w_rq_base = w.rq_base
    w_rq_size = w.rq_size
    w_running = w.running
    w_seg = w.seg
    w_tq_base = w.tq_base
    w_tq_id = w.tq_id
    w_tq_k1 = w.tq_k1
    w_tq_k2 = w.tq_k2
    w_tq_size = w.tq_size
    w_x_next = w.x_next
    w_x_refs = w.x_refs
    D = w_live.shape[0]
    off = _saved_tasks(ck, j)
    n_tasks = 0
    for d in range(D):
        n_tasks += w_tq_size[d]
    if off + n_tasks > ck_tq_k1.shape[0]:
        return False
    if j > 0:
        for d in range(D):
            ck_seg[j - 1, d] = w_seg[d]
    for d in range(D):
        w_seg[d] = 0
    ck_f[j, 0] = w_ev_t[n_ev - 1]  # the next event's time
    ck_f[j, 1] = makespan
    ck_f[j, 2] = now
    ck_i[j, 0] = n_x
    ck_i[j, 1] = n_ev
    ck_i[j, 2] = epoch
    ck_i[j, 3] = clean
    ck_i[j, 4] = wm
    ck_i[j, 5] = wo
    ck_i[j, 6] = off
    ck_i[j, 7] = n_tasks
    for d in range(D):
        ck_busy[j, d] = w_busy[d]
        ck_live[j, d] = w_live[d]
        ck_livepeak[j, d] = w_livepeak[d]
        ck_running[j, d] = w_running[d]
        ck_rqsize[j, d] = w_rq_size[d]
        ck_tqsize[j, d] = w_tq_size[d]
    for l in range(D * D):
        ck_link[j, 0, l] = w_link_head[l]
        ck_link[j, 1, l] = w_link_tail[l]
        ck_link[j, 2, l] = 1 if w_link_busy[l] else 0
    for e in range(n_ev):
        ck_ev_t[j, e] = w_ev_t[e]
        ck_ev_k[j, e] = w_ev_k[e]
        ck_ev_id[j, e] = w_ev_id[e]
    n = placement.shape[0]
    for op in range(n):
        ck_op[j, 0, op] = w_missing[op]
        ck_op[j, 1, op] = w_out_refs[op]
    k = 0
    for d in range(D):
        if w.rq_unsorted[d]:  # saved sorted, so a restore needs no flag
            readyq_sort(w_rq, w_rq_base[d], w_rq_size[d])
            w.rq_unsorted[d] = False
        for i in range(w_rq_size[d]):
            key = w_rq[w_rq_base[d] + i]
            ck_rq[j, k] = key
            ck_rqready[j, k] = w_epoch_time[key >> 32]
            k += 1
    k = off
    for d in range(D):
        for i in range(w_tq_size[d]):
            a = w_tq_base[d] + i
            ck_tq_k1[k] = w_tq_k1[a]
            ck_tq_k2[k] = w_tq_k2[a]
            ck_tq_id[k] = w_tq_id[a]
            ck_tq_ready[k] = w_epoch_time[w_tq_k1[a] >> 32]
            k += 1
    alive = 0
    for x in range(n_x):
        ck_x[j, 0, x] = w_x_refs[x]
        ck_x[j, 1, x] = w_x_next[x]
        if w_x_refs[x] > 0:
            alive += 1
    ck_alive[j] = alive
    return True


@njit(cache=True, nogil=True)
def restore(net, w, ck, base, j, placement):
    """Load checkpoint ``j`` under ``placement`` (the base run's transfers keep their ids).

    Valid when no op whose device changed has been touched before the checkpoint: it
    is in no ready queue, running, or an input's destination yet.
    """
    base_x_dst = base.x_dst
    base_x_src = base.x_src
    base_x_tensor = base.x_tensor
    ck_busy = ck.busy
    ck_ev_id = ck.ev_id
    ck_ev_k = ck.ev_k
    ck_ev_t = ck.ev_t
    ck_f = ck.f
    ck_i = ck.i
    ck_link = ck.link
    ck_live = ck.live
    ck_livepeak = ck.livepeak
    ck_op = ck.op
    ck_rq = ck.rq
    ck_rqready = ck.rqready
    ck_rqsize = ck.rqsize
    ck_running = ck.running
    ck_tq_id = ck.tq_id
    ck_tq_k1 = ck.tq_k1
    ck_tq_k2 = ck.tq_k2
    ck_tq_ready = ck.tq_ready
    ck_tqsize = ck.tqsize
    ck_x = ck.x
    w_busy = w.busy
    w_copy_of = w.copy_of
    w_epoch_time = w.epoch_time
    w_ev_id = w.ev_id
    w_ev_k = w.ev_k
    w_ev_t = w.ev_t
    w_link_busy = w.link_busy
    w_link_head = w.link_head
    w_link_tail = w.link_tail
    w_live = w.live
    w_livepeak = w.livepeak
    w_missing = w.missing
    w_out_refs = w.out_refs
    w_rq = w.rq
    w_rq_base = w.rq_base
    w_rq_size = w.rq_size
    w_running = w.running
    w_sc = w.sc
    w_seg = w.seg
    w_sent = w.sent
    w_sf = w.sf
    w_tq_base = w.tq_base
    w_tq_id = w.tq_id
    w_tq_k1 = w.tq_k1
    w_tq_k2 = w.tq_k2
    w_tq_size = w.tq_size
    w_x_dst = w.x_dst
    w_x_next = w.x_next
    w_x_refs = w.x_refs
    w_x_src = w.x_src
    w_x_tensor = w.x_tensor
    D = w_live.shape[0]
    set_bases(net, w, placement)
    n_x = ck_i[j, 0]
    n_ev = ck_i[j, 1]
    for d in range(D):
        w_busy[d] = ck_busy[j, d]
        w_live[d] = ck_live[j, d]
        w_livepeak[d] = ck_livepeak[j, d]
        w_seg[d] = 0
        w_running[d] = ck_running[j, d]
        w_rq_size[d] = ck_rqsize[j, d]
        w_tq_size[d] = ck_tqsize[j, d]
    for l in range(D * D):
        w_link_head[l] = ck_link[j, 0, l]
        w_link_tail[l] = ck_link[j, 1, l]
        w_link_busy[l] = ck_link[j, 2, l] != 0
    for e in range(n_ev):
        w_ev_t[e] = ck_ev_t[j, e]
        w_ev_k[e] = ck_ev_k[j, e]
        w_ev_id[e] = ck_ev_id[j, e]
    n = placement.shape[0]
    for op in range(n):
        w_missing[op] = ck_op[j, 0, op]
        w_out_refs[op] = ck_op[j, 1, op]
    # queues: the stored slices, sorted, re-based for this placement
    k = 0
    for d in range(D):
        for i in range(w_rq_size[d]):
            key = ck_rq[j, k]
            w_rq[w_rq_base[d] + i] = key
            w_epoch_time[key >> 32] = ck_rqready[j, k]
            k += 1
    k = ck_i[j, 6]
    for d in range(D):
        for i in range(w_tq_size[d]):
            a = w_tq_base[d] + i
            w_tq_k1[a] = ck_tq_k1[k]
            w_tq_k2[a] = ck_tq_k2[k]
            w_tq_id[a] = ck_tq_id[k]
            w_epoch_time[ck_tq_k1[k] >> 32] = ck_tq_ready[k]
            k += 1
    w_epoch_time[ck_i[j, 2]] = ck_f[j, 2]
    w.rq_unsorted[:] = False  # save sorted the slices it stored
    for x in range(n_x):
        t = base_x_tensor[x]
        w_x_tensor[x] = t
        w_x_src[x] = base_x_src[x]
        w_x_dst[x] = base_x_dst[x]
        w_x_refs[x] = ck_x[j, 0, x]
        w_x_next[x] = ck_x[j, 1, x]
        w_copy_of[t * D + base_x_dst[x]] = x
    w_sent[:] = -1
    w_sc[0] = n_ev
    w_sc[1] = n_x
    w_sc[3] = ck_i[j, 2]
    w_sf[0] = ck_f[j, 1]
    w_sf[1] = ck_f[j, 2]


@njit(cache=True)
def converged(net, ck, base, j, w, placement, moved_ops, n_ev, n_x, key_span, wm, wo):
    """Whether the running state equals base checkpoint ``j`` in everything that shapes
    the future (transfer ids aside, which only name things). Cheap tests first."""
    base_copy_of = base.copy_of
    base_x_src = base.x_src
    base_x_dst = base.x_dst
    base_x_tensor = base.x_tensor
    ck_alive = ck.alive
    ck_ev_id = ck.ev_id
    ck_ev_k = ck.ev_k
    ck_ev_t = ck.ev_t
    ck_i = ck.i
    ck_link = ck.link
    ck_live = ck.live
    ck_op = ck.op
    ck_rq = ck.rq
    ck_rqready = ck.rqready
    ck_rqsize = ck.rqsize
    ck_running = ck.running
    ck_tq_k2 = ck.tq_k2
    ck_tq_ready = ck.tq_ready
    ck_tqsize = ck.tqsize
    ck_x = ck.x
    w_epoch_time = w.epoch_time
    w_ev_id = w.ev_id
    w_ev_k = w.ev_k
    w_ev_t = w.ev_t
    w_link_busy = w.link_busy
    w_link_head = w.link_head
    w_live = w.live
    w_mark = w.mark
    w_missing = w.missing
    w_out_refs = w.out_refs
    w_rq = w.rq
    w_rq_base = w.rq_base
    w_rq_size = w.rq_size
    w_running = w.running
    w_tq_base = w.tq_base
    w_tq_k1 = w.tq_k1
    w_tq_k2 = w.tq_k2
    w_tq_size = w.tq_size
    w_x_dst = w.x_dst
    w_x_next = w.x_next
    w_x_refs = w.x_refs
    w_x_src = w.x_src
    w_x_tensor = w.x_tensor
    if n_ev != ck_i[j, 1] or wm != ck_i[j, 4] or wo != ck_i[j, 5]:
        return False
    for i in range(moved_ops.shape[0]):
        if w_out_refs[moved_ops[i]] != 0:
            return False
    D = w_live.shape[0]
    for d in range(D):
        if (w_live[d] != ck_live[j, d] or w_running[d] != ck_running[j, d] or w_rq_size[d] != ck_rqsize[j, d]
                or w_tq_size[d] != ck_tqsize[j, d]):
            return False
    L = D * D
    for l in range(L):
        if w_link_busy[l] != (ck_link[j, 2, l] != 0):
            return False
    # pending events, as a multiset: ops by (time, op), transfer stages by (time, kind,
    # tensor, src, dst)
    for e in range(n_ev):
        found = False
        for f in range(n_ev):
            if ck_ev_t[j, f] != w_ev_t[e]:
                continue
            if w_ev_k[e] < key_span:
                if ck_ev_k[j, f] < key_span and ck_ev_id[j, f] == w_ev_id[e]:
                    found = True
                    break
            elif ck_ev_k[j, f] // key_span == w_ev_k[e] // key_span:
                x = w_ev_id[e]
                y = ck_ev_id[j, f]
                if base_x_tensor[y] != w_x_tensor[x] or base_x_src[y] != w_x_src[x] or base_x_dst[y] != w_x_dst[x]:
                    continue
                found = True
                break
        if not found:
            return False
    # ready queues: same ops (by rank) with the same ready times on each device
    k = 0
    for d in range(D):
        for i in range(w_rq_size[d]):
            w_mark[ck_rq[j, k] & LOW] = k + 1
            k += 1
        ok = True
        for i in range(w_rq_size[d]):
            key = w_rq[w_rq_base[d] + i]
            m = w_mark[key & LOW]
            if m == 0 or w_epoch_time[key >> 32] != ck_rqready[j, m - 1]:
                ok = False
        k -= w_rq_size[d]
        for i in range(w_rq_size[d]):
            w_mark[ck_rq[j, k] & LOW] = 0
            k += 1
        if not ok:
            return False
    # task queues: same tasks (by tensor, destination, kind) with the same ready times
    k = ck_i[j, 6]
    for d in range(D):
        for i in range(w_tq_size[d]):
            a = w_tq_base[d] + i
            found = False
            for f in range(k, k + w_tq_size[d]):
                if ck_tq_k2[f] == w_tq_k2[a]:
                    found = ck_tq_ready[f] == w_epoch_time[w_tq_k1[a] >> 32]
                    break
            if not found:
                return False
        k += w_tq_size[d]
    # link queues, in order
    for l in range(L):
        x = w_link_head[l]
        y = ck_link[j, 0, l]
        while x >= 0 and y >= 0:
            if w_x_tensor[x] != base_x_tensor[y]:
                return False
            x = w_x_next[x]
            y = ck_x[j, 1, y]
        if x >= 0 or y >= 0:
            return False
    n = placement.shape[0]
    for op in range(n):
        if w_missing[op] != ck_op[j, 0, op] or w_out_refs[op] != ck_op[j, 1, op]:
            return False
    # copies still held (refs > 0) on both sides: same tensor, route and refs
    alive = 0
    for x in range(n_x):
        if w_x_refs[x] > 0:
            alive += 1
            y = base_copy_of[w_x_tensor[x] * D + w_x_dst[x]]
            if y < 0 or y >= ck_i[j, 0] or base_x_src[y] != w_x_src[x] or ck_x[j, 0, y] != w_x_refs[x]:
                return False
    return alive == ck_alive[j]


# ------------------------------------------------------------------ bounds
@njit(cache=True)
def critical_path(topo_order, w, succ_ptr, succ):
    """Longest path through the DAG with node weights ``w`` (edges cost nothing)."""
    n = topo_order.shape[0]
    finish = np.zeros(n, np.float64)
    start = np.zeros(n, np.float64)
    best = 0.0
    for k in range(n):
        v = topo_order[k]
        finish[v] = start[v] + w[v]
        if finish[v] > best:
            best = finish[v]
        for e in range(succ_ptr[v], succ_ptr[v + 1]):
            u = succ[e]
            if finish[v] > start[u]:
                start[u] = finish[v]
    return best
