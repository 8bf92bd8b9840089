"""Numba kernels of the incremental (delta) simulator.

The loop is :func:`placetool.costmodel.kernels.simulate_into`'s, event for event (same heaps, same
keys, same float expressions), with its state kept in caller-owned arrays so that it can
be *saved* at checkpoints during a base run, *restored* under a different placement,
and *compared* against a base checkpoint to stop early once the two runs have
re-converged. Two bookkeeping differences, neither visible in the results:

- memory is tracked as *live* bytes (outputs and received copies) per device; the
  parameter bytes, constant over the run, are added by the caller (peak = params +
  max live), so a checkpoint stays valid when a move shifts parameters between devices;
- ``copy_of[t * D + d]`` (the transfer that brings tensor t to device d) may hold stale
  ids from other runs; an entry counts only if it points below ``n_x`` at a transfer of
  that tensor to that device, and a restore re-points the checkpoint's prefix.

Arrays, grouped as the Python side passes them:

- constants ``C``: T, rank, topo_order, out_bytes, tensor_op, tensor_bytes, op_tensor_ptr, tensor_ptr,
  tensor_cons, ctrl_ptr, ctrl_dst, in_ptr, in_tensor, n_inputs, latency, bandwidth;
- work state ``W``: live, livepeak, seg, busy, running, rq, rq_size, epoch_time, missing,
  out_refs, x_tensor, x_src, x_dst, x_refs, x_next, copy_of, link_head, link_tail,
  link_busy, ev_t, ev_k, ev_id, op_end, moved, mark;
- checkpoints ``K`` (leading axis = checkpoint): time/makespan, n_x/n_ev, per device
  busy/live/livepeak/running/rq sizes, per link head/tail/busy, the event heap, per op
  missing/out_refs, the ready heaps (ops and ready times), per transfer refs/next, and the
  live peak of each segment between checkpoints;
- base ``B``: the base run's transfers (tensor, src, dst) and copy table.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .kernels import heap_pop, heap_push, keyheap_pop, keyheap_push

XFER_DONE = 1


@njit(cache=True)
def rq_bases(placement, D):
    """Start of each device's slice of the shared ready-heap buffer."""
    count = np.zeros(D, np.int64)
    for op in range(placement.shape[0]):
        count[placement[op]] += 1
    base = np.zeros(D, np.int64)
    for d in range(1, D):
        base[d] = base[d - 1] + count[d - 1]
    return base


@njit(cache=True)
def init_fresh(placement, n_inputs, rank, live, livepeak, seg, busy, running, rq, rq_size, epoch_time,
               missing, out_refs, link_head, link_tail, link_busy, sc):
    """The state at time 0 before the first dispatch (``sc`` = [n_ev, n_x, -, epoch])."""
    n = placement.shape[0]
    D = live.shape[0]
    for d in range(D):
        live[d] = 0
        livepeak[d] = 0
        seg[d] = 0
        busy[d] = 0.0
        running[d] = False
        rq_size[d] = 0
    for l in range(link_head.shape[0]):
        link_head[l] = -1
        link_tail[l] = -1
        link_busy[l] = False
    base = rq_bases(placement, D)
    for op in range(n):
        missing[op] = n_inputs[op]
        out_refs[op] = 0
        if missing[op] == 0:
            d = placement[op]
            keyheap_push(rq, base[d], rq_size[d], np.int64(rank[op]))
            rq_size[d] += 1
    epoch_time[0] = 0.0
    sc[0] = 0
    sc[1] = 0
    sc[3] = 0


