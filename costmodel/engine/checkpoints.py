"""The incremental simulator's checkpoints: :func:`save` the loop's state, :func:`restore`
it under a new placement, and test whether a run has :func:`converged` to a saved state.

The three mirror each other: each walks the same fields of
:class:`~placetool.costmodel.engine.state.Work` and
:class:`~placetool.costmodel.engine.state.Checkpoints` in the same order (scalars; per
device; per link; the event queue; per op; the ready and task queues; the transfers), so
a field added to one belongs in the other two. The scalar slots are named in
:mod:`~placetool.costmodel.engine.state` (``CKF_*``, ``CKI_*``, ``CK_*``).
"""

from __future__ import annotations

from numba import njit

from .queues import readyq_sort
from .state import (CK_LINK_BUSY, CK_LINK_HEAD, CK_LINK_TAIL, CK_OP_MISSING, CK_OP_OUT_REFS, CK_X_NEXT, CK_X_REFS,
                    CKF_MAKESPAN, CKF_NEXT_T, CKF_NOW, CKI_CLEAN, CKI_EPOCH, CKI_N_EV, CKI_N_TASKS, CKI_N_X,
                    CKI_TASK_OFF, CKI_WM, CKI_WO, EPOCH, LOW, SC_EPOCH, SC_N_EV, SC_N_X, SF_MAKESPAN, SF_NOW, set_bases)


@njit(cache=True, inline="always")
def _saved_tasks(ck, j):
    """Offset in the task pool where checkpoint j's tasks go."""
    return 0 if j == 0 else ck.i[j - 1, CKI_TASK_OFF] + ck.i[j - 1, CKI_N_TASKS]


@njit(cache=True)
def save(ck, j, w, placement, now, epoch, clean, n_ev, n_x, makespan, wm, wo):
    """Store the state at the top of the loop (every instant before the next event's handled)
    as checkpoint j; False (nothing stored) if its queued tasks do not fit the pool."""
    D = w.live.shape[0]
    off = _saved_tasks(ck, j)
    n_tasks = 0
    for d in range(D):
        n_tasks += w.tq_size[d]
    if off + n_tasks > ck.tq_k1.shape[0]:
        return False
    if j > 0:
        for d in range(D):
            ck.seg[j - 1, d] = w.seg[d]
    for d in range(D):
        w.seg[d] = 0
    # scalars
    ck.f[j, CKF_NEXT_T] = w.ev_t[n_ev - 1]
    ck.f[j, CKF_MAKESPAN] = makespan
    ck.f[j, CKF_NOW] = now
    ck.i[j, CKI_N_X] = n_x
    ck.i[j, CKI_N_EV] = n_ev
    ck.i[j, CKI_EPOCH] = epoch
    ck.i[j, CKI_CLEAN] = clean
    ck.i[j, CKI_WM] = wm
    ck.i[j, CKI_WO] = wo
    ck.i[j, CKI_TASK_OFF] = off
    ck.i[j, CKI_N_TASKS] = n_tasks
    # per device, per link, the event queue, per op
    for d in range(D):
        ck.busy[j, d] = w.busy[d]
        ck.live[j, d] = w.live[d]
        ck.livepeak[j, d] = w.livepeak[d]
        ck.running[j, d] = w.running[d]
        ck.rqsize[j, d] = w.rq_size[d]
        ck.tqsize[j, d] = w.tq_size[d]
    for l in range(D * D):
        ck.link[j, CK_LINK_HEAD, l] = w.link_head[l]
        ck.link[j, CK_LINK_TAIL, l] = w.link_tail[l]
        ck.link[j, CK_LINK_BUSY, l] = 1 if w.link_busy[l] else 0
    for e in range(n_ev):
        ck.ev_t[j, e] = w.ev_t[e]
        ck.ev_k[j, e] = w.ev_k[e]
        ck.ev_id[j, e] = w.ev_id[e]
    for op in range(placement.shape[0]):
        ck.op[j, CK_OP_MISSING, op] = w.missing[op]
        ck.op[j, CK_OP_OUT_REFS, op] = w.out_refs[op]
    # ready and task queues, device by device, with their ready times
    k = 0
    for d in range(D):
        if w.rq_unsorted[d]:  # saved sorted, so a restore needs no flag
            readyq_sort(w.rq, w.rq_base[d], w.rq_size[d])
            w.rq_unsorted[d] = False
        for i in range(w.rq_size[d]):
            key = w.rq[w.rq_base[d] + i]
            ck.rq[j, k] = key
            ck.rqready[j, k] = w.epoch_time[key >> 32]
            k += 1
    k = off
    for d in range(D):
        for i in range(w.tq_size[d]):
            a = w.tq_base[d] + i
            ck.tq_k1[k] = w.tq_k1[a]
            ck.tq_k2[k] = w.tq_k2[a]
            ck.tq_id[k] = w.tq_id[a]
            ck.tq_ready[k] = w.epoch_time[(w.tq_k1[a] >> 32) & EPOCH]
            k += 1
    # transfers
    alive = 0
    for x in range(n_x):
        ck.x[j, CK_X_REFS, x] = w.x_refs[x]
        ck.x[j, CK_X_NEXT, x] = w.x_next[x]
        if w.x_refs[x] > 0:
            alive += 1
    ck.alive[j] = alive
    return True


