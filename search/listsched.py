"""List schedulers: ``heft``, ``critical-path`` (CPOP), ``m-topo``, ``m-etf``, ``m-sct``.

They schedule *ops* (the group graph of a TF graph has cycles: a variable's group holds
its read and its update) under one rule: when the first op of a group is placed, the
whole group is fixed to that device and charged its memory (parameters plus its ops'
outputs, see :func:`placetool.search.problem.group_memory_bytes`); later ops of the group
follow it. A device whose charged memory would exceed its capacity is not a candidate;
if no device has room the op goes where the overflow is least (counted in the metadata
as ``memory_fallbacks``). Every method scores its placement through the tracker.

All five are memory-constrained by the simulator's account, which the estimate cannot
see (outputs are freed once consumed, received copies are held): a schedule whose
simulated peak exceeds a device's capacity is run again with the capacities the
estimate is held to retargeted from the simulated peaks (up to ``MEMORY_ROUNDS``
times), the fastest rounds still over are repaired with
:func:`placetool.search.memory.fit_memory`, and where none fits m-TOPO's placement is
returned, so a result fits whenever m-TOPO's does (given the budget to get there).
``metadata["memory"]`` is ``"constrained"``; ``memory_fit`` says how the result fits
(``schedule``, ``fit_memory``, ``m-topo (...)`` or ``none``), ``memory_rounds`` how many
schedules were run.

- ``heft`` (Topcuoglu et al. 2002): ops by upward rank (mean compute + mean
  communication to the exit), each to the device of earliest finish time, inserting
  into idle gaps; communication = link latency + bytes / bandwidth.
- ``critical-path`` (CPOP, same paper): priority upward + downward rank; the ops on the
  critical path all go to the one device that runs them fastest, the rest by EFT.
- ``m-topo`` (Baechi): ops in topological order fill one GPU after another, moving on
  when a GPU holds its share of the compute or its memory is full.
- ``m-etf`` (Baechi): earliest task first: repeatedly start the (ready op, device) pair
  that can start earliest.
- ``m-sct`` (Baechi): ETF where each op's "favourite child" (from the small-communication
  -time LP relaxation of Hanen & Munier, solved with SciPy/HiGHS) goes to its parent's
  device.

The schedules here follow the simulator's rules for transfers (``links="queued"``, the
default: a tensor goes to a device once, transfers queue on their directed link,
devices pay their send/receive costs, and in m-ETF/m-SCT a device runs its ready ops in
the simulator's order; HEFT and CPOP, which insert ops into idle gaps, insert transfers
into the idle gaps of their link, while m-ETF and m-SCT, which book in time order,
queue them first come first served as the simulator does), so the makespan a scheduler plans
(``metadata["planned_us"]``) is closer to what the simulator says of its placement
(``metadata["simulated_us"]``, the step time reported) than the papers' model's.
``links="ideal"`` (``--option links=ideal``) gives the papers' variants: every edge
costs latency + bytes / bandwidth and nothing queues. Each scheduler runs twice where
the cluster has a host besides its GPUs (all devices, and GPUs only for every group
that may use one) and the
tracker keeps the faster; ``metadata["devices"]`` says which won.
"""

from __future__ import annotations

import numpy as np
from numba import njit, objmode

from placetool.costmodel.jitclock import work_clock
from placetool.search.heaps import heap_pop, heap_push

from .errors import SearchError
from .problem import accelerators, fallback_device, gpu_group_time, group_memory_bytes
from .registry import Positive, register
from .tracker import BudgetExhausted, score


