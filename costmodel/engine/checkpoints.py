"""The incremental simulator's checkpoints: :func:`save` the loop's state, :func:`restore`
it under a new placement, and test whether a run has :func:`converged` to a saved state.
Each reads the same fields of :class:`~placetool.costmodel.engine.state.Work` and
:class:`~placetool.costmodel.engine.state.Checkpoints`."""

from __future__ import annotations

from numba import njit

from .queues import readyq_sort
from .state import LOW, set_bases


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
