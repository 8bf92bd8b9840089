"""The compiled kernels of the list schedulers (:mod:`placetool.search.listsched`).

- :func:`eft_schedule`: priority list scheduling to the device of earliest finish
  time, into idle gaps (HEFT, CPOP);
- :func:`etf_schedule`: earliest task first, each device's ready ops in two heaps
  (m-ETF, m-SCT);
- (their priorities are in :mod:`placetool.search.ranks`, a learnt rule's terms in
  :mod:`placetool.search.rule_kernels`);
- the pieces they share: data-ready times by the papers' model
  (:func:`_data_ready`) or the simulator's transfers on link timelines
  (:func:`_transfer_ready`, :func:`_link_timelines`, :func:`_link_book`,
  :func:`_send_ahead`), the devices an op may go to under memory
  (:func:`_candidates`, :func:`_may_go`) and the deadline check (:func:`_out_of_time`).

Every kernel is ``@njit(cache=True)`` and reads plain arrays, built from a problem by
:class:`placetool.search.listsched._Data`.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit, objmode

from placetool.costmodel.jitclock import work_clock
from placetool.search.heaps import heap_pop, heap_push
from placetool.search.rule_kernels import _rule_terms


# --------------------------------------------------------------------- heaps
@njit(cache=True)
def _hpop(k1, k2, ids, size):
    """Pop the minimum of the simulator's (key, tie) heap; returns (id, new size)."""
    top = ids[0]
    return top, heap_pop(k1, k2, ids, size)


@njit(cache=True)
def _out_of_time(step, deadline):
    """Whether the :func:`work_clock` has reached ``deadline``, read every 64th ``step``
    (about a microsecond a reading, and a step at a thousand devices costs far more)."""
    if deadline == np.inf or (step & 63) != 0:
        return False
    with objmode(now="float64"):
        now = work_clock()
    return now >= deadline


# ------------------------------------------------------------- shared pieces
@njit(cache=True)
def _comm(a, b, nbytes, ctrl, lat, bw):
    if a == b or ctrl:
        return 0.0
    return lat[a, b] + nbytes / bw[a, b]


@njit(cache=True)
def _data_ready(op, d, pred_ptr, pred_src, pred_bytes, pred_ctrl, place, finish, lat, bw):
    r = 0.0
    for k in range(pred_ptr[op], pred_ptr[op + 1]):
        p = pred_src[k]
        t = finish[p] + _comm(place[p], d, pred_bytes[k], pred_ctrl[k], lat, bw)
        if t > r:
            r = t
    return r


@njit(cache=True)
def _gap(ls, le, cnt, t0, dur):
    """Earliest start >= t0 of an interval of length ``dur`` in the idle gaps of a
    timeline of ``cnt`` sorted disjoint intervals; returns (start, insert position)."""
    lo, hi = 0, cnt
    while lo < hi:  # first interval ending after t0
        mid = (lo + hi) >> 1
        if le[mid] <= t0:
            lo = mid + 1
        else:
            hi = mid
    s = t0
    for i in range(lo, cnt):
        if s + dur <= ls[i]:
            return s, i
        if le[i] > s:
            s = le[i]
    return s, cnt


@njit(cache=True)
def _link_timelines(nt, n_inputs, D, queued):
    """Empty transfer bookkeeping: arrival time per (tensor, device), -1 until booked,
    and one timeline per directed link l (starts, ends) in a pool shared by all links:
    ``link[l]`` = (count, offset, room), and ``link[D * D, 1]`` the pool's first free
    slot (see :func:`_link_book`).

    All links together never hold more transfers than the graph has consumed tensors, and
    a timeline that fills moves to the pool's end with twice the room, so a pool of four
    times that many slots holds every timeline with its abandoned copies: the memory
    grows with the transfers booked, not with links x transfers."""
    arrive = np.full(max(nt * D, 1), -1.0)
    if not queued:
        return arrive, np.zeros(1), np.zeros(1), np.zeros((1, 3), np.int64)
    pool = 4 * n_inputs + 1
    return arrive, np.zeros(pool), np.zeros(pool), np.zeros((D * D + 1, 3), np.int64)