@njit(cache=True, nogil=True)
def restore(net, w, ck, base, j, placement):
    """Load checkpoint ``j`` under ``placement`` (the base run's transfers keep their ids).

    Valid when no op whose device changed has been touched before the checkpoint: it
    is in no ready queue, running, or an input's destination yet.
    """
    D = w.live.shape[0]
    set_bases(net, w, placement)
    n_x = ck.i[j, CKI_N_X]
    n_ev = ck.i[j, CKI_N_EV]
    # per device, per link, the event queue, per op
    for d in range(D):
        w.busy[d] = ck.busy[j, d]
        w.live[d] = ck.live[j, d]
        w.livepeak[d] = ck.livepeak[j, d]
        w.seg[d] = 0
        w.running[d] = ck.running[j, d]
        w.rq_size[d] = ck.rqsize[j, d]
        w.tq_size[d] = ck.tqsize[j, d]
    for l in range(D * D):
        w.link_head[l] = ck.link[j, CK_LINK_HEAD, l]
        w.link_tail[l] = ck.link[j, CK_LINK_TAIL, l]
        w.link_busy[l] = ck.link[j, CK_LINK_BUSY, l] != 0
    for e in range(n_ev):
        w.ev_t[e] = ck.ev_t[j, e]
        w.ev_k[e] = ck.ev_k[j, e]
        w.ev_id[e] = ck.ev_id[j, e]
    for op in range(placement.shape[0]):
        w.missing[op] = ck.op[j, CK_OP_MISSING, op]
        w.out_refs[op] = ck.op[j, CK_OP_OUT_REFS, op]
    # restore is save's copies read backwards, field by field (w <- ck where save has
    # ck <- w), written out like the loop rather than one helper with a direction switch
    # per field: a branch in every copy of a restore, which runs once per incremental move
    # (not measured separately).
    # queues: the stored slices, sorted, re-based for this placement
    k = 0
    for d in range(D):
        for i in range(w.rq_size[d]):
            key = ck.rq[j, k]
            w.rq[w.rq_base[d] + i] = key
            w.epoch_time[key >> 32] = ck.rqready[j, k]
            k += 1
    k = ck.i[j, CKI_TASK_OFF]
    for d in range(D):
        for i in range(w.tq_size[d]):
            a = w.tq_base[d] + i
            w.tq_k1[a] = ck.tq_k1[k]
            w.tq_k2[a] = ck.tq_k2[k]
            w.tq_id[a] = ck.tq_id[k]
            w.epoch_time[(ck.tq_k1[k] >> 32) & EPOCH] = ck.tq_ready[k]
            k += 1
    w.epoch_time[ck.i[j, CKI_EPOCH]] = ck.f[j, CKF_NOW]
    w.rq_unsorted[:] = False  # save sorted the slices it stored
    # transfers: the base run's, with the checkpoint's refs and link order
    for x in range(n_x):
        t = base.x_tensor[x]
        w.x_tensor[x] = t
        w.x_src[x] = base.x_src[x]
        w.x_dst[x] = base.x_dst[x]
        w.x_refs[x] = ck.x[j, CK_X_REFS, x]
        w.x_next[x] = ck.x[j, CK_X_NEXT, x]
        w.copy_of[t * D + base.x_dst[x]] = x
    w.sent[:] = -1
    # scalars
    w.sc[SC_N_EV] = n_ev
    w.sc[SC_N_X] = n_x
    w.sc[SC_EPOCH] = ck.i[j, CKI_EPOCH]
    w.sf[SF_MAKESPAN] = ck.f[j, CKF_MAKESPAN]
    w.sf[SF_NOW] = ck.f[j, CKF_NOW]