#: how list schedulers model transfers: ``queued`` as the simulator does (a tensor sent
#: once per device, one FIFO per directed link, the devices' send/receive costs);
#: ``ideal`` as the papers do (every edge costs latency + bytes / bandwidth, nothing queues)
LINKS = ("queued", "ideal")


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
                    lat, bw, xc, arrive, link_s, link_e, link, avail, commit, insert, wait):
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
    transfers are booked (``arrive``, the link timelines, the sender's ``avail``)."""
    D = lat.shape[0]
    r = 0.0
    rc = 0.0
    # new transfers of this op on one link go one after another, in input order: the end
    # of the last one per source device (d is fixed here), for the few sources seen
    last_a = np.empty(0, np.int64)
    last_f = np.empty(0)
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
            if last_a.shape[0] == 0:
                last_a = np.empty(in_ptr[op + 1] - in_ptr[op], np.int64)
                last_f = np.empty(in_ptr[op + 1] - in_ptr[op])
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


@njit(cache=True)
def upward_rank(order, wbar, succ_ptr, succ_dst, succ_bytes, succ_ctrl, mean_lat, mean_inv_bw):
    """rank_u(i) = wbar(i) + max over successors j of (cbar(i, j) + rank_u(j))."""
    n = len(order)
    r = np.zeros(n)
    for ii in range(n - 1, -1, -1):
        v = order[ii]
        m = 0.0
        for k in range(succ_ptr[v], succ_ptr[v + 1]):
            c = 0.0 if succ_ctrl[k] else mean_lat + succ_bytes[k] * mean_inv_bw
            t = c + r[succ_dst[k]]
            if t > m:
                m = t
        r[v] = wbar[v] + m
    return r


@njit(cache=True)
def downward_rank(order, wbar, pred_ptr, pred_src, pred_bytes, pred_ctrl, mean_lat, mean_inv_bw):
    """rank_d(j) = max over predecessors i of (rank_d(i) + wbar(i) + cbar(i, j))."""
    n = len(order)
    r = np.zeros(n)
    for ii in range(n):
        v = order[ii]
        m = 0.0
        for k in range(pred_ptr[v], pred_ptr[v + 1]):
            p = pred_src[k]
            c = 0.0 if pred_ctrl[k] else mean_lat + pred_bytes[k] * mean_inv_bw
            t = r[p] + wbar[p] + c
            if t > m:
                m = t
        r[v] = m
    return r


# -------------------------------------------------------- EFT (HEFT, CPOP)
@njit(cache=True)
def eft_schedule(prio, rank, T, pred_ptr, pred_src, pred_bytes, pred_ctrl, succ_ptr, succ_dst,
                 group, gdev, gmem, cap, lat, bw, forced, insertion,
                 in_ptr, in_tensor, tensor_op, tensor_bytes, cpred_ptr, cpred_src, xc, queued, deadline):
    """Priority list scheduling: the ready op of highest ``prio`` (ties: lower ``rank``)
    goes to the device of earliest finish (into an idle gap when ``insertion``).
    With ``queued`` transfers follow the simulator's rules (see :func:`_transfer_ready`);
    without, every edge costs latency + bytes / bandwidth and nothing queues.

    ``gdev`` (per group, -1 = free) is updated in place. Returns (place, start, finish,
    memory fallbacks). At ``deadline`` (a :func:`work_clock` reading) it stops, with ops
    left unplaced (-1).
    """
    n, D = T.shape
    place = np.full(n, -1, np.int64)
    start = np.zeros(n)
    finish = np.zeros(n)
    used = np.zeros(D)
    for g in range(len(gdev)):
        if gdev[g] >= 0:
            used[gdev[g]] += gmem[g]
    slot_s = np.zeros((D, n + 1))
    slot_e = np.zeros((D, n + 1))
    cnt = np.zeros(D, np.int64)
    avail = np.zeros(D)
    indeg = np.zeros(n, np.int64)
    for v in range(n):
        indeg[v] = pred_ptr[v + 1] - pred_ptr[v]
    k1 = np.empty(n)
    k2 = np.empty(n, np.int64)
    ids = np.empty(n, np.int64)
    size = 0
    for v in range(n):
        if indeg[v] == 0:
            size = heap_push(k1, k2, ids, size, -prio[v], rank[v], v)
    cand = np.zeros(D, np.bool_)
    arrive, link_s, link_e, link = _link_timelines(tensor_bytes.shape[0], in_tensor.shape[0], D, queued)
    fallbacks = 0
    steps = 0
    while size > 0:
        steps += 1
        if _out_of_time(steps, deadline):
            break
        op, size = _hpop(k1, k2, ids, size)
        g = group[op]
        fallbacks += _candidates(op, g, T, gdev, gmem, used, cap, forced[op], cand)
        bf, bs, bd, bi = np.inf, 0.0, np.int64(-1), np.int64(0)  # int64: see etf_schedule
        for d in range(D):
            if not cand[d]:
                continue
            if queued:
                ready, rc = _transfer_ready(op, d, in_ptr, in_tensor, tensor_op, tensor_bytes, cpred_ptr,
                                            cpred_src, place, finish, lat, bw, xc, arrive, link_s, link_e,
                                            link, avail, False, insertion, queued == 1)
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
            if f < bf:
                bf, bs, bd, bi = f, s, d, pos
        d = bd
        if queued:
            _transfer_ready(op, d, in_ptr, in_tensor, tensor_op, tensor_bytes, cpred_ptr, cpred_src, place,
                            finish, lat, bw, xc, arrive, link_s, link_e, link, avail, True, insertion, queued == 1)
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
@njit(cache=True)
def _etf_enqueue(op, d, tie, dr, avail, pk, pt, pid, psize, rk, rt, rid, rsize, fifo):
    """Queue a ready op on device d: in d's ready queue (keyed by tie) if its data is
    there by the time d is free, else in d's pending queue (keyed by data-ready time)."""
    if dr[op, d] <= avail[d]:
        rsize[d] = heap_push(rk[d], rt[d], rid[d], rsize[d], dr[op, d] if fifo else 0.0, tie[op], op)
    else:
        psize[d] = heap_push(pk[d], pt[d], pid[d], psize[d], dr[op, d], tie[op], op)


@njit(cache=True)
def _etf_queue_all(op, tie, T, gdev, gmem, used, cap, pref, dr, avail, group, cand, inq,
                   pk, pt, pid, psize, rk, rt, rid, rsize, fifo):
    """Queue op on every candidate device; returns 1 if memory forced an over-capacity one."""
    fb = _candidates(op, group[op], T, gdev, gmem, used, cap, pref, cand)
    for d in range(T.shape[1]):
        if cand[d]:
            inq[op] += 1
            _etf_enqueue(op, d, tie, dr, avail, pk, pt, pid, psize, rk, rt, rid, rsize, fifo)
    return fb


@njit(cache=True)
def etf_schedule(tie, T, pred_ptr, pred_src, pred_bytes, pred_ctrl, succ_ptr, succ_dst,
                 group, gdev, gmem, cap, lat, bw, fav_parent,
                 in_ptr, in_tensor, tensor_op, tensor_bytes, cpred_ptr, cpred_src, xc, queued,
                 op_tensor_ptr, tensor_ptr, tensor_cons, deadline):
    """Earliest task first: start the (ready op, device) pair with the earliest start
    (ties: lower ``tie``, the op's position in priority order); no insertion. An op whose
    favourite parent (``fav_parent`` >= 0) is placed prefers that parent's device.

    Per device two heaps: ops whose inputs are there by the time the device is free (all
    start when it frees: the best ``tie`` wins) and ops still waiting for data (keyed by
    data-ready time). Devices' free times only grow, so ops only move from the second to
    the first; entries of ops placed elsewhere, or no longer allowed on the device (its
    memory filled, their group got fixed), are dropped when they surface, and an op with
    no queue left is queued again on its current candidates. O(ops x devices x log ops).

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
    used = np.zeros(D)
    for g in range(len(gdev)):
        if gdev[g] >= 0:
            used[gdev[g]] += gmem[g]
    avail = np.zeros(D)
    indeg = np.zeros(n, np.int64)
    for v in range(n):
        indeg[v] = pred_ptr[v + 1] - pred_ptr[v]
    pk = np.empty((D, n))
    pt = np.empty((D, n), np.int64)
    pid = np.empty((D, n), np.int64)
    psize = np.zeros(D, np.int64)
    rk = np.empty((D, n))
    rt = np.empty((D, n), np.int64)
    rid = np.empty((D, n), np.int64)
    rsize = np.zeros(D, np.int64)
    inq = np.zeros(n, np.int64)  # how many device queues hold the op
    pref = np.full(n, -1, np.int64)
    dr = np.zeros((n, D))  # data-ready time per device, fixed once an op is ready
    cand = np.zeros(D, np.bool_)
    fb_of = np.zeros(n, np.int64)
    arrive, link_s, link_e, link = _link_timelines(tensor_bytes.shape[0], in_tensor.shape[0], D, queued)
    for v in range(n):
        if indeg[v] == 0:
            fb_of[v] = _etf_queue_all(v, tie, T, gdev, gmem, used, cap, pref[v], dr, avail, group, cand, inq,
                                      pk, pt, pid, psize, rk, rt, rid, rsize, fifo)
    fallbacks = 0
    placed = 0
    steps = 0
    while placed < n:
        steps += 1
        if _out_of_time(steps, deadline):
            break
        # int64, not a literal -1: numba would compile spare copies of the helpers called with them
        bs, bt, bd, bop = np.inf, np.int64(1) << 62, np.int64(-1), np.int64(-1)
        for d in range(D):
            # drop stale heads, move ops whose data has arrived to the ready heap, and
            # take off d an op that may no longer go there (re-queued where it may)
            while True:
                drop = -1  # 0: the ready heap's head, 1: the pending heap's
                if rsize[d] > 0:
                    op = rid[d, 0]
                    if place[op] >= 0:
                        _, rsize[d] = _hpop(rk[d], rt[d], rid[d], rsize[d])
                        continue
                    if not _may_go(op, d, group[op], T, gdev, gmem, used, cap, pref[op], cand):
                        drop = 0
                if drop < 0 and psize[d] > 0:
                    op = pid[d, 0]
                    if place[op] >= 0:
                        _, psize[d] = _hpop(pk[d], pt[d], pid[d], psize[d])
                        continue
                    if pk[d, 0] <= avail[d]:
                        _, psize[d] = _hpop(pk[d], pt[d], pid[d], psize[d])
                        rsize[d] = heap_push(rk[d], rt[d], rid[d], rsize[d], dr[op, d] if fifo else 0.0, tie[op], op)
                        continue
                    if not _may_go(op, d, group[op], T, gdev, gmem, used, cap, pref[op], cand):
                        drop = 1
                if drop < 0:
                    break
                if drop == 0:
                    _, rsize[d] = _hpop(rk[d], rt[d], rid[d], rsize[d])
                else:
                    _, psize[d] = _hpop(pk[d], pt[d], pid[d], psize[d])
                inq[op] -= 1
                if inq[op] == 0:
                    fb_of[op] = _etf_queue_all(op, tie, T, gdev, gmem, used, cap, pref[op], dr, avail,
                                               group, cand, inq, pk, pt, pid, psize, rk, rt, rid, rsize, fifo)
        # pick only once every device's heads are clean: a re-queue above may push onto a
        # device already looked at, and the pair picked must still be its queue's head
        # when it is taken off below (entries just queued are clean: their candidates
        # were just read and their data-ready time decided their heap)
        for d in range(D):
            if rsize[d] > 0:
                s, t, op = avail[d], rt[d, 0], rid[d, 0]
            elif psize[d] > 0:
                s, t, op = pk[d, 0], pt[d, 0], pid[d, 0]
            else:
                continue
            if s < bs or (s == bs and t < bt):
                bs, bt, bd, bop = s, t, d, op
        if bop < 0:  # all queues empty would mean a lost op: stop
            if rsize.sum() + psize.sum() == 0:
                break
            continue
        op, d = bop, bd
        rc = 0.0
        if queued:
            r, rc = _transfer_ready(op, d, in_ptr, in_tensor, tensor_op, tensor_bytes, cpred_ptr, cpred_src,
                                    place, finish, lat, bw, xc, arrive, link_s, link_e, link, avail,
                                    False, False, queued == 1)
            if max(r, avail[d]) > bs:  # its links filled up meanwhile: queue it at its new time
                if rsize[d] > 0:
                    _, rsize[d] = _hpop(rk[d], rt[d], rid[d], rsize[d])
                else:
                    _, psize[d] = _hpop(pk[d], pt[d], pid[d], psize[d])
                dr[op, d] = r
                _etf_enqueue(op, d, tie, dr, avail, pk, pt, pid, psize, rk, rt, rid, rsize, fifo)
                continue
            r, rc = _transfer_ready(op, d, in_ptr, in_tensor, tensor_op, tensor_bytes, cpred_ptr, cpred_src,
                                    place, finish, lat, bw, xc, arrive, link_s, link_e, link, avail,
                                    True, False, queued == 1)
            # a send booked just now may hold the device
            bs = max(bs, r, avail[d])
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
                for e in range(D):
                    if queued:
                        dr[w, e], _ = _transfer_ready(w, e, in_ptr, in_tensor, tensor_op, tensor_bytes, cpred_ptr,
                                                      cpred_src, place, finish, lat, bw, xc, arrive, link_s,
                                                      link_e, link, avail, False, False, queued == 1)
                    else:
                        dr[w, e] = _data_ready(w, e, pred_ptr, pred_src, pred_bytes, pred_ctrl,
                                               place, finish, lat, bw)
                if fav_parent[w] >= 0:
                    pref[w] = place[fav_parent[w]]
                fb_of[w] = _etf_queue_all(w, tie, T, gdev, gmem, used, cap, pref[w], dr, avail, group, cand,
                                          inq, pk, pt, pid, psize, rk, rt, rid, rsize, fifo)
    return place, start, finish, fallbacks


# ------------------------------------------------------------ problem data
class _Data:
    """Op-level arrays every list scheduler reads (built once per problem).

    ``deadline``: the :func:`work_clock` reading its schedules stop at (a tracker's
    :meth:`~placetool.search.tracker.Tracker.deadline`: the end of a search's seeding share;
    inf for a method run on its own, which always answers); one cut short raises
    :class:`~placetool.search.tracker.BudgetExhausted`. At a thousand devices one schedule
    of a 10k-op graph takes seconds, more than a seeding share of a short budget."""

    deadline = np.inf

    def __init__(self, problem, gpu_only: bool = False, links: str = "queued"):
        g, cl, cm = problem.graph, problem.cluster, problem.cost_model
        if links not in LINKS:
            raise SearchError(f"links must be one of {', '.join(LINKS)}, got {links!r}")
        self.problem = problem
        # 0: the papers' links (nothing queues); 1 and 2: the simulator's rules, on links
        # that queue (links.queue "fifo") or not ("none")
        self.queued = 0 if links == "ideal" else 1 if cl.link_queue == "fifo" else 2
        n, D = g.n_ops, cl.n_devices
        allowed = problem.allowed
        if gpu_only:  # groups that may use an accelerator use only accelerators
            acc = np.zeros(D, bool)
            acc[accelerators(problem)] = True
            on_acc = (allowed & acc[None, :]).any(axis=1)
            allowed = np.where(on_acc[:, None], allowed & acc[None, :], allowed)
        ok = allowed[g.group]
        self.T = np.ascontiguousarray(np.where(ok, cm.T, np.inf))
        # merge parallel edges: one (src, dst) pair, bytes summed over its data edges
        eb = g.edge_bytes.astype(np.float64)
        isdata = (g.edge_tensor >= 0).astype(np.int64)
        key = g.edge_src.astype(np.int64) * n + g.edge_dst
        uk, inv = np.unique(key, return_inverse=True)
        src, dst = (uk // n).astype(np.int64), (uk % n).astype(np.int64)
        nbytes = np.bincount(inv, weights=eb, minlength=len(uk))
        ctrl = np.bincount(inv, weights=isdata, minlength=len(uk)) == 0
        self.src, self.dst, self.bytes, self.ctrl = src, dst, nbytes, ctrl
        o = np.argsort(dst, kind="stable")
        self.pred_ptr = np.searchsorted(dst[o], np.arange(n + 1)).astype(np.int64)
        self.pred_src = np.ascontiguousarray(src[o])
        self.pred_bytes = np.ascontiguousarray(nbytes[o])
        self.pred_ctrl = np.ascontiguousarray(ctrl[o])
        # uk is sorted by src already
        self.succ_ptr = np.searchsorted(src, np.arange(n + 1)).astype(np.int64)
        self.succ_dst = np.ascontiguousarray(dst)
        self.succ_bytes = np.ascontiguousarray(nbytes)
        self.succ_ctrl = np.ascontiguousarray(ctrl)
        # tensor-level inputs (each tensor once per consumer) and control predecessors,
        # for the timeline that sends a tensor once per device and queues links
        c = g.csr
        op_of_in = np.repeat(np.arange(n, dtype=np.int64), np.diff(c.in_ptr))
        ik = np.unique(op_of_in * max(g.n_tensors, 1) + c.in_tensor.astype(np.int64))
        self.in_tensor = np.ascontiguousarray(ik % max(g.n_tensors, 1))
        self.in_ptr = np.searchsorted(ik // max(g.n_tensors, 1), np.arange(n + 1)).astype(np.int64)
        self.tensor_op = np.ascontiguousarray(g.tensor_op, np.int64)
        self.op_tensor_ptr = np.ascontiguousarray(c.op_tensor_ptr, np.int64)
        self.tensor_ptr = np.ascontiguousarray(c.tensor_ptr, np.int64)
        self.tensor_cons = np.ascontiguousarray(c.tensor_cons, np.int64)
        self.tensor_bytes = np.ascontiguousarray(g.tensor_bytes, np.float64)
        ce = np.flatnonzero(g.edge_tensor < 0)
        co = ce[np.argsort(g.edge_dst[ce], kind="stable")]
        self.cpred_src = np.ascontiguousarray(g.edge_src[co], np.int64)
        self.cpred_ptr = np.searchsorted(g.edge_dst[co], np.arange(n + 1)).astype(np.int64)
        self.xc = cl.transfer_costs()
        self.group = np.ascontiguousarray(g.group, np.int64)
        self.gmem = group_memory_bytes(problem).astype(np.float64)
        self.cap = cm.capacity.astype(np.float64)
        self.lat = np.ascontiguousarray(cl.latency_us, np.float64)
        self.bw = np.ascontiguousarray(cl.bandwidth_bytes_per_us, np.float64)
        self.order = np.ascontiguousarray(g.topo_order, np.int64)
        self.rank = np.ascontiguousarray(g.topo_rank, np.int64)
        Tf = np.where(np.isfinite(self.T), self.T, np.nan)
        self.wbar = np.nanmean(Tf, axis=1)
        if D > 1:
            off = ~np.eye(D, dtype=bool)
            self.mean_lat = float(self.lat[off].mean())
            self.mean_inv_bw = float((1.0 / self.bw[off]).mean())
        else:
            self.mean_lat = self.mean_inv_bw = 0.0

    def rank_u(self):
        return upward_rank(self.order, self.wbar, self.succ_ptr, self.succ_dst, self.succ_bytes,
                           self.succ_ctrl, self.mean_lat, self.mean_inv_bw)

    def rank_d(self):
        return downward_rank(self.order, self.wbar, self.pred_ptr, self.pred_src, self.pred_bytes,
                             self.pred_ctrl, self.mean_lat, self.mean_inv_bw)

    def fresh_gdev(self):
        return np.full(self.problem.n_groups, -1, np.int64)

    def eft(self, prio, forced=None, insertion=True):
        n = len(prio)
        forced = np.full(n, -1, np.int64) if forced is None else forced
        gdev = self.fresh_gdev()
        out = eft_schedule(prio, self.rank, self.T, self.pred_ptr, self.pred_src, self.pred_bytes,
                           self.pred_ctrl, self.succ_ptr, self.succ_dst, self.group, gdev, self.gmem,
                           self.cap, self.lat, self.bw, forced, insertion, *self._timeline(), self.deadline)
        return self._check(gdev, out[0]), out

    def _timeline(self):
        return (self.in_ptr, self.in_tensor, self.tensor_op, self.tensor_bytes, self.cpred_ptr, self.cpred_src,
                self.xc, self.queued)

    def etf(self, prio, fav_parent=None, gdev=None):
        """ETF schedule; ``gdev`` (per group, -1 = free) fixes groups beforehand."""
        n = len(prio)
        fav_parent = np.full(n, -1, np.int64) if fav_parent is None else fav_parent
        gdev = self.fresh_gdev() if gdev is None else np.array(gdev, np.int64)
        # ties between equal starts: higher priority first, then topological rank; with
        # queued links a device's ready ops go in the simulator's order (topological rank)
        tie = np.empty(n, np.int64)
        if self.queued:
            tie[:] = self.rank
        else:
            tie[np.lexsort((self.rank, -prio))] = np.arange(n)
        out = etf_schedule(tie, self.T, self.pred_ptr, self.pred_src, self.pred_bytes,
                           self.pred_ctrl, self.succ_ptr, self.succ_dst, self.group, gdev, self.gmem,
                           self.cap, self.lat, self.bw, fav_parent, *self._timeline(),
                           self.op_tensor_ptr, self.tensor_ptr, self.tensor_cons, self.deadline)
        return self._check(gdev, out[0]), out

    def _check(self, gdev, place):
        if np.any(place < 0) and work_clock() >= self.deadline:
            raise BudgetExhausted  # cut short: no placement
        if np.any(gdev < 0):  # a scheduler bug, never a user error
            raise RuntimeError(f"list scheduler left {int((gdev < 0).sum())} groups unplaced")
        return gdev


def _variants(problem) -> list[bool]:
    """Device sets a scheduler tries: every device, and (when the cluster has a host
    besides its GPUs) GPUs only for the groups that may use one. List schedulers trust
    their own cost model; the simulator, which also queues transfers on links, picks."""
    return [False, True] if len(accelerators(problem)) < problem.n_devices else [False]


#: rounds a list scheduler runs against the simulator's memory account before its
#: placement is repaired instead (see :func:`_memory_rounds`)
MEMORY_ROUNDS = 8
#: how far below its capacity a retargeted device aims, as a share of the capacity
MEMORY_MARGIN = 0.05


def _retarget(acct, cap, charged, peak, margin: float = MEMORY_MARGIN) -> np.ndarray:
    """The capacities the group-memory estimate is held to in the next round.

    The estimate charges a group its parameters and every output of its ops, as if all
    lived at once; the simulator frees outputs once consumed but also holds the copies a
    device receives. How the two compare depends on the device's part of the schedule,
    so the last round's ``charged / peak`` converts a capacity into the estimate's units.
    A device over capacity gets its converted capacity (less ``margin``) where that is
    lower than now; a device with room where it is higher, so it can take what the
    others shed."""
    with np.errstate(divide="ignore", invalid="ignore"):
        target = np.where((charged > 0) & (peak > 0), charged * cap / peak * (1.0 - margin), acct)
    return np.where(peak > cap, np.minimum(acct, target), np.maximum(acct, target))


def _memory_rounds(problem, tracker, attempt, rounds: int = MEMORY_ROUNDS) -> list:
    """Run ``attempt(capacities) -> (group assignment, payload)`` and score its placement
    until the simulator says it fits, retargeting the capacities the estimate is held to
    after each round that does not (:func:`_retarget`), at most ``rounds`` times.

    The first round is scored even past a seconds budget (a one-shot method always
    answers), later ones only within it. Returns [(assignment, payload, EvalResult)]."""
    cap = problem.cost_model.capacity.astype(np.float64)
    gmem = group_memory_bytes(problem).astype(np.float64)
    acct = cap.copy()
    out = []
    for k in range(max(int(rounds), 1)):
        if tracker.remaining_evals() <= 0 or (k and tracker.done()):
            break
        gdev, payload = attempt(acct.copy())
        a = np.asarray(gdev, np.int32)
        r = score(tracker, a)
        out.append((a, payload, r))
        if r.feasible[0]:
            break
        charged = np.bincount(a, weights=gmem, minlength=problem.n_devices)
        acct = _retarget(acct, cap, charged, r.peak_memory_bytes[0].astype(np.float64))
    return out


def _best(runs):
    """Index of the run the tracker ranks first: feasible, then fastest."""
    key = [(not r.feasible[0], float(r.step_time_us[0])) for _, _, r in runs]
    return min(range(len(runs)), key=key.__getitem__)


#: how many of the rounds that do not fit, fastest first, are repaired by the simulator's account
FIT_TRIES = 3


def _fit_memory(problem, tracker, runs, tries: int = FIT_TRIES):
    """:func:`placetool.search.memory.fit_memory` from the runs out of memory that are
    faster than every one that fits, fastest first, at most ``tries`` of them within
    the budget: a fast schedule a little over capacity often fits after moving a few
    groups, faster than the rounds' best. Returns the fastest (assignment, EvalResult)
    that fits, or None."""
    from .memory import fit_memory

    ref = min((float(r.step_time_us[0]) for _, _, r in runs if r.feasible[0]), default=np.inf)
    order = sorted((float(r.step_time_us[0]), i) for i, (_, _, r) in enumerate(runs)
                   if not r.feasible[0] and float(r.step_time_us[0]) < ref)
    best, seen = None, set()
    for _, i in order:
        a0 = runs[i][0]
        if len(seen) >= tries or tracker.done():
            break
        if a0.tobytes() in seen:
            continue
        seen.add(a0.tobytes())
        a, r = fit_memory(problem, a0, tracker)
        if r is not None and r.feasible[0] and (best is None or r.step_time_us[0] < best[1].step_time_us[0]):
            best = (a, r)
    return best


def _planned(problem, a, links: str) -> float:
    """The makespan of assignment ``a`` on the m-ETF timeline (the plan of a placement
    no schedule of this run produced: m-TOPO's, or a repaired one)."""
    data = _Data(problem, links=links)
    _, (_, _, finish, _) = data.etf(data.rank_u(), gdev=np.asarray(a, np.int64))
    return float(finish.max()) if len(finish) else 0.0


def _schedule_variants(problem, tracker, schedule, links: str = "queued") -> dict:
    """Run ``schedule(data) -> (gdev, out, extra)`` per device set, each until its
    placement fits in memory by the simulator (:func:`_memory_rounds`), and describe
    the run the tracker found best: the makespan its schedule planned (``planned_us``)
    beside the simulator's (``simulated_us``).

    Memory-constrained by the simulator's account, not the estimate's: where no round
    fits, the placement least over capacity is repaired (:func:`_fit_memory`), and
    failing that m-TOPO's is taken (:func:`_topo_fitted`), so the result fits whenever
    m-TOPO's does (budget permitting). ``memory_fit`` says which it was."""
    runs = []  # (assignment, (gpu_only, out, extra), EvalResult)
    for gpu_only in _variants(problem):
        data = _Data(problem, gpu_only, links)
        data.deadline = tracker.deadline()

        def attempt(cap, data=data, gpu_only=gpu_only):
            data.cap = cap
            gdev, out, extra = schedule(data)
            return gdev, (gpu_only, out, extra)

        runs += _memory_rounds(problem, tracker, attempt)
    if not runs:  # no evaluation left at all
        raise BudgetExhausted
    i = _best(runs)
    a, (gpu_only, (place, start, finish, fallbacks), extra), r = runs[i]
    meta = {"devices": "gpus" if gpu_only else "all", "links": links, "memory": "constrained",
            "memory_rounds": len(runs), "memory_fit": "schedule" if r.feasible[0] else "none",
            "planned_us": float(finish.max()) if len(finish) else 0.0, "simulated_us": float(r.step_time_us[0]),
            "memory_fallbacks": int(fallbacks)}
    meta.update(extra or {})
    fitted = _fit_memory(problem, tracker, runs)
    if fitted is not None:  # faster than any round that fits, or the only one
        a, r = fitted
        meta["memory_fit"] = "fit_memory"
    elif not r.feasible[0]:
        topo = _topo_fitted(problem, tracker)
        if topo is not None and topo[2].feasible[0]:
            a, fit, r = topo[0], topo[1], topo[2]
            meta.update(memory_fit=f"m-topo ({fit})", devices="all", memory_fallbacks=topo[3])
    if meta["memory_fit"] not in ("schedule", "none"):  # the plan of the placement returned
        meta.update(planned_us=_planned(problem, a, links), simulated_us=float(r.step_time_us[0]))
    return meta


# ------------------------------------------------------------------ methods
@register("heft", seed_rank=4, summary="HEFT: upward-rank order, earliest-finish-time device, insertion into idle "
                                  "gaps; memory-constrained")
def heft(problem, budget, seed, tracker, insertion: bool = True, links: str = "queued"):
    """HEFT: upward-rank order, earliest-finish-time device, insertion into idle gaps."""

    def schedule(data):
        gdev, out = data.eft(data.rank_u(), insertion=bool(insertion))
        return gdev, out, None

    return _schedule_variants(problem, tracker, schedule, links)


@register("critical-path", seed_rank=5, summary="CPOP: critical-path ops on the device that runs the whole path "
                                           "fastest, the rest by earliest finish time; memory-constrained")
def critical_path(problem, budget, seed, tracker, links: str = "queued"):
    """CPOP: critical-path ops on the device that runs the whole path fastest, the rest
    by earliest finish time, in order of upward + downward rank."""

    def schedule(data):
        prio = data.rank_u() + data.rank_d()
        cp_len = float(prio.max()) if len(prio) else 0.0
        cp_ops = np.flatnonzero(prio >= cp_len * (1 - 1e-9))
        # the device that can run most of the path (pinned ops may not), then fastest
        Tc = data.T[cp_ops]
        fin = np.isfinite(Tc)
        cost = np.where(fin, Tc, 0.0).sum(axis=0)
        runnable = fin.sum(axis=0)
        cp_dev = int(np.lexsort((cost, -runnable))[0]) if fin.any() else -1
        forced = np.full(len(prio), -1, np.int64)
        if cp_dev >= 0:
            forced[cp_ops] = cp_dev
        gdev, out = data.eft(prio, forced=forced)
        return gdev, out, {"critical_path_ops": int(len(cp_ops)),
                           "critical_path_device": problem.cluster.names[cp_dev] if cp_dev >= 0 else None}

    return _schedule_variants(problem, tracker, schedule, links)


def _topo_assign(problem, cap):
    """m-TOPO's group assignment with device capacities ``cap`` (bytes of the estimate);
    returns (assignment, memory fallbacks, compute share per GPU in µs)."""
    g = problem.graph
    acc = accelerators(problem)
    gmem = group_memory_bytes(problem).astype(np.float64)
    gt = gpu_group_time(problem)
    on_acc = problem.allowed[:, acc].any(axis=1)
    share = gt[on_acc].sum() / len(acc)
    fb = fallback_device(problem)
    used = np.zeros(problem.n_devices)
    gdev = np.full(problem.n_groups, -1, np.int64)
    c, load, fallbacks = 0, 0.0, 0
    for op in g.topo_order.tolist():
        k = int(g.group[op])
        if gdev[k] >= 0:
            continue
        if not on_acc[k]:
            gdev[k] = fb[k]
            used[fb[k]] += gmem[k]
            continue
        while c < len(acc) - 1 and (load >= share or used[acc[c]] + gmem[k] > cap[acc[c]]):
            c, load = c + 1, 0.0
        d = int(acc[c])
        if not problem.allowed[k, d] or used[d] + gmem[k] > cap[d]:
            room = np.where(problem.allowed[k], cap - used, -np.inf)
            d = int(np.argmax(room))
            fallbacks += int(room[d] < gmem[k])
        gdev[k] = d
        used[d] += gmem[k]
        if d == acc[c]:
            load += gt[k]
    return gdev, fallbacks, float(share)


def _topo_fitted(problem, tracker):
    """m-TOPO under the simulator's memory account: rounds of :func:`_topo_assign`
    (:func:`_memory_rounds`), then :func:`_fit_memory` if none fits. Returns
    (assignment, how it fits, EvalResult, memory fallbacks, share) of the best, or None
    when no evaluation was left."""
    def attempt(cap):
        gdev, fallbacks, share = _topo_assign(problem, cap)
        return gdev, (fallbacks, share)

    runs = _memory_rounds(problem, tracker, attempt)
    if not runs:
        return None
    a, (fallbacks, share), r = runs[_best(runs)]
    if r.feasible[0]:
        return a, "schedule", r, int(fallbacks), share
    fitted = _fit_memory(problem, tracker, runs)
    if fitted is not None:
        return fitted[0], "fit_memory", fitted[1], int(fallbacks), share
    return a, "none", r, int(fallbacks), share


@register("m-topo", seed_rank=6, summary="m-TOPO: in topological order, fill one GPU after another with about 1/n "
                                    "of the compute each; memory-constrained")
def m_topo(problem, budget, seed, tracker, links: str = "queued"):
    """m-TOPO: in topological order, fill one GPU after another with about 1/n of the
    compute each, moving on early when a GPU's memory is full."""
    topo = _topo_fitted(problem, tracker)
    if topo is None:
        raise BudgetExhausted
    a, fit, r, fallbacks, share = topo
    # its plan: the placement, ops started earliest first on the same timeline as m-ETF
    return {"share_us": share, "memory_fallbacks": fallbacks, "links": links, "memory": "constrained",
            "memory_fit": fit, "planned_us": _planned(problem, a, links), "simulated_us": float(r.step_time_us[0])}


@register("m-etf", seed_rank=3, summary="m-ETF: earliest task first under device memory; memory-constrained")
def m_etf(problem, budget, seed, tracker, links: str = "queued"):
    """m-ETF: earliest task first under device memory."""

    def schedule(data):
        gdev, out = data.etf(data.rank_u())
        return gdev, out, None

    return _schedule_variants(problem, tracker, schedule, links)


def _sct_lp(p, src, dst, nbytes, ctrl, mean_lat, mean_inv_bw, time_limit):
    """Solve the SCT LP on one (sub)graph of len(p) ops; returns (fav_parent, message)."""
    import scipy.sparse as sp
    from scipy.optimize import linprog

    n, E = len(p), len(src)
    data_e = np.flatnonzero(~ctrl)
    m = len(data_e)
    c = mean_lat + nbytes[data_e] * mean_inv_bw
    nv = n + m + 1
    wcol = n + m
    ar = np.arange(E)
    xcol = n + np.arange(m)
    # precedence: s_i - s_j + c_ij x_ij <= -p_i
    rows = [ar, ar, data_e]
    cols = [src, dst, xcol]
    vals = [np.ones(E), -np.ones(E), c]
    b = [-p[src]]
    r = E
    # makespan: s_i - w <= -p_i (sinks only)
    sinks = np.setdiff1d(np.arange(n), src)
    rr = r + np.arange(len(sinks))
    rows += [rr, rr]
    cols += [sinks, np.full(len(sinks), wcol)]
    vals += [np.ones(len(sinks)), -np.ones(len(sinks))]
    b.append(-p[sinks])
    r += len(sinks)
    # at most one favourite child per op and one favourite parent: -sum x <= -(deg - 1)
    for ends in (src[data_e], dst[data_e]):
        deg = np.bincount(ends, minlength=n)
        who = np.flatnonzero(deg > 1)
        rid = np.full(n, -1, np.int64)
        rid[who] = r + np.arange(len(who))
        sel = np.flatnonzero(rid[ends] >= 0)
        rows.append(rid[ends][sel])
        cols.append(n + sel)
        vals.append(-np.ones(len(sel)))
        b.append(-(deg[who] - 1).astype(np.float64))
        r += len(who)
    A = sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(r, nv))
    obj = np.zeros(nv)
    obj[wcol] = 1.0
    bounds = np.zeros((nv, 2))
    bounds[:, 1] = np.inf
    bounds[n:n + m, 1] = 1.0
    res = linprog(obj, A_ub=A, b_ub=np.concatenate(b), bounds=bounds, method="highs",
                  options={"time_limit": float(time_limit)})
    fav_parent = np.full(n, -1, np.int64)
    if res.x is None:
        return fav_parent, str(res.message)
    x = res.x[n:n + m]
    es, ed = src[data_e], dst[data_e]
    chosen = np.flatnonzero(x < 0.5)
    # by construction at most one per parent and per child; keep the smallest x if the
    # solver's tolerance lets two through
    chosen = chosen[np.argsort(x[chosen], kind="stable")]
    seen_p = np.zeros(n, bool)
    for e in chosen.tolist():
        i, j = es[e], ed[e]
        if not seen_p[i] and fav_parent[j] < 0:
            fav_parent[j] = i
            seen_p[i] = True
    return fav_parent, str(res.message)


def sct_favourite_children(data, time_limit: float = 60.0, window: int = 2500):
    """Favourite child of each op from the SCT LP relaxation (Hanen & Munier 1995).

    Variables: start s_i, x_ij in [0, 1] per data edge (0 = child co-located), makespan w.
    minimise w  s.t.  s_i + p_i + c_ij x_ij <= s_j;  s_i + p_i <= w;
    sum_j x_ij >= outdeg(i) - 1;  sum_i x_ij >= indeg(j) - 1.
    An op's favourite child is its data successor with x_ij < 1/2 (at most one exists).
    p_i is the op's time on the fastest GPU (the theory assumes identical processors),
    c_ij the mean link time of the edge's bytes.

    HiGHS time grows faster than linearly with the graph, so graphs larger than
    ``window`` ops are solved as consecutive windows of the topological order (edges
    crossing windows get no favourite); each window gets ``time_limit`` / windows.
    Returns (fav_parent per op, -1 for none; LP status text of the last window).
    """
    n = len(data.wbar)
    acc = accelerators(data.problem)
    pa = data.T[:, acc].min(axis=1) if len(acc) else np.full(n, np.inf)
    p = np.where(np.isfinite(pa), pa, np.where(np.isfinite(data.wbar), data.wbar, 0.0))
    fav = np.full(n, -1, np.int64)
    n_win = max(1, -(-n // window))
    bounds = np.linspace(0, n, n_win + 1).astype(np.int64)
    win_of = np.empty(n, np.int64)
    win_of[data.order] = np.searchsorted(bounds, np.arange(n), side="right") - 1
    message = "empty graph"
    for w in range(n_win):
        ops = data.order[bounds[w]:bounds[w + 1]]
        local = np.full(n, -1, np.int64)
        local[ops] = np.arange(len(ops))
        sel = (win_of[data.src] == w) & (win_of[data.dst] == w)
        f, message = _sct_lp(p[ops], local[data.src[sel]], local[data.dst[sel]], data.bytes[sel],
                             data.ctrl[sel], data.mean_lat, data.mean_inv_bw, time_limit / n_win)
        has = f >= 0
        fav[ops[has]] = ops[f[has]]
    return fav, message


@register("m-sct", seed_rank=8, summary="m-SCT: m-ETF with favourite children (SCT LP, SciPy/HiGHS) on their "
                                   "parent's device; memory-constrained")
def m_sct(problem, budget, seed, tracker, lp_seconds: Positive | None = None, links: str = "queued"):
    """m-SCT: ETF under memory, favourite children (SCT LP, SciPy/HiGHS) on their
    parent's device."""
    limit = float(lp_seconds) if lp_seconds else min(60.0, (budget.seconds or 120.0) / 2)
    lp = {}

    def schedule(data):
        if not lp:  # the LP does not depend on the device set: solve it once
            lp["fav"], lp["status"] = sct_favourite_children(data, limit)
        gdev, out = data.etf(data.rank_u(), lp["fav"])
        return gdev, out, {"favourite_children": int((lp["fav"] >= 0).sum()), "lp_status": lp["status"]}

    return _schedule_variants(problem, tracker, schedule, links)