@njit(cache=True)
def _link_book(link_s, link_e, link, l, pos, s, e):
    """Insert the transfer (s, e) at position ``pos`` of link l's timeline, moving the
    timeline to the pool's end with twice the room when it is full."""
    cnt, off, room = link[l, 0], link[l, 1], link[l, 2]
    if cnt == room:
        top = link[link.shape[0] - 1, 1]
        room = max(2 * room, 1)
        for i in range(cnt):
            link_s[top + i] = link_s[off + i]
            link_e[top + i] = link_e[off + i]
        off = top
        link[l, 1], link[l, 2] = off, room
        link[link.shape[0] - 1, 1] = top + room
    for i in range(off + cnt, off + pos, -1):
        link_s[i] = link_s[i - 1]
        link_e[i] = link_e[i - 1]
    link_s[off + pos] = s
    link_e[off + pos] = e
    link[l, 0] = cnt + 1


@njit(cache=True)
def _transfer_ready(op, d, in_ptr, in_tensor, tensor_op, tensor_bytes, cpred_ptr, cpred_src, place, finish,
                    lat, bw, xc, arrive, link_s, link_e, link, avail, last_a, last_f, commit, insert, wait):
    """When op's inputs are on device d under the simulator's rules: a tensor goes to a
    device once, a transfer leaves when its producer ends and holds its directed link
    one at a time, a send first costs the sender ``xc[0] + xc[1] * bytes`` µs and a
    receive the receiver ``xc[2] + xc[3] * bytes``.

    Where a new transfer goes on its link: with ``insert``, the earliest idle gap of the
    link's timeline (for schedulers that insert ops into idle gaps too); without, after
    every transfer booked so far, as the simulator's first-queued-first-served links do
    (right for schedulers that book in time order: a transfer booked later would have
    been queued later). Without ``wait`` (a cluster whose links do not queue:
    ``links.queue = "none"``) a transfer starts as soon as it is sent, whatever else is on
    its link.
    Returns (data-ready time, receive time d spends first). With ``commit`` the
    transfers are booked (``arrive``, the link timelines, the sender's ``avail``).
    ``last_a`` and ``last_f`` (int64[D], float64[D]) are scratch space, allocated once
    by the caller: made here on every call, they cost 15-19% of an EFT or ETF schedule's
    time on gnmt8/k40x8 (``benchmarks/list_schedulers.py``)."""
    D = lat.shape[0]
    r = 0.0
    rc = 0.0
    # new transfers of this op on one link go one after another, in input order: the end
    # of the last one per source device (d is fixed here), for the few sources seen
    n_last = 0
    for k in range(cpred_ptr[op], cpred_ptr[op + 1]):
        f = finish[cpred_src[k]]
        if f > r:
            r = f
    for k in range(in_ptr[op], in_ptr[op + 1]):
        t = in_tensor[k]
        p = tensor_op[t]
        a = place[p]
        if a == d:
            f = finish[p]
        elif arrive[t * D + d] >= 0.0:
            f = arrive[t * D + d]
        else:
            b = tensor_bytes[t]
            l = a * D + d
            send = xc[0, a] + xc[1, a] * b
            dur = lat[a, d] + b / bw[a, d]
            t0 = finish[p] + send
            j = 0
            while j < n_last and last_a[j] != a:
                j += 1
            if j == n_last:
                last_a[j] = a
                last_f[j] = -1.0
                n_last += 1
            if wait and last_f[j] > t0:
                t0 = last_f[j]
            cnt, off = link[l, 0], link[l, 1]
            if not wait:
                pos = cnt
                s = t0
            elif insert:
                s, pos = _gap(link_s[off:off + cnt], link_e[off:off + cnt], cnt, t0, dur)
            else:
                pos = cnt
                s = max(t0, link_e[off + pos - 1]) if pos > 0 else t0
            last_f[j] = s + dur
            f = s + dur
            rc += xc[2, d] + xc[3, d] * b
            if commit:
                _link_book(link_s, link_e, link, l, pos, s, f)
                arrive[t * D + d] = f
                if send > 0.0 and avail[a] < finish[p] + send:
                    avail[a] = finish[p] + send
        if f > r:
            r = f
    return r, rc