@njit(cache=True)
def save(j, placement, now, epoch, clean, live, livepeak, busy, running, rq, rq_size, epoch_time, missing, out_refs,
         x_refs, x_next, link_head, link_tail, link_busy, ev_t, ev_k, ev_id, n_ev, n_x, makespan,
         ck_f, ck_i, ck_busy, ck_live, ck_livepeak, ck_running, ck_rqsize, ck_link,
         ck_ev_t, ck_ev_k, ck_ev_id, ck_op, ck_rq, ck_rqready, ck_x):
    """Store the state at the top of the loop (all instants before ev_t[0] handled)."""
    D = live.shape[0]
    ck_f[j, 0] = ev_t[0]
    ck_f[j, 1] = makespan
    ck_f[j, 2] = now
    ck_i[j, 0] = n_x
    ck_i[j, 1] = n_ev
    ck_i[j, 2] = epoch
    ck_i[j, 3] = clean
    for d in range(D):
        ck_busy[j, d] = busy[d]
        ck_live[j, d] = live[d]
        ck_livepeak[j, d] = livepeak[d]
        ck_running[j, d] = running[d]
        ck_rqsize[j, d] = rq_size[d]
    for l in range(link_head.shape[0]):
        ck_link[j, 0, l] = link_head[l]
        ck_link[j, 1, l] = link_tail[l]
        ck_link[j, 2, l] = 1 if link_busy[l] else 0
    for e in range(n_ev):
        ck_ev_t[j, e] = ev_t[e]
        ck_ev_k[j, e] = ev_k[e]
        ck_ev_id[j, e] = ev_id[e]
    ck_op[j, 0, :] = missing
    ck_op[j, 1, :] = out_refs
    base = rq_bases(placement, D)
    k = 0
    for d in range(D):
        for i in range(rq_size[d]):
            key = rq[base[d] + i]
            ck_rq[j, k] = key
            ck_rqready[j, k] = epoch_time[key >> 32]
            k += 1
    for x in range(n_x):
        ck_x[j, 0, x] = x_refs[x]
        ck_x[j, 1, x] = x_next[x]


@njit(cache=True)
def restore(j, placement, D, live, livepeak, seg, busy, running, rq, rq_size, epoch_time, missing, out_refs,
            x_tensor, x_src, x_dst, x_refs, x_next, copy_of, link_head, link_tail, link_busy,
            ev_t, ev_k, ev_id, sc,
            ck_f, ck_i, ck_busy, ck_live, ck_livepeak, ck_running, ck_rqsize, ck_link,
            ck_ev_t, ck_ev_k, ck_ev_id, ck_op, ck_rq, ck_rqready, ck_x,
            b_x_tensor, b_x_src, b_x_dst):
    """Load checkpoint ``j`` under ``placement``; returns (makespan so far, now).

    Valid when no op whose device changed has been touched before the checkpoint: it
    is in no ready heap, running, or an input's destination yet.
    """
    n_x = ck_i[j, 0]
    n_ev = ck_i[j, 1]
    for d in range(D):
        busy[d] = ck_busy[j, d]
        live[d] = ck_live[j, d]
        livepeak[d] = ck_livepeak[j, d]
        seg[d] = 0
        running[d] = ck_running[j, d]
        rq_size[d] = ck_rqsize[j, d]
    for l in range(link_head.shape[0]):
        link_head[l] = ck_link[j, 0, l]
        link_tail[l] = ck_link[j, 1, l]
        link_busy[l] = ck_link[j, 2, l] != 0
    for e in range(n_ev):
        ev_t[e] = ck_ev_t[j, e]
        ev_k[e] = ck_ev_k[j, e]
        ev_id[e] = ck_ev_id[j, e]
    missing[:] = ck_op[j, 0, :]
    out_refs[:] = ck_op[j, 1, :]
    # heaps: the stored slices, re-based for this placement (pop order depends only on keys)
    base = rq_bases(placement, D)
    k = 0
    for d in range(D):
        for i in range(rq_size[d]):
            key = ck_rq[j, k]
            rq[base[d] + i] = key
            epoch_time[key >> 32] = ck_rqready[j, k]
            k += 1
    epoch_time[ck_i[j, 2]] = ck_f[j, 2]
    for x in range(n_x):
        t = b_x_tensor[x]
        x_tensor[x] = t
        x_src[x] = b_x_src[x]
        x_dst[x] = b_x_dst[x]
        x_refs[x] = ck_x[j, 0, x]
        x_next[x] = ck_x[j, 1, x]
        copy_of[t * D + b_x_dst[x]] = x
    sc[0] = n_ev
    sc[1] = n_x
    sc[3] = ck_i[j, 2]
    return ck_f[j, 1], ck_f[j, 2]


