"""``links.send = "workers"`` compiled: TensorFlow's run queue, one compute thread per device.

The same rules, event for event, as :func:`placetool.costmodel.workers.simulate_workers`
(the reference; ``tests/test_workers.py`` holds the two bit for bit on random graphs).
Each device's three queues are linked lists through one ``nxt`` array, since a task sits
in at most one queue at a time: ``urgent`` and ``back`` first in, first out, ``front`` a
stack. Task ids: an op is itself, a transfer's request, handler, ``_Send`` and receipt
are ``n + x``, ``n + X + x``, ``n + 2X + x`` and ``n + 3X + x``. Events are a binary heap on
(time, sequence number), as the reference's ``heapq`` orders them.
"""

from __future__ import annotations

import numpy as np
from numba import njit

TASK_END, REQUEST_IN, RESPONSE_IN = 0, 1, 2


@njit(cache=True, inline="always")
def _less(ht, hs, i, j):
    return ht[i] < ht[j] or (ht[i] == ht[j] and hs[i] < hs[j])


@njit(cache=True, inline="always")
def _swap(ht, hs, hk, ha, i, j):
    ht[i], ht[j] = ht[j], ht[i]
    hs[i], hs[j] = hs[j], hs[i]
    hk[i], hk[j] = hk[j], hk[i]
    ha[i], ha[j] = ha[j], ha[i]


@njit(cache=True)
def _push(ht, hs, hk, ha, size, t, s, k, a):
    i = size
    ht[i], hs[i], hk[i], ha[i] = t, s, k, a
    while i > 0:
        parent = (i - 1) // 2
        if _less(ht, hs, i, parent):
            _swap(ht, hs, hk, ha, i, parent)
            i = parent
        else:
            break
    return size + 1


@njit(cache=True)
def _pop(ht, hs, hk, ha, size):
    """Move the least event to slot ``size - 1`` and restore the heap on the rest."""
    last = size - 1
    _swap(ht, hs, hk, ha, 0, last)
    i = 0
    while True:
        left, right, best = 2 * i + 1, 2 * i + 2, i
        if left < last and _less(ht, hs, left, best):
            best = left
        if right < last and _less(ht, hs, right, best):
            best = right
        if best == i:
            break
        _swap(ht, hs, hk, ha, i, best)
        i = best
    return last