@njit(cache=True)
def _candidates(op, g, T, gdev, gmem, used, cap, preferred, out):
    """Fill ``out[d]`` with True for the devices op may go to; returns 1 if memory forced
    a device over capacity (no device had room), else 0."""
    D = T.shape[1]
    for d in range(D):
        out[d] = False
    if gdev[g] >= 0:
        out[gdev[g]] = True
        return 0
    if preferred >= 0 and np.isfinite(T[op, preferred]) and used[preferred] + gmem[g] <= cap[preferred]:
        out[preferred] = True
        return 0
    anyok = False
    for d in range(D):
        if np.isfinite(T[op, d]) and used[d] + gmem[g] <= cap[d]:
            out[d] = True
            anyok = True
    if anyok:
        return 0
    best, bd = np.inf, -1
    for d in range(D):
        if np.isfinite(T[op, d]):
            over = used[d] + gmem[g] - cap[d]
            if over < best:
                best, bd = over, d
    out[bd] = True
    return 1


@njit(cache=True)
def _may_go(op, d, g, T, gdev, gmem, used, cap, preferred, cand):
    """Whether :func:`_candidates` would let op go to device d, in O(1) unless no device
    has room for its group (then ``cand`` is filled): m-ETF asks this of every queue
    head at every step, and filling all D candidates each time cost O(D^2) a step."""
    if gdev[g] >= 0:
        return d == gdev[g]
    if preferred >= 0 and np.isfinite(T[op, preferred]) and used[preferred] + gmem[g] <= cap[preferred]:
        return d == preferred
    if np.isfinite(T[op, d]) and used[d] + gmem[g] <= cap[d]:
        return True
    _candidates(op, g, T, gdev, gmem, used, cap, preferred, cand)
    return cand[d]


# -------------------------------------------------------- EFT (HEFT, CPOP)
@njit(cache=True)
def _used_indeg(gdev, gmem, pred_ptr, n, D):
    """A schedule's start: the memory each device holds of the groups fixed beforehand
    (``gdev`` >= 0) and each op's count of predecessors."""
    used = np.zeros(D)
    for g in range(len(gdev)):
        if gdev[g] >= 0:
            used[gdev[g]] += gmem[g]
    indeg = np.zeros(n, np.int64)
    for v in range(n):
        indeg[v] = pred_ptr[v + 1] - pred_ptr[v]
    return used, indeg