@njit(cache=True)
def converged(j, n_moved_done, n_moved, wm, wo, placement, D, live, running, rq, rq_size, epoch_time, missing,
              out_refs, x_tensor, x_src, x_dst, x_refs, x_next, link_head, link_busy,
              ev_t, ev_k, ev_id, n_ev, n_x, key_span, moved_ops, mark,
              ck_i, ck_live, ck_running, ck_rqsize, ck_link, ck_ev_t, ck_ev_k, ck_ev_id,
              ck_op, ck_rq, ck_rqready, ck_x, b_x_tensor, b_x_src, b_x_dst, b_copy_of, ck_alive):
    """Whether the running state equals base checkpoint ``j`` in everything that shapes
    the future (transfer ids aside, which only name things). Cheap tests first."""
    if n_moved_done != n_moved or n_ev != ck_i[j, 1] or wm != ck_i[j, 4] or wo != ck_i[j, 5]:
        return False
    for i in range(moved_ops.shape[0]):
        if out_refs[moved_ops[i]] != 0:
            return False
    for d in range(D):
        if live[d] != ck_live[j, d] or running[d] != ck_running[j, d] or rq_size[d] != ck_rqsize[j, d]:
            return False
    L = link_head.shape[0]
    for l in range(L):
        if link_busy[l] != (ck_link[j, 2, l] != 0):
            return False
    # pending events, as a multiset: ops by (time, op), transfers by (time, tensor, src, dst)
    for e in range(n_ev):
        found = False
        for f in range(n_ev):
            if ck_ev_t[j, f] != ev_t[e]:
                continue
            if ev_k[e] < key_span:
                if ck_ev_k[j, f] < key_span and ck_ev_id[j, f] == ev_id[e]:
                    found = True
                    break
            elif ck_ev_k[j, f] >= key_span:
                x = ev_id[e]
                y = ck_ev_id[j, f]
                if b_x_tensor[y] == x_tensor[x] and b_x_src[y] == x_src[x] and b_x_dst[y] == x_dst[x]:
                    found = True
                    break
        if not found:
            return False
    # ready heaps: same ops (by rank) with the same ready times on each device
    low = np.int64(0xFFFFFFFF)
    base = rq_bases(placement, D)
    k = 0
    for d in range(D):
        for i in range(rq_size[d]):
            mark[ck_rq[j, k] & low] = k + 1
            k += 1
        ok = True
        for i in range(rq_size[d]):
            key = rq[base[d] + i]
            m = mark[key & low]
            if m == 0 or epoch_time[key >> 32] != ck_rqready[j, m - 1]:
                ok = False
        k -= rq_size[d]
        for i in range(rq_size[d]):
            mark[ck_rq[j, k] & low] = 0
            k += 1
        if not ok:
            return False
    # link queues, in order
    for l in range(L):
        x = link_head[l]
        y = ck_link[j, 0, l]
        while x >= 0 and y >= 0:
            if x_tensor[x] != b_x_tensor[y]:
                return False
            x = x_next[x]
            y = ck_x[j, 1, y]
        if x >= 0 or y >= 0:
            return False
    n = missing.shape[0]
    for op in range(n):
        if missing[op] != ck_op[j, 0, op] or out_refs[op] != ck_op[j, 1, op]:
            return False
    # copies still held (refs > 0) on both sides: same tensor, route and refs
    alive = 0
    for x in range(n_x):
        if x_refs[x] > 0:
            alive += 1
            y = b_copy_of[x_tensor[x] * D + x_dst[x]]
            if y < 0 or y >= ck_i[j, 0] or b_x_src[y] != x_src[x] or ck_x[j, 0, y] != x_refs[x]:
                return False
    return alive == ck_alive[j]


