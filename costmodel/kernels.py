"""Numba kernels of the critical-path simulator.

Same semantics as :mod:`placetool.costmodel.reference` (read its docstring), bit for bit. Only
arrays go in and out: the graph as CSR arrays (:class:`placetool.costmodel.graph.GraphCSR`),
op times ``T[op, device]``, link matrices and the placement. Heaps are arrays of ints
ordered by a parallel key array; the per-device ready heaps share one buffer, sliced by
how many ops each device holds.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

# Event kinds, in the order events of one instant are handled (see reference.py).
OP_DONE = 0
SEND_DONE = 1
XFER_DONE = 2
RECV_DONE = 3


# --------------------------------------------------------------------- heaps
@njit(cache=True, inline="always")
def _less(ta, ka, tb, kb):
    return ta < tb or (ta == tb and ka < kb)


@njit(cache=True, inline="always")
def heap_push(ev_t, ev_k, ev_id, size, t, k, i):
    """Push (t, k) -> i onto a min-heap ordered by (t, k) in three parallel arrays; returns the new size."""
    j = size
    while j > 0:
        parent = (j - 1) >> 1
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


@njit(cache=True, inline="always")
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


@njit(cache=True, inline="always")
def keyheap_push(heap, base, size, key):
    """Push an int64 key onto a device's ready heap heap[base:base+size] (a min-heap)."""
    j = size
    while j > 0:
        parent = (j - 1) >> 1
        q = heap[base + parent]
        if key < q:
            heap[base + j] = q
            j = parent
        else:
            break
    heap[base + j] = key


@njit(cache=True, inline="always")
def keyheap_pop(heap, base, size):
    """Pop the smallest key of a device's ready heap (``size`` is the size before popping)."""
    top = heap[base]
    size -= 1
    last = heap[base + size]
    j = 0
    while True:
        c = 2 * j + 1
        if c >= size:
            break
        a = heap[base + c]
        if c + 1 < size:
            b = heap[base + c + 1]
            if b < a:
                c += 1
                a = b
        if a < last:
            heap[base + j] = a
            j = c
        else:
            break
    if size > 0:
        heap[base + j] = last
    return top