@njit(cache=True)
def eft_schedule(prio, rank, T, pred_ptr, pred_src, pred_bytes, pred_ctrl, succ_ptr, succ_dst,
                 group, gdev, gmem, cap, lat, bw, forced, insertion,
                 in_ptr, in_tensor, tensor_op, tensor_bytes, cpred_ptr, cpred_src, xc, queued, deadline,
                 rule, crit, gtime, mem_scale, inv_bw):
    """Priority list scheduling: the ready op of highest ``prio`` (ties: lower ``rank``)
    goes to the device of earliest finish (into an idle gap when ``insertion``).
    With ``queued`` transfers follow the simulator's rules (see :func:`_transfer_ready`);
    without, every edge costs latency + bytes / bandwidth and nothing queues.

    ``rule`` (float64[N_RULE], all 0: plain earliest finish) weighs the terms of
    :func:`_rule_terms` added to each device's finish time when choosing it: a learnt
    dispatching rule (:mod:`placetool.search.dispatch`); ``crit`` (per op), ``gtime``
    (group x device work), ``mem_scale`` (µs) and ``inv_bw`` (µs per byte) feed them.

    ``gdev`` (per group, -1 = free) is updated in place. Returns (place, start, finish,
    memory fallbacks). At ``deadline`` (a :func:`work_clock` reading) it stops, with ops
    left unplaced (-1).
    """
    n, D = T.shape
    place = np.full(n, -1, np.int64)
    start = np.zeros(n)
    finish = np.zeros(n)
    used, indeg = _used_indeg(gdev, gmem, pred_ptr, n, D)
    slot_s = np.zeros((D, n + 1))
    slot_e = np.zeros((D, n + 1))
    cnt = np.zeros(D, np.int64)
    avail = np.zeros(D)
    k1 = np.empty(n)
    k2 = np.empty(n, np.int64)
    ids = np.empty(n, np.int64)
    size = 0
    for v in range(n):
        if indeg[v] == 0:
            size = heap_push(k1, k2, ids, size, -prio[v], rank[v], v)
    cand = np.zeros(D, np.bool_)
    last_a, last_f = np.empty(D, np.int64), np.empty(D)
    arrive, link_s, link_e, link = _link_timelines(tensor_bytes.shape[0], in_tensor.shape[0], D, queued)
    learnt = np.any(rule != 0.0)
    committed = np.zeros(D)  # work of fixed groups' ops not scheduled yet
    extra = np.zeros(D)  # the rule's weighted terms per candidate; stays 0 for HEFT
    fallbacks = 0
    steps = 0
    while size > 0:
        steps += 1
        if _out_of_time(steps, deadline):
            break
        op, size = _hpop(k1, k2, ids, size)
        g = group[op]
        fallbacks += _candidates(op, g, T, gdev, gmem, used, cap, forced[op], cand)
        if learnt:
            _rule_terms(op, g, cand, T, gdev, gmem, used, cap, avail, committed, crit, gtime, mem_scale,
                        pred_ptr, pred_src, pred_bytes, pred_ctrl, place, inv_bw, rule, extra)
        bf, bs, bd, bi = np.inf, 0.0, np.int64(-1), np.int64(0)  # int64: see etf_schedule
        best = np.inf
        for d in range(D):
            if not cand[d]:
                continue
            if queued:
                ready, rc = _transfer_ready(op, d, in_ptr, in_tensor, tensor_op, tensor_bytes, cpred_ptr,
                                            cpred_src, place, finish, lat, bw, xc, arrive, link_s, link_e,
                                            link, avail, last_a, last_f, False, insertion, queued == 1)
            else:
                ready = _data_ready(op, d, pred_ptr, pred_src, pred_bytes, pred_ctrl, place, finish, lat, bw)
                rc = 0.0
            dur = T[op, d] + rc  # receives run on the device just before the op
            s = max(ready, avail[d])
            pos = cnt[d]
            if insertion:
                # first slot ending after `ready` (slots are sorted and disjoint)
                lo, hi = 0, cnt[d]
                while lo < hi:
                    mid = (lo + hi) >> 1
                    if slot_e[d, mid] <= ready:
                        lo = mid + 1
                    else:
                        hi = mid
                prev = slot_e[d, lo - 1] if lo > 0 else 0.0
                s = max(ready, prev)
                pos = cnt[d]
                for i in range(lo, cnt[d]):
                    if s + dur <= slot_s[d, i]:
                        pos = i
                        break
                    s = max(ready, slot_e[d, i])
            f = s + dur
            score = f + extra[d]
            if score < best:
                best, bf, bs, bd, bi = score, f, s, d, pos
        d = bd
        if queued:
            _transfer_ready(op, d, in_ptr, in_tensor, tensor_op, tensor_bytes, cpred_ptr, cpred_src, place,
                            finish, lat, bw, xc, arrive, link_s, link_e, link, avail, last_a, last_f, True, insertion,
                            queued == 1)
        place[op] = d
        start[op] = bs
        finish[op] = bf
        for i in range(cnt[d], bi, -1):
            slot_s[d, i] = slot_s[d, i - 1]
            slot_e[d, i] = slot_e[d, i - 1]
        slot_s[d, bi] = bs
        slot_e[d, bi] = bf
        cnt[d] += 1
        if bf > avail[d]:
            avail[d] = bf
        if gdev[g] < 0:
            gdev[g] = d
            used[d] += gmem[g]
            if learnt:
                committed[d] += gtime[g, d]
        if learnt:
            committed[d] -= T[op, d]
        for k in range(succ_ptr[op], succ_ptr[op + 1]):
            w = succ_dst[k]
            indeg[w] -= 1
            if indeg[w] == 0:
                size = heap_push(k1, k2, ids, size, -prio[w], rank[w], w)
    return place, start, finish, fallbacks