@njit(cache=True, error_model="numpy")
def run(placement, T, rank, topo_order, out_bytes, tensor_op, tensor_bytes, op_tensor_ptr, tensor_ptr, tensor_cons,
        ctrl_ptr, ctrl_dst, in_ptr, in_tensor, n_inputs, latency, bandwidth,
        live, livepeak, seg, busy, running, rq, rq_size, epoch_time, missing, out_refs,
        x_tensor, x_src, x_dst, x_refs, x_next, copy_of, link_head, link_tail, link_busy,
        ev_t, ev_k, ev_id, op_end, moved, mark,
        ck_f, ck_i, ck_busy, ck_live, ck_livepeak, ck_running, ck_rqsize, ck_link,
        ck_ev_t, ck_ev_k, ck_ev_id, ck_op, ck_rq, ck_rqready, ck_x, ck_seg, ck_alive,
        b_x_tensor, b_x_src, b_x_dst, b_copy_of, moved_ops,
        sc, makespan, now, start_ck, n_ck, record, every, check):
    """Run the loop from the state in ``W`` to the end of the step.

    ``sc`` = [n_ev, n_x, n_checkpoints, epoch]; ``now`` is the last instant handled. With ``record``, saves a checkpoint every
    ``every`` events into slots after ``start_ck`` (segment live peaks into ``ck_seg``).
    With ``check``, compares against base checkpoints after ``start_ck`` (up to ``n_ck``)
    and stops at the first that matches. Returns (makespan, matched checkpoint or -1).
    """
    D = T.shape[1]
    L = D * D
    n = placement.shape[0]
    n_data = tensor_cons.shape[0]
    key_span = np.int64(max(n, n_data) + 1)
    cap_ck = ck_f.shape[0]
    n_ev = sc[0]
    n_x = sc[1]
    epoch = sc[3]
    low = np.int64(0xFFFFFFFF)
    rq_base = rq_bases(placement, D)
    link_pending = np.zeros(L, np.bool_)
    pending = np.empty(L, np.int64)
    n_pending = 0
    n_moved = moved_ops.shape[0]
    n_moved_done = 0
    next_ck = start_ck + 1
    since = every if start_ck < 0 else 0
    cj = start_ck + 1  # next base checkpoint to compare against
    fresh = start_ck < 0  # no event handled yet
    # rank-weighted sums of missing inputs and output references: a cheap first test of
    # whether two states can be equal
    wm = np.int64(0)
    wo = np.int64(0)
    for op in range(n):
        wm += missing[op] * np.int64(rank[op] + 1)
        wo += out_refs[op] * np.int64(rank[op] + 1)

    matched = -1
    while True:
        # ---- dispatch (a no-op right after a restore: the checkpoint was taken after one)
        for d in range(D):
            if not running[d] and rq_size[d] > 0:
                op = topo_order[keyheap_pop(rq, rq_base[d], rq_size[d]) & low]
                rq_size[d] -= 1
                running[d] = True
                end = now + T[op, d]
                op_end[op] = end
                busy[d] += T[op, d]
                live[d] += out_bytes[op]
                if live[d] > livepeak[d]:
                    livepeak[d] = live[d]
                if live[d] > seg[d]:
                    seg[d] = live[d]
                n_ev = heap_push(ev_t, ev_k, ev_id, n_ev, end, rank[op], op)
        for k in range(n_pending):
            l = pending[k]
            link_pending[l] = False
            if not link_busy[l] and link_head[l] >= 0:
                x = link_head[l]
                link_head[l] = x_next[x]
                if link_head[l] < 0:
                    link_tail[l] = -1
                link_busy[l] = True
                s = x_src[x]
                dd = x_dst[x]
                b = tensor_bytes[x_tensor[x]]
                x_end = now + (latency[s, dd] + b / bandwidth[s, dd])
                live[dd] += b
                if live[dd] > livepeak[dd]:
                    livepeak[dd] = live[dd]
                if live[dd] > seg[dd]:
                    seg[dd] = live[dd]
                n_ev = heap_push(ev_t, ev_k, ev_id, n_ev, x_end, XFER_DONE * key_span + x, x)
        n_pending = 0

        if n_ev == 0:
            break
        if record and since >= every and next_ck < cap_ck and n_ev <= ck_ev_t.shape[1]:
            if next_ck > 0:
                for d in range(D):
                    ck_seg[next_ck - 1, d] = seg[d]
            for d in range(D):
                seg[d] = 0
            clean = 1 if (now < ev_t[0] or fresh) else 0
            save(next_ck, placement, now, epoch, clean, live, livepeak, busy, running, rq, rq_size, epoch_time, missing,
                 out_refs, x_refs, x_next, link_head, link_tail, link_busy, ev_t, ev_k, ev_id, n_ev, n_x,
                 makespan, ck_f, ck_i, ck_busy, ck_live, ck_livepeak, ck_running, ck_rqsize, ck_link,
                 ck_ev_t, ck_ev_k, ck_ev_id, ck_op, ck_rq, ck_rqready, ck_x)
            alive = 0
            for x in range(n_x):
                if x_refs[x] > 0:
                    alive += 1
            ck_alive[next_ck] = alive
            ck_i[next_ck, 4] = wm
            ck_i[next_ck, 5] = wo
            next_ck += 1
            since = 0
        if check:
            while cj < n_ck and ck_f[cj, 0] < ev_t[0]:
                cj += 1
            if cj < n_ck and ck_f[cj, 0] == ev_t[0]:
                if converged(cj, n_moved_done, n_moved, wm, wo, placement, D, live, running, rq, rq_size, epoch_time,
                             missing, out_refs, x_tensor, x_src, x_dst, x_refs, x_next, link_head, link_busy,
                             ev_t, ev_k, ev_id, n_ev, n_x, key_span, moved_ops, mark,
                             ck_i, ck_live, ck_running, ck_rqsize, ck_link, ck_ev_t, ck_ev_k, ck_ev_id,
                             ck_op, ck_rq, ck_rqready, ck_x, b_x_tensor, b_x_src, b_x_dst, b_copy_of, ck_alive):
                    matched = cj
                    break
                cj += 1
        # ---- handle every event of the next instant
        if ev_t[0] > now:
            epoch += 1
            epoch_time[epoch] = ev_t[0]
        now = ev_t[0]
        while n_ev > 0 and ev_t[0] == now:
            kind_key = ev_k[0]
            i = ev_id[0]
            n_ev = heap_pop(ev_t, ev_k, ev_id, n_ev)
            since += 1
            fresh = False
            if kind_key < key_span:  # an op finished
                op = i
                d = placement[op]
                running[d] = False
                if moved[op]:
                    n_moved_done += 1
                if now > makespan:
                    makespan = now
                for e in range(in_ptr[op], in_ptr[op + 1]):
                    t = in_tensor[e]
                    prod = tensor_op[t]
                    if placement[prod] == d:
                        out_refs[prod] -= 1
                        wo -= rank[prod] + 1
                        if out_refs[prod] == 0:
                            live[d] -= out_bytes[prod]
                    else:
                        x = copy_of[t * D + d]
                        x_refs[x] -= 1
                        if x_refs[x] == 0:
                            live[d] -= tensor_bytes[t]
                refs = 0
                for t in range(op_tensor_ptr[op], op_tensor_ptr[op + 1]):
                    for e in range(tensor_ptr[t], tensor_ptr[t + 1]):
                        c = tensor_cons[e]
                        dc = placement[c]
                        if dc == d:
                            refs += 1
                            missing[c] -= 1
                            wm -= rank[c] + 1
                            if missing[c] == 0:
                                keyheap_push(rq, rq_base[dc], rq_size[dc], (epoch << 32) | rank[c])
                                rq_size[dc] += 1
                            continue
                        x = copy_of[t * D + dc]
                        if x >= 0 and x < n_x and x_tensor[x] == t and x_dst[x] == dc:
                            x_refs[x] += 1
                        else:
                            x = n_x
                            n_x += 1
                            copy_of[t * D + dc] = x
                            x_tensor[x] = t
                            x_src[x] = d
                            x_dst[x] = dc
                            x_refs[x] = 1
                            x_next[x] = -1
                            l = d * D + dc
                            if link_tail[l] >= 0:
                                x_next[link_tail[l]] = x
                            else:
                                link_head[l] = x
                            link_tail[l] = x
                            if not link_pending[l]:
                                link_pending[l] = True
                                pending[n_pending] = l
                                n_pending += 1
                            refs += 1
                for e in range(ctrl_ptr[op], ctrl_ptr[op + 1]):
                    c = ctrl_dst[e]
                    missing[c] -= 1
                    wm -= rank[c] + 1
                    if missing[c] == 0:
                        dc = placement[c]
                        keyheap_push(rq, rq_base[dc], rq_size[dc], (epoch << 32) | rank[c])
                        rq_size[dc] += 1
                out_refs[op] = refs
                wo += refs * np.int64(rank[op] + 1)
                if refs == 0:
                    live[d] -= out_bytes[op]
            else:  # a transfer arrived
                x = i
                t = x_tensor[x]
                s = x_src[x]
                dd = x_dst[x]
                l = s * D + dd
                link_busy[l] = False
                if not link_pending[l]:
                    link_pending[l] = True
                    pending[n_pending] = l
                    n_pending += 1
                prod = tensor_op[t]
                out_refs[prod] -= 1
                wo -= rank[prod] + 1
                if out_refs[prod] == 0:
                    live[s] -= out_bytes[prod]
                for e in range(tensor_ptr[t], tensor_ptr[t + 1]):
                    c = tensor_cons[e]
                    if placement[c] == dd:
                        missing[c] -= 1
                        wm -= rank[c] + 1
                        if missing[c] == 0:
                            keyheap_push(rq, rq_base[dd], rq_size[dd], (epoch << 32) | rank[c])
                            rq_size[dd] += 1
    if record and next_ck > 0 and matched < 0:
        for d in range(D):
            ck_seg[next_ck - 1, d] = seg[d]
    sc[0] = n_ev
    sc[1] = n_x
    sc[3] = epoch
    if record:
        sc[2] = next_ck
    return makespan, matched