# ------------------------------------------------------------------ simulator
@njit(cache=True, error_model="numpy")
def simulate_into(
    placement, T, rank, topo_order, out_bytes, param_bytes, tensor_op, tensor_bytes,
    op_tensor_ptr, tensor_ptr, tensor_cons, ctrl_ptr, ctrl_dst, in_ptr, in_tensor, n_inputs,
    latency, bandwidth, xcost,
    op_start, op_end, busy, peak,
    x_tensor, x_src, x_dst, x_start, x_end, x_task,
):
    """Simulate one placement; fills the output arrays and returns (makespan, n_transfers).

    ``xcost`` is the cluster's (4, D) send/receive costs. ``x_*`` arrays need room for
    one transfer per data edge; ``x_task[x]`` gets the send task's start and end and the
    receive task's (NaN for a skipped stage). Returns makespan ``inf`` (and leaves the
    outputs partial) if some op has no kernel on its device.
    """
    n = placement.shape[0]
    D = T.shape[1]
    nt = tensor_op.shape[0]
    n_data = tensor_cons.shape[0]

    for d in range(D):
        busy[d] = 0.0
        peak[d] = 0
    for op in range(n):
        if not np.isfinite(T[op, placement[op]]):
            return np.inf, 0

    mem = np.zeros(D, np.int64)
    for op in range(n):
        mem[placement[op]] += param_bytes[op]
    for d in range(D):
        peak[d] = mem[d]

    # ready heaps: one slice of rq per device
    count = np.zeros(D, np.int64)
    for op in range(n):
        count[placement[op]] += 1
    rq_base = np.zeros(D, np.int64)
    for d in range(1, D):
        rq_base[d] = rq_base[d - 1] + count[d - 1]
    rq = np.empty(max(n, 1), np.int64)
    rq_size = np.zeros(D, np.int64)
    # Ready keys are (epoch << 32) | rank, the epoch counting distinct event times so far.
    # Ready times only grow, so (epoch, rank) orders exactly like (ready time, rank),
    # with one int64 comparison and no indirection.
    low = np.int64(0xFFFFFFFF)
    epoch = np.int64(0)
    running = np.zeros(D, np.bool_)

    missing = n_inputs.copy()
    out_refs = np.zeros(n, np.int64)
    x_refs = np.zeros(max(n_data, 1), np.int64)
    x_next = np.full(max(n_data, 1), -1, np.int64)
    copy_of = np.full(nt * D, -1, np.int64)
    n_x = 0

    L = D * D
    link_head = np.full(L, -1, np.int64)
    link_tail = np.full(L, -1, np.int64)
    link_busy = np.zeros(L, np.bool_)
    link_pending = np.zeros(L, np.bool_)
    pending = np.empty(L, np.int64)
    n_pending = 0

    # send/receive tasks: per device a heap of (ready epoch << 32 | producer rank,
    # (tensor * D + destination) * 2 + kind - 1) -> transfer * 2 + kind - 1, sliced from one
    # buffer by the most tasks each device can get (its ops' data edges out and in)
    tq_base = np.zeros(D + 1, np.int64)
    for op in range(n):
        d = placement[op]
        for t in range(op_tensor_ptr[op], op_tensor_ptr[op + 1]):
            tq_base[d + 1] += tensor_ptr[t + 1] - tensor_ptr[t]
        tq_base[d + 1] += in_ptr[op + 1] - in_ptr[op]
    for d in range(D):
        tq_base[d + 1] += tq_base[d]
    tq_k1 = np.empty(max(tq_base[D], 1), np.int64)
    tq_k2 = np.empty(max(tq_base[D], 1), np.int64)
    tq_id = np.empty(max(tq_base[D], 1), np.int64)
    tq_size = np.zeros(D, np.int64)

    cap = n + 3 * n_data + 1
    ev_t = np.empty(cap, np.float64)
    ev_k = np.empty(cap, np.int64)
    ev_id = np.empty(cap, np.int64)
    n_ev = 0
    key_span = np.int64(max(n, n_data) + 1)

    for op in range(n):
        if missing[op] == 0:
            d = placement[op]
            keyheap_push(rq, rq_base[d], rq_size[d], np.int64(rank[op]))
            rq_size[d] += 1

    now = 0.0
    makespan = 0.0
    while True:
        # ---- dispatch: idle devices start their best ready op, idle links their oldest transfer
        for d in range(D):
            if running[d]:
                continue
            if tq_size[d] > 0 and (rq_size[d] == 0 or tq_k1[tq_base[d]] < rq[rq_base[d]]):
                b0 = tq_base[d]
                task = tq_id[b0]
                tq_size[d] = heap_pop(tq_k1[b0:], tq_k2[b0:], tq_id[b0:], tq_size[d])
                x = task >> 1
                b = tensor_bytes[x_tensor[x]]
                if task & 1:
                    dur = xcost[2, d] + b * xcost[3, d]
                else:
                    dur = xcost[0, d] + b * xcost[1, d]
                running[d] = True
                busy[d] += dur
                x_task[x, 2 * (task & 1)] = now
                x_task[x, 2 * (task & 1) + 1] = now + dur
                n_ev = heap_push(ev_t, ev_k, ev_id, n_ev, now + dur,
                                 (SEND_DONE + 2 * (task & 1)) * key_span + x, x)
            elif rq_size[d] > 0:
                op = topo_order[keyheap_pop(rq, rq_base[d], rq_size[d]) & low]
                rq_size[d] -= 1
                running[d] = True
                op_start[op] = now
                end = now + T[op, d]
                op_end[op] = end
                busy[d] += T[op, d]
                mem[d] += out_bytes[op]
                if mem[d] > peak[d]:
                    peak[d] = mem[d]
                n_ev = heap_push(ev_t, ev_k, ev_id, n_ev, end, OP_DONE * key_span + rank[op], op)
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
                x_start[x] = now
                x_end[x] = now + (latency[s, dd] + b / bandwidth[s, dd])
                mem[dd] += b
                if mem[dd] > peak[dd]:
                    peak[dd] = mem[dd]
                n_ev = heap_push(ev_t, ev_k, ev_id, n_ev, x_end[x], XFER_DONE * key_span + x, x)
        n_pending = 0

        if n_ev == 0:
            break
        # ---- handle every event of the next instant
        if ev_t[0] > now:
            epoch += 1
        now = ev_t[0]
        while n_ev > 0 and ev_t[0] == now:
            kind_key = ev_k[0]
            i = ev_id[0]
            n_ev = heap_pop(ev_t, ev_k, ev_id, n_ev)
            if kind_key < key_span:  # an op finished
                op = i
                d = placement[op]
                running[d] = False
                if now > makespan:
                    makespan = now
                for e in range(in_ptr[op], in_ptr[op + 1]):
                    t = in_tensor[e]
                    prod = tensor_op[t]
                    if placement[prod] == d:
                        out_refs[prod] -= 1
                        if out_refs[prod] == 0:
                            mem[d] -= out_bytes[prod]
                    else:
                        x = copy_of[t * D + d]
                        x_refs[x] -= 1
                        if x_refs[x] == 0:
                            mem[d] -= tensor_bytes[t]
                refs = 0
                for t in range(op_tensor_ptr[op], op_tensor_ptr[op + 1]):
                    for e in range(tensor_ptr[t], tensor_ptr[t + 1]):
                        c = tensor_cons[e]
                        dc = placement[c]
                        if dc == d:
                            refs += 1
                            missing[c] -= 1
                            if missing[c] == 0:
                                keyheap_push(rq, rq_base[dc], rq_size[dc], (epoch << 32) | rank[c])
                                rq_size[dc] += 1
                        elif copy_of[t * D + dc] >= 0:
                            x_refs[copy_of[t * D + dc]] += 1
                        else:
                            x = n_x
                            n_x += 1
                            copy_of[t * D + dc] = x
                            x_tensor[x] = t
                            x_src[x] = d
                            x_dst[x] = dc
                            x_refs[x] = 1
                            x_next[x] = -1
                            for k in range(4):
                                x_task[x, k] = np.nan
                            refs += 1
                            b = tensor_bytes[t]
                            if xcost[0, d] + b * xcost[1, d] != 0.0:
                                b0 = tq_base[d]
                                tq_size[d] = heap_push(tq_k1[b0:], tq_k2[b0:], tq_id[b0:], tq_size[d],
                                                       (epoch << 32) | rank[op], (t * D + dc) * 2, x * 2)
                                continue
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
                for e in range(ctrl_ptr[op], ctrl_ptr[op + 1]):
                    c = ctrl_dst[e]
                    missing[c] -= 1
                    if missing[c] == 0:
                        dc = placement[c]
                        keyheap_push(rq, rq_base[dc], rq_size[dc], (epoch << 32) | rank[c])
                        rq_size[dc] += 1
                out_refs[op] = refs
                if refs == 0:
                    mem[d] -= out_bytes[op]
            elif kind_key < 2 * key_span:  # a send task ended: the transfer joins its link's queue
                x = i
                s = x_src[x]
                running[s] = False
                l = s * D + x_dst[x]
                if link_tail[l] >= 0:
                    x_next[link_tail[l]] = x
                else:
                    link_head[l] = x
                link_tail[l] = x
                if not link_pending[l]:
                    link_pending[l] = True
                    pending[n_pending] = l
                    n_pending += 1
            elif kind_key < 3 * key_span:  # a link transfer ended
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
                if out_refs[prod] == 0:
                    mem[s] -= out_bytes[prod]
                b = tensor_bytes[t]
                if xcost[2, dd] + b * xcost[3, dd] != 0.0:
                    b0 = tq_base[dd]
                    tq_size[dd] = heap_push(tq_k1[b0:], tq_k2[b0:], tq_id[b0:], tq_size[dd],
                                            (epoch << 32) | rank[prod], (t * D + dd) * 2 + 1, x * 2 + 1)
                    continue
                for e in range(tensor_ptr[t], tensor_ptr[t + 1]):
                    c = tensor_cons[e]
                    if placement[c] == dd:
                        missing[c] -= 1
                        if missing[c] == 0:
                            keyheap_push(rq, rq_base[dd], rq_size[dd], (epoch << 32) | rank[c])
                            rq_size[dd] += 1
            else:  # a receive task ended: the tensor is on its destination
                x = i
                t = x_tensor[x]
                dd = x_dst[x]
                running[dd] = False
                for e in range(tensor_ptr[t], tensor_ptr[t + 1]):
                    c = tensor_cons[e]
                    if placement[c] == dd:
                        missing[c] -= 1
                        if missing[c] == 0:
                            keyheap_push(rq, rq_base[dd], rq_size[dd], (epoch << 32) | rank[c])
                            rq_size[dd] += 1
    return makespan, n_x