@njit(cache=True, nogil=True)
def simulate(n, n_tensors, edge_src, edge_dst, edge_tensor, tensor_bytes, out_bytes, op_us, p, lat, bw, costs,
             op_start, op_end, busy, peak, x_prod, x_tensor, x_dst, x_issue, x_resp, x_arr):
    """One step of placement ``p`` (int32 per op) with op times ``op_us`` (per op, on its
    device); ``costs`` (5, D): request, handler, encode per byte, arrival, decode per byte.
    Writes op_start/op_end, busy and peak (live bytes, parameters not counted) per device,
    and the transfers' fields (arrays sized by the edge count); returns the transfer count."""
    D = lat.shape[0]
    E = edge_src.shape[0]
    # --- transfers, one per (tensor, destination) / (control producer, destination), by first edge
    head_t = np.full(n_tensors, -1, np.int64)
    head_c = np.full(n, -1, np.int64)
    chain = np.empty(E, np.int64)
    x_first = np.empty(E, np.int64)
    x_ncons = np.zeros(E, np.int64)
    edge_x = np.full(E, -1, np.int64)
    succ_deg = np.zeros(n, np.int64)  # local consumers and _Sends per op
    missing = np.zeros(n, np.int64)
    X = 0
    for e in range(E):
        s, d, t = edge_src[e], edge_dst[e], edge_tensor[e]
        missing[d] += 1
        if p[s] == p[d]:
            succ_deg[s] += 1
            continue
        h = head_t[t] if t >= 0 else head_c[s]
        x = h
        while x >= 0 and x_dst[x] != p[d]:
            x = chain[x]
        if x < 0:
            x = X
            X += 1
            succ_deg[s] += 1
            x_prod[x], x_tensor[x], x_dst[x] = s, t, p[d]
            x_first[x] = d
            chain[x] = h
            if t >= 0:
                head_t[t] = x
            else:
                head_c[s] = x
        x_ncons[x] += 1
        x_first[x] = min(x_first[x], d)
        edge_x[e] = x
    nbytes = np.zeros(X, np.int64)
    for x in range(X):
        if x_tensor[x] >= 0:
            nbytes[x] = tensor_bytes[x_tensor[x]]
    # CSR in edge order: what an op's end makes ready (a local consumer as itself, a
    # transfer's _Send at its first edge as its task id), consumers per transfer
    succ_ptr = np.zeros(n + 1, np.int64)
    for i in range(n):
        succ_ptr[i + 1] = succ_ptr[i] + succ_deg[i]
    succ = np.empty(succ_ptr[n], np.int64)
    cons_ptr = np.zeros(X + 1, np.int64)
    for x in range(X):
        cons_ptr[x + 1] = cons_ptr[x] + x_ncons[x]
    cons = np.empty(cons_ptr[X], np.int64)
    fill_l = succ_ptr[:n].copy()
    fill_c = cons_ptr[:X].copy()
    listed = np.zeros(X, np.bool_)
    holders = np.zeros(n, np.int64)
    in_ptr = np.zeros(n + 1, np.int64)  # local data producers per consumer
    copies_deg = np.zeros(n, np.int64)
    for e in range(E):
        s, d, x = edge_src[e], edge_dst[e], edge_x[e]
        if x < 0:
            succ[fill_l[s]] = d
            fill_l[s] += 1
            if edge_tensor[e] >= 0:
                holders[s] += 1
                in_ptr[d + 1] += 1
        else:
            if not listed[x]:
                listed[x] = True
                succ[fill_l[s]] = n + 2 * X + x
                fill_l[s] += 1
            cons[fill_c[x]] = d
            fill_c[x] += 1
            if x_tensor[x] >= 0:
                copies_deg[d] += 1
    for i in range(n):
        in_ptr[i + 1] += in_ptr[i]
    inputs = np.empty(in_ptr[n], np.int64)
    fill_i = in_ptr[:n].copy()
    for e in range(E):
        s, d = edge_src[e], edge_dst[e]
        if edge_x[e] < 0 and edge_tensor[e] >= 0:
            inputs[fill_i[d]] = s
            fill_i[d] += 1
    copy_ptr = np.zeros(n + 1, np.int64)
    for i in range(n):
        copy_ptr[i + 1] = copy_ptr[i] + copies_deg[i]
    copies = np.empty(copy_ptr[n], np.int64)
    fill_k = copy_ptr[:n].copy()
    copy_holders = np.zeros(X, np.int64)
    for x in range(X):
        if x_tensor[x] >= 0:
            holders[x_prod[x]] += 1
            copy_holders[x] = x_ncons[x]
            for j in range(cons_ptr[x], cons_ptr[x + 1]):
                c = cons[j]
                copies[fill_k[c]] = x
                fill_k[c] += 1

    # --- queues
    M = n + 4 * X
    nxt = np.full(M, -1, np.int64)
    uh = np.full(D, -1, np.int64)
    ut = np.full(D, -1, np.int64)
    fh = np.full(D, -1, np.int64)
    bh = np.full(D, -1, np.int64)
    bt = np.full(D, -1, np.int64)
    running = np.zeros(D, np.bool_)
    live = np.zeros(D, np.int64)
    produced = np.zeros(X, np.bool_)  # the _Send has run
    handled = np.zeros(X, np.bool_)
    for d in range(D):
        busy[d] = 0.0
        peak[d] = 0
    for i in range(n):
        op_start[i] = 0.0
        op_end[i] = 0.0
    for x in range(X):
        x_issue[x] = np.nan
        x_resp[x] = np.nan
        x_arr[x] = np.nan
    # roots in node order, pushed so that the last is taken first
    n_roots = 0
    for i in range(n):
        if missing[i] == 0:
            n_roots += 1
    keys = np.empty(n_roots + X, np.int64)
    rtask = np.empty(n_roots + X, np.int64)
    k = 0
    for i in range(n):
        if missing[i] == 0:
            keys[k] = 2 * i * (X + 1)
            rtask[k] = i
            k += 1
    for x in range(X):
        keys[k] = (2 * x_first[x] - 1) * (X + 1) + x
        rtask[k] = n + x
        k += 1
    for j in np.argsort(keys):
        task = rtask[j]
        d = p[task] if task < n else x_dst[task - n]
        nxt[task] = fh[d]
        fh[d] = task

    cap = D + 2 * X + 1
    ht = np.empty(cap, np.float64)
    hs = np.empty(cap, np.int64)
    hk = np.empty(cap, np.int64)
    ha = np.empty(cap, np.int64)
    size, seq = 0, 0
    for d in range(D):
        size, seq = _start(d, 0.0, n, X, p, op_us, out_bytes, nbytes, x_prod, x_dst, costs, nxt, uh, ut, fh, bh, bt,
                           running, live, peak, busy, op_start, op_end, produced, handled, ht, hs, hk, ha, size, seq)
    while size > 0:
        last = _pop(ht, hs, hk, ha, size)
        size = last
        now, kind, a = ht[last], hk[last], ha[last]
        if kind == TASK_END:
            task = a
            if task < n:
                d = p[task]
            elif (task - n) // X == 0 or (task - n) // X == 3:  # a request or a receipt: the receiver's
                d = x_dst[(task - n) % X]
            else:
                d = p[x_prod[(task - n) % X]]
            running[d] = False
            if task < n:
                i = task
                for j in range(succ_ptr[i], succ_ptr[i + 1]):
                    c = succ[j]
                    if c < n:
                        missing[c] -= 1
                        if missing[c] > 0:
                            continue
                    nxt[c] = fh[d]
                    fh[d] = c
                if holders[i] == 0:
                    live[d] -= out_bytes[i]
                for j in range(in_ptr[i], in_ptr[i + 1]):
                    q = inputs[j]
                    holders[q] -= 1
                    if holders[q] == 0:
                        live[p[q]] -= out_bytes[q]
                for j in range(copy_ptr[i], copy_ptr[i + 1]):
                    x = copies[j]
                    copy_holders[x] -= 1
                    if copy_holders[x] == 0:
                        live[d] -= nbytes[x]
            else:
                tk, x = (task - n) // X, (task - n) % X
                if tk == 0:
                    x_issue[x] = now
                    seq += 1
                    size = _push(ht, hs, hk, ha, size, now + lat[d, p[x_prod[x]]], seq, REQUEST_IN, x)
                elif tk == 2 and not handled[x]:
                    produced[x] = True
                elif tk == 2 or (tk == 1 and produced[x]):
                    produced[x] = True
                    s = p[x_prod[x]]
                    x_resp[x] = now
                    x_arr[x] = now + lat[s, x_dst[x]] + nbytes[x] / bw[s, x_dst[x]]
                    live[x_dst[x]] += nbytes[x]
                    if live[x_dst[x]] > peak[x_dst[x]]:
                        peak[x_dst[x]] = live[x_dst[x]]
                    seq += 1
                    size = _push(ht, hs, hk, ha, size, x_arr[x], seq, RESPONSE_IN, x)
                elif tk == 3:
                    for j in range(cons_ptr[x], cons_ptr[x + 1]):
                        c = cons[j]
                        missing[c] -= 1
                        if missing[c] == 0:
                            _fifo_push(nxt, bh, bt, d, c)
        elif kind == REQUEST_IN:
            x = a
            d = p[x_prod[x]]
            _fifo_push(nxt, bh, bt, d, n + X + x)
        else:
            x = a
            d = x_dst[x]
            if x_tensor[x] >= 0:
                q = x_prod[x]
                holders[q] -= 1
                if holders[q] == 0:
                    live[p[q]] -= out_bytes[q]
            if costs[3, d] != 0.0 or costs[4, d] != 0.0:
                _fifo_push(nxt, uh, ut, d, n + 3 * X + x)
            else:
                for j in range(cons_ptr[x], cons_ptr[x + 1]):
                    c = cons[j]
                    missing[c] -= 1
                    if missing[c] == 0:
                        _fifo_push(nxt, bh, bt, d, c)
        size, seq = _start(d, now, n, X, p, op_us, out_bytes, nbytes, x_prod, x_dst, costs, nxt, uh, ut, fh, bh, bt,
                           running, live, peak, busy, op_start, op_end, produced, handled, ht, hs, hk, ha, size, seq)
    return X