@njit(cache=True)
def _same_events(ck, base, j, w, n_ev, key_span):
    """Whether the pending events equal checkpoint j's, as a multiset: ops by (time, op),
    transfer stages by (time, kind, tensor, src, dst)."""
    for e in range(n_ev):
        found = False
        for f in range(n_ev):
            if ck.ev_t[j, f] != w.ev_t[e]:
                continue
            if w.ev_k[e] < key_span:
                if ck.ev_k[j, f] < key_span and ck.ev_id[j, f] == w.ev_id[e]:
                    found = True
                    break
            elif ck.ev_k[j, f] // key_span == w.ev_k[e] // key_span:
                x = w.ev_id[e]
                y = ck.ev_id[j, f]
                if base.x_tensor[y] != w.x_tensor[x] or base.x_src[y] != w.x_src[x] or base.x_dst[y] != w.x_dst[x]:
                    continue
                found = True
                break
        if not found:
            return False
    return True


@njit(cache=True)
def _same_queues(ck, j, w):
    """Whether each device's ready ops (by rank) and send/receive tasks (by tensor,
    destination, kind) equal checkpoint j's, with the same ready times."""
    D = w.live.shape[0]
    k = 0
    for d in range(D):
        for i in range(w.rq_size[d]):
            w.mark[ck.rq[j, k] & LOW] = k + 1
            k += 1
        ok = True
        for i in range(w.rq_size[d]):
            key = w.rq[w.rq_base[d] + i]
            m = w.mark[key & LOW]
            if m == 0 or w.epoch_time[key >> 32] != ck.rqready[j, m - 1]:
                ok = False
        k -= w.rq_size[d]
        for i in range(w.rq_size[d]):
            w.mark[ck.rq[j, k] & LOW] = 0
            k += 1
        if not ok:
            return False
    k = ck.i[j, CKI_TASK_OFF]
    for d in range(D):
        for i in range(w.tq_size[d]):
            a = w.tq_base[d] + i
            found = False
            for f in range(k, k + w.tq_size[d]):
                if ck.tq_k2[f] == w.tq_k2[a]:
                    found = ck.tq_ready[f] == w.epoch_time[(w.tq_k1[a] >> 32) & EPOCH]
                    break
            if not found:
                return False
        k += w.tq_size[d]
    return True


@njit(cache=True)
def converged(net, ck, base, j, w, placement, moved_ops, n_ev, n_x, key_span, wm, wo):
    """Whether the running state equals base checkpoint ``j`` in everything that shapes
    the future (transfer ids aside, which only name things). Cheap tests first."""
    if n_ev != ck.i[j, CKI_N_EV] or wm != ck.i[j, CKI_WM] or wo != ck.i[j, CKI_WO]:
        return False
    for i in range(moved_ops.shape[0]):
        if w.out_refs[moved_ops[i]] != 0:
            return False
    D = w.live.shape[0]
    for d in range(D):
        if (w.live[d] != ck.live[j, d] or w.running[d] != ck.running[j, d] or w.rq_size[d] != ck.rqsize[j, d]
                or w.tq_size[d] != ck.tqsize[j, d]):
            return False
    L = D * D
    for l in range(L):
        if w.link_busy[l] != (ck.link[j, CK_LINK_BUSY, l] != 0):
            return False
    if not _same_events(ck, base, j, w, n_ev, key_span):
        return False
    if not _same_queues(ck, j, w):
        return False
    # link queues, in order
    for l in range(L):
        x = w.link_head[l]
        y = ck.link[j, CK_LINK_HEAD, l]
        while x >= 0 and y >= 0:
            if w.x_tensor[x] != base.x_tensor[y]:
                return False
            x = w.x_next[x]
            y = ck.x[j, CK_X_NEXT, y]
        if x >= 0 or y >= 0:
            return False
    for op in range(placement.shape[0]):
        if w.missing[op] != ck.op[j, CK_OP_MISSING, op] or w.out_refs[op] != ck.op[j, CK_OP_OUT_REFS, op]:
            return False
    # copies still held (refs > 0) on both sides: same tensor, route and refs
    alive = 0
    for x in range(n_x):
        if w.x_refs[x] > 0:
            alive += 1
            y = base.copy_of[w.x_tensor[x] * D + w.x_dst[x]]
            if y < 0 or y >= ck.i[j, CKI_N_X] or base.x_src[y] != w.x_src[x] or ck.x[j, CK_X_REFS, y] != w.x_refs[x]:
                return False
    return alive == ck.alive[j]