@njit(cache=True, parallel=True, error_model="numpy")
def simulate_batch(
    placements, T, rank, topo_order, out_bytes, param_bytes, tensor_op, tensor_bytes,
    op_tensor_ptr, tensor_ptr, tensor_cons, ctrl_ptr, ctrl_dst, in_ptr, in_tensor, n_inputs,
    latency, bandwidth, xcost, step, busy, peak,
):
    """Simulate each row of ``placements`` in parallel; fills step, busy, peak."""
    B, n = placements.shape
    n_data = max(tensor_cons.shape[0], 1)
    for b in prange(B):
        op_start = np.empty(n, np.float64)
        op_end = np.empty(n, np.float64)
        x_tensor = np.empty(n_data, np.int64)
        x_src = np.empty(n_data, np.int64)
        x_dst = np.empty(n_data, np.int64)
        x_start = np.empty(n_data, np.float64)
        x_end = np.empty(n_data, np.float64)
        x_task = np.empty((n_data, 4), np.float64)
        ms, _ = simulate_into(
            placements[b], T, rank, topo_order, out_bytes, param_bytes, tensor_op, tensor_bytes,
            op_tensor_ptr, tensor_ptr, tensor_cons, ctrl_ptr, ctrl_dst, in_ptr, in_tensor, n_inputs,
            latency, bandwidth, xcost, op_start, op_end, busy[b], peak[b],
            x_tensor, x_src, x_dst, x_start, x_end, x_task,
        )
        step[b] = ms


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