@njit(cache=True, inline="always")
def _fifo_push(nxt, head, tail, d, task):
    nxt[task] = -1
    if tail[d] < 0:
        head[d] = task
    else:
        nxt[tail[d]] = task
    tail[d] = task


@njit(cache=True)
def _start(d, now, n, X, p, op_us, out_bytes, nbytes, x_prod, x_dst, costs, nxt, uh, ut, fh, bh, bt,
           running, live, peak, busy, op_start, op_end, produced, handled, ht, hs, hk, ha, size, seq):
    """Device ``d``'s thread, if free, takes its next task: urgent, then front, then back."""
    if running[d]:
        return size, seq
    if uh[d] >= 0:
        task = uh[d]
        uh[d] = nxt[task]
        if uh[d] < 0:
            ut[d] = -1
    elif fh[d] >= 0:
        task = fh[d]
        fh[d] = nxt[task]
    elif bh[d] >= 0:
        task = bh[d]
        bh[d] = nxt[task]
        if bh[d] < 0:
            bt[d] = -1
    else:
        return size, seq
    if task < n:
        dur = op_us[task]
        op_start[task] = now
        op_end[task] = now + dur
        live[d] += out_bytes[task]
        if live[d] > peak[d]:
            peak[d] = live[d]
    else:
        kind, x = (task - n) // X, (task - n) % X
        s = p[x_prod[x]]
        if kind == 0:
            dur = costs[0, x_dst[x]]
        elif kind == 1:
            dur = costs[1, s] + (costs[2, s] * nbytes[x] if produced[x] else 0.0)
            if not produced[x]:
                handled[x] = True
        elif kind == 2:
            dur = costs[2, s] * nbytes[x] if handled[x] else 0.0
        else:
            dur = costs[3, x_dst[x]] + costs[4, x_dst[x]] * nbytes[x]
    running[d] = True
    busy[d] += dur
    seq += 1
    size = _push(ht, hs, hk, ha, size, now + dur, seq, TASK_END, task)
    return size, seq