@njit(cache=True)
def _send_ahead(op, d, f, op_tensor_ptr, tensor_ptr, tensor_cons, group, fixed, tensor_bytes, lat, bw, xc,
                arrive, link_s, link_e, link, avail, wait):
    """Book op's outputs, ending at ``f``, to the devices fixed beforehand for their
    consumers' groups, when op ends, as the simulator sends them (first queued first
    served on links that queue, ``wait``; at once on links that do not): the scheduler
    need not wait for those consumers to be scheduled."""
    D = lat.shape[0]
    for t in range(op_tensor_ptr[op], op_tensor_ptr[op + 1]):
        for e in range(tensor_ptr[t], tensor_ptr[t + 1]):
            dc = fixed[group[tensor_cons[e]]]
            if dc < 0 or dc == d or arrive[t * D + dc] >= 0.0:
                continue
            b = tensor_bytes[t]
            l = d * D + dc
            send = xc[0, d] + xc[1, d] * b
            pos, off = link[l, 0], link[l, 1]
            s = max(f + send, link_e[off + pos - 1]) if wait and pos > 0 else f + send
            _link_book(link_s, link_e, link, l, pos, s, s + lat[d, dc] + b / bw[d, dc])
            arrive[t * D + dc] = s + lat[d, dc] + b / bw[d, dc]
            if send > 0.0 and avail[d] < f + send:
                avail[d] = f + send


# ------------------------------------------------------- ETF (m-ETF, m-SCT)
class ReadyQueues(NamedTuple):
    """m-ETF's two heaps per device (row d of each array is device d's): ``ready`` (``r*``)
    holds the ops whose inputs are on d by the time d is free, keyed by their data-ready
    time with ``fifo`` (else 0), ties by ``tie``; ``pending`` (``p*``) the ops still
    waiting for data, keyed by their data-ready time. Built by :func:`_queues`.

    :func:`etf_schedule`'s loop that cleans the queue heads, run for every device at
    every step, calls the heap functions directly: through :func:`_pop_ready` and its
    kin m-ETF ran about 8% slower (gnmt8/k40x8)."""

    rk: np.ndarray  # (D, n) keys
    rt: np.ndarray  # (D, n) ties
    rid: np.ndarray  # (D, n) ops
    rsize: np.ndarray  # (D,) entries per device
    pk: np.ndarray
    pt: np.ndarray
    pid: np.ndarray
    psize: np.ndarray


@njit(cache=True)
def _queues(D, n):
    """Empty :class:`ReadyQueues` for D devices and n ops."""
    return ReadyQueues(rk=np.empty((D, n)), rt=np.empty((D, n), np.int64), rid=np.empty((D, n), np.int64),
                       rsize=np.zeros(D, np.int64), pk=np.empty((D, n)), pt=np.empty((D, n), np.int64),
                       pid=np.empty((D, n), np.int64), psize=np.zeros(D, np.int64))


# One push and one pop for each of a device's two heaps: the pairs look alike because the
# heaps are alike; what differs is which arrays, and naming the heap at the call site is
# the point (the loop that cleans the queue heads calls heap_push/_hpop directly: through
# these helpers it ran about 8% slower on gnmt8/k40x8)
@njit(cache=True)
def _push_ready(q, d, key, tie, op):
    q.rsize[d] = heap_push(q.rk[d], q.rt[d], q.rid[d], q.rsize[d], key, tie, op)


@njit(cache=True)
def _pop_ready(q, d):
    _, q.rsize[d] = _hpop(q.rk[d], q.rt[d], q.rid[d], q.rsize[d])


@njit(cache=True)
def _push_pending(q, d, key, tie, op):
    q.psize[d] = heap_push(q.pk[d], q.pt[d], q.pid[d], q.psize[d], key, tie, op)