def graph_arrays(graph) -> tuple:
    """The graph's part of :func:`simulate`'s arguments, contiguous and typed."""
    c = np.ascontiguousarray
    return (graph.n_ops, graph.n_tensors, c(graph.edge_src, np.int64), c(graph.edge_dst, np.int64),
            c(graph.edge_tensor, np.int64), c(graph.tensor_bytes, np.int64), c(graph.out_bytes, np.int64))


def run_arrays(arrays, op_us, placement, latency_us, bandwidth, costs) -> tuple:
    """:func:`simulate` on :func:`graph_arrays`' ``arrays``: (op_start, op_end, busy,
    peak, x_prod, x_tensor, x_dst, x_issue, x_resp, x_arr), the transfer arrays cut to
    their count."""
    n, E, D = arrays[0], len(arrays[2]), len(latency_us)
    op_start, op_end = np.empty(n), np.empty(n)
    busy, peak = np.empty(D), np.empty(D, np.int64)
    xs = [np.empty(E, np.int64) for _ in range(3)] + [np.empty(E) for _ in range(3)]
    X = simulate(*arrays, np.ascontiguousarray(op_us, np.float64), np.ascontiguousarray(placement, np.int64),
                 np.ascontiguousarray(latency_us, np.float64), np.ascontiguousarray(bandwidth, np.float64),
                 np.ascontiguousarray(costs, np.float64), op_start, op_end, busy, peak, *xs)
    return (op_start, op_end, busy, peak) + tuple(a[:X] for a in xs)


def run(graph, op_us, placement, latency_us, bandwidth, costs) -> tuple:
    """:func:`run_arrays` on a graph."""
    return run_arrays(graph_arrays(graph), op_us, placement, latency_us, bandwidth, costs)