@njit(cache=True)
def _pop_pending(q, d):
    _, q.psize[d] = _hpop(q.pk[d], q.pt[d], q.pid[d], q.psize[d])


@njit(cache=True)
def _etf_enqueue(op, d, tie, dr, avail, q, fifo):
    """Queue a ready op on device d: in d's ready queue (keyed by tie) if its data is
    there by the time d is free, else in d's pending queue (keyed by data-ready time)."""
    if dr[op, d] <= avail[d]:
        _push_ready(q, d, dr[op, d] if fifo else 0.0, tie[op], op)
    else:
        _push_pending(q, d, dr[op, d], tie[op], op)


@njit(cache=True)
def _etf_queue_all(op, tie, T, gdev, gmem, used, cap, pref, dr, avail, group, cand, inq, q, fifo):
    """Queue op on every candidate device; returns 1 if memory forced an over-capacity one."""
    fb = _candidates(op, group[op], T, gdev, gmem, used, cap, pref, cand)
    for d in range(T.shape[1]):
        if cand[d]:
            inq[op] += 1
            _etf_enqueue(op, d, tie, dr, avail, q, fifo)
    return fb


@njit(cache=True)
def _etf_pick(q, avail):
    """The (start, tie, device, op) of the earliest-starting queue head over all devices
    (ties: lower tie, then lower device); device and op are -1 when every queue is empty.

    m-ETF picks only once every device's heads are clean: a re-queue may push onto a
    device already looked at, and the pair picked must still be its queue's head when it
    is taken off (entries just queued are clean: their candidates were just read and
    their data-ready time decided their heap)."""
    # int64, not a literal -1: numba would compile spare copies of the helpers called with them
    bs, bt, bd, bop = np.inf, np.int64(1) << 62, np.int64(-1), np.int64(-1)
    for d in range(avail.shape[0]):
        if q.rsize[d] > 0:
            s, t, op = avail[d], q.rt[d, 0], q.rid[d, 0]
        elif q.psize[d] > 0:
            s, t, op = q.pk[d, 0], q.pt[d, 0], q.pid[d, 0]
        else:
            continue
        if s < bs or (s == bs and t < bt):
            bs, bt, bd, bop = s, t, d, op
    return bs, bt, bd, bop


@njit(cache=True)
def _etf_drop(op, d, drop, tie, T, gdev, gmem, used, cap, pref, dr, avail, group, cand, inq, q, fifo, fb_of):
    """Take op, which may no longer go to device d, off d's ready heap (``drop`` 0) or
    pending heap (1); once no device's queue holds it, queue it again on its current
    candidates."""
    if drop == 0:
        _pop_ready(q, d)
    else:
        _pop_pending(q, d)
    inq[op] -= 1
    if inq[op] == 0:
        fb_of[op] = _etf_queue_all(op, tie, T, gdev, gmem, used, cap, pref[op], dr, avail,
                                   group, cand, inq, q, fifo)


@njit(cache=True)
def _etf_transfers(op, d, bs, q, dr, tie, fifo, in_ptr, in_tensor, tensor_op, tensor_bytes, cpred_ptr, cpred_src,
                   place, finish, lat, bw, xc, arrive, link_s, link_e, link, avail, last_a, last_f, queued):
    """Book the transfers of the pair picked, op on device d at ``bs``, on the links as
    they are now. If the links filled up meanwhile so that it would start later, op goes
    back to d's queue at its new data-ready time, nothing booked. Returns (late, start,
    receive time d spends first)."""
    r, rc = _transfer_ready(op, d, in_ptr, in_tensor, tensor_op, tensor_bytes, cpred_ptr, cpred_src,
                            place, finish, lat, bw, xc, arrive, link_s, link_e, link, avail, last_a, last_f,
                            False, False, queued == 1)
    if max(r, avail[d]) > bs:  # its links filled up meanwhile: queue it at its new time
        if q.rsize[d] > 0:
            _pop_ready(q, d)
        else:
            _pop_pending(q, d)
        dr[op, d] = r
        _etf_enqueue(op, d, tie, dr, avail, q, fifo)
        return True, bs, rc
    r, rc = _transfer_ready(op, d, in_ptr, in_tensor, tensor_op, tensor_bytes, cpred_ptr, cpred_src,
                            place, finish, lat, bw, xc, arrive, link_s, link_e, link, avail, last_a, last_f,
                            True, False, queued == 1)
    # a send booked just now may hold the device
    return False, max(bs, r, avail[d]), rc


@njit(cache=True)
def _etf_data_ready(w, dr, queued, pred_ptr, pred_src, pred_bytes, pred_ctrl, in_ptr, in_tensor, tensor_op,
                    tensor_bytes, cpred_ptr, cpred_src, place, finish, lat, bw, xc, arrive, link_s, link_e, link,
                    avail, last_a, last_f):
    """Fill ``dr[w]``, the time op w's inputs are on each device, as w becomes ready: by
    the simulator's transfers on the links as booked now (``queued``, nothing booked),
    else by the papers' latency + bytes / bandwidth."""
    for e in range(dr.shape[1]):
        if queued:
            dr[w, e], _ = _transfer_ready(w, e, in_ptr, in_tensor, tensor_op, tensor_bytes, cpred_ptr,
                                          cpred_src, place, finish, lat, bw, xc, arrive, link_s,
                                          link_e, link, avail, last_a, last_f, False, False, queued == 1)
        else:
            dr[w, e] = _data_ready(w, e, pred_ptr, pred_src, pred_bytes, pred_ctrl, place, finish, lat, bw)


@njit(cache=True)
def etf_schedule(tie, T, pred_ptr, pred_src, pred_bytes, pred_ctrl, succ_ptr, succ_dst,
                 group, gdev, gmem, cap, lat, bw, fav_parent,
                 in_ptr, in_tensor, tensor_op, tensor_bytes, cpred_ptr, cpred_src, xc, queued,
                 op_tensor_ptr, tensor_ptr, tensor_cons, deadline):
    """Earliest task first: start the (ready op, device) pair with the earliest start
    (ties: lower ``tie``, the op's position in priority order); no insertion. An op whose
    favourite parent (``fav_parent`` >= 0) is placed prefers that parent's device.

    Per device two heaps (:class:`ReadyQueues`): ops whose inputs are there by the time
    the device is free (all start when it frees: the best ``tie`` wins) and ops still
    waiting for data (keyed by data-ready time). Devices' free times only grow, so ops
    only move from the second to the first; entries of ops placed elsewhere, or no
    longer allowed on the device (its memory filled, their group got fixed), are dropped
    when they surface, and an op with no queue left is queued again
    on its current candidates. O(ops x devices x log ops).

    With ``queued`` (see :func:`_transfer_ready`) an op's data-ready time can only grow
    while it waits, as transfers planned meanwhile fill the links it needs: the chosen
    pair is checked against the links as they are now and, if it would start later than
    planned, queued again with its new time (keys only grow, so this ends).

    Groups fixed beforehand (``gdev`` >= 0 on entry) send their inputs ahead: a
    tensor goes to such a group's device when its producer ends, not when the consumer
    is scheduled, as in the simulator.

    Returns (place, start, finish, memory fallbacks). At ``deadline`` (a
    :func:`work_clock` reading) it stops, with ops left unplaced (-1).
    """
    n, D = T.shape
    fixed = gdev.copy()
    # queued: a device runs its ready ops as the simulator does, earliest ready first
    # (ties: ``tie``, then the topological rank)
    fifo = queued != 0
    place = np.full(n, -1, np.int64)
    start = np.zeros(n)
    finish = np.zeros(n)
    used, indeg = _used_indeg(gdev, gmem, pred_ptr, n, D)
    avail = np.zeros(D)
    q = _queues(D, n)
    inq = np.zeros(n, np.int64)  # how many device queues hold the op
    pref = np.full(n, -1, np.int64)
    dr = np.zeros((n, D))  # data-ready time per device, fixed once an op is ready
    cand = np.zeros(D, np.bool_)
    last_a, last_f = np.empty(D, np.int64), np.empty(D)  # _transfer_ready's scratch
    fb_of = np.zeros(n, np.int64)
    arrive, link_s, link_e, link = _link_timelines(tensor_bytes.shape[0], in_tensor.shape[0], D, queued)
    for v in range(n):
        if indeg[v] == 0:
            fb_of[v] = _etf_queue_all(v, tie, T, gdev, gmem, used, cap, pref[v], dr, avail, group, cand, inq,
                                      q, fifo)
    fallbacks = 0
    placed = 0
    steps = 0
    while placed < n:
        steps += 1
        if _out_of_time(steps, deadline):
            break
        for d in range(D):
            while True:
                drop = -1  # 0: the ready heap's head, 1: the pending heap's
                if q.rsize[d] > 0:
                    op = q.rid[d, 0]
                    if place[op] >= 0:
                        _, q.rsize[d] = _hpop(q.rk[d], q.rt[d], q.rid[d], q.rsize[d])
                        continue
                    if not _may_go(op, d, group[op], T, gdev, gmem, used, cap, pref[op], cand):
                        drop = 0
                if drop < 0 and q.psize[d] > 0:
                    op = q.pid[d, 0]
                    if place[op] >= 0:
                        _, q.psize[d] = _hpop(q.pk[d], q.pt[d], q.pid[d], q.psize[d])
                        continue
                    if q.pk[d, 0] <= avail[d]:
                        _, q.psize[d] = _hpop(q.pk[d], q.pt[d], q.pid[d], q.psize[d])
                        q.rsize[d] = heap_push(q.rk[d], q.rt[d], q.rid[d], q.rsize[d],
                                               dr[op, d] if fifo else 0.0, tie[op], op)
                        continue
                    if not _may_go(op, d, group[op], T, gdev, gmem, used, cap, pref[op], cand):
                        drop = 1
                if drop < 0:
                    break
                _etf_drop(op, d, drop, tie, T, gdev, gmem, used, cap, pref, dr, avail, group, cand, inq, q, fifo,
                          fb_of)
        bs, bt, bd, bop = _etf_pick(q, avail)  # once every device's heads are clean
        if bop < 0:  # all queues empty would mean a lost op: stop
            if q.rsize.sum() + q.psize.sum() == 0:
                break
            continue
        op, d = bop, bd
        rc = 0.0
        if queued:
            late, bs, rc = _etf_transfers(op, d, bs, q, dr, tie, fifo, in_ptr, in_tensor, tensor_op, tensor_bytes,
                                          cpred_ptr, cpred_src, place, finish, lat, bw, xc, arrive, link_s, link_e,
                                          link, avail, last_a, last_f, queued)
            if late:
                continue
        placed += 1
        fallbacks += fb_of[op]
        g = group[op]
        place[op] = d
        start[op] = bs
        finish[op] = bs + rc + T[op, d]
        avail[d] = finish[op]
        if gdev[g] < 0:
            gdev[g] = d
            used[d] += gmem[g]
        if queued:
            _send_ahead(op, d, finish[op], op_tensor_ptr, tensor_ptr, tensor_cons, group, fixed, tensor_bytes, lat,
                        bw, xc, arrive, link_s, link_e, link, avail, queued == 1)
        for k in range(succ_ptr[op], succ_ptr[op + 1]):
            w = succ_dst[k]
            indeg[w] -= 1
            if indeg[w] == 0:
                _etf_data_ready(w, dr, queued, pred_ptr, pred_src, pred_bytes, pred_ctrl, in_ptr, in_tensor,
                                tensor_op, tensor_bytes, cpred_ptr, cpred_src, place, finish, lat, bw, xc, arrive,
                                link_s, link_e, link, avail, last_a, last_f)
                if fav_parent[w] >= 0:
                    pref[w] = place[fav_parent[w]]
                fb_of[w] = _etf_queue_all(w, tie, T, gdev, gmem, used, cap, pref[w], dr, avail, group, cand,
                                          inq, q, fifo)
    return place, start, finish, fallbacks
