"""The lower bounds of ``exact`` (:mod:`placetool.search.exact`): compiled kernels over a
problem packed by :func:`make_ops`.

The bound of a partial assignment (:func:`partial_bound`) is the largest of: the earliest
the last op can end with unlimited devices, fixed ops on their devices, free ops on
whichever device ends them first, every transfer between devices paying latency + bytes
/ bandwidth, and an op's inputs from one device reaching it one after another over their
link; each device's fixed ops as one machine with those earliest starts and the least
time after each op to the end of the step (pre-emptive, so a bound); each directed link
the same way, its jobs the tensors fixed ops send to fixed consumers across it (both
link terms only where links queue); and the level all work reaches when the free work is
poured over the devices' fixed work. Each relaxes the simulator's rules, so completions
can only be slower. :func:`bound_into` computes it in scratch arrays made once
(:func:`make_work`), as the tree does at every node; the tree takes the larger of it and
the problem's own lower bound (:mod:`placetool.search.bounds`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit


class Ops(NamedTuple):
    """The problem as the bound reads it."""

    group: np.ndarray  # int64 [n]
    T: np.ndarray  # float64 [n, D]: op time, inf where the op may not go
    topo_order: np.ndarray  # int64 [n]
    out_ptr: np.ndarray  # int64 [n + 1] -> out_dst, out_comm (edges by source)
    out_dst: np.ndarray  # int64
    out_comm: np.ndarray  # float64 [edges, D, D]: the edge's transfer time from one device to
    #                      another (latency + bytes / bandwidth; 0 on one device and for control edges)
    out_src: np.ndarray  # int64: each edge's producer
    in_ptr: np.ndarray  # int64 [n + 1] -> in_edge (edges by consumer)
    in_edge: np.ndarray  # int64: index into out_src / out_comm
    fifo_links: bool  # a link carries one transfer at a time (links.queue "fifo"), else any number


def make_ops(problem) -> Ops:
    """Pack a problem's graph, op times and links for :func:`partial_bound`."""
    g, cm, cl = problem.graph, problem.cost_model, problem.cluster
    o = np.argsort(g.edge_src, kind="stable")
    src, dst = g.edge_src[o], g.edge_dst[o]
    i = np.argsort(dst, kind="stable")

    def a(x, dt):
        return np.ascontiguousarray(x, dt)

    lat, bw = cl.latency_us, cl.bandwidth_bytes_per_us
    comm = lat[None] + g.edge_bytes[o][:, None, None] / bw[None]
    comm[:, np.arange(len(lat)), np.arange(len(lat))] = 0.0
    comm[g.edge_tensor[o] < 0] = 0.0
    return Ops(
        group=a(g.group, np.int64), T=a(np.where(problem.allowed[g.group], cm.T, np.inf), np.float64),
        topo_order=a(g.topo_order, np.int64),
        out_ptr=np.searchsorted(src, np.arange(g.n_ops + 1)).astype(np.int64),
        out_dst=a(dst, np.int64), out_comm=a(comm, np.float64), out_src=a(src, np.int64),
        in_ptr=np.searchsorted(dst[i], np.arange(g.n_ops + 1)).astype(np.int64), in_edge=a(i, np.int64),
        fifo_links=cl.fifo_links,
    )


class Work(NamedTuple):
    """Scratch arrays of :func:`bound_into`, made once per tree rather than per bound."""

    F: np.ndarray  # float64 [n, D]: earliest end of each op on each device
    ready: np.ndarray  # float64 [n, D]: earliest start (heads)
    Q: np.ndarray  # float64 [n, D]: tails
    TQ: np.ndarray  # float64 [n, D]: run time plus tail
    r: np.ndarray  # float64 [n]: one device's jobs: heads, run times, tails
    p: np.ndarray
    q: np.ndarray
    rem: np.ndarray  # float64 [n]: pre-emptive schedule's remaining run times
    order: np.ndarray  # int64 [n]: jobs by release time
    load: np.ndarray  # float64 [D]
    sorted_load: np.ndarray  # float64 [D]


def make_work(n: int, D: int) -> Work:
    """Scratch arrays for bounds on a problem of ``n`` ops and ``D`` devices."""
    return Work(F=np.zeros((n, D)), ready=np.zeros((n, D)), Q=np.zeros((n, D)), TQ=np.zeros((n, D)),
                r=np.zeros(n), p=np.zeros(n), q=np.zeros(n), rem=np.zeros(n), order=np.zeros(n, np.int64),
                load=np.zeros(D), sorted_load=np.zeros(D))


@njit(cache=True)
def one_machine_bound(r, p, q, m):
    """Least makespan of ``m`` jobs on one machine with release times ``r``, times ``p``
    and tails ``q`` when jobs may be pre-empted (Jackson's rule: run the released job
    with the longest tail). No non-preemptive schedule ends earlier."""
    return _one_machine(r, p, q, m, np.empty(m, np.int64), np.empty(m))


@njit(cache=True)
def _one_machine(r, p, q, m, order, rem):
    """:func:`one_machine_bound` in the caller's scratch arrays ``order`` and ``rem``."""
    best = 0.0
    n = 0
    for i in range(m):  # insertion sort by release: a device holds few jobs here
        if p[i] <= 0.0:  # done the moment it is released, in no one's way
            best = max(best, r[i] + q[i])
            continue
        j = n
        while j > 0 and r[order[j - 1]] > r[i]:
            order[j] = order[j - 1]
            j -= 1
        order[j] = i
        rem[i] = p[i]
        n += 1
    if n == 0:
        return best
    m = n
    t = r[order[0]]
    i = 0
    left = m
    while left > 0:
        while i < m and r[order[i]] <= t:
            i += 1
        j = -1
        for k in range(i):
            jj = order[k]
            if rem[jj] > 0 and (j < 0 or q[jj] > q[j]):
                j = jj
        if j < 0:
            t = r[order[i]]
            continue
        nxt = r[order[i]] if i < m else np.inf
        if t + rem[j] <= nxt:
            t += rem[j]
            rem[j] = 0.0
            left -= 1
            if t + q[j] > best:
                best = t + q[j]
        else:
            rem[j] -= nxt - t
            t = nxt
    return best


def partial_bound(gdev, ops):
    """Lower bound on the step time of every completion of ``gdev`` (-1 = free group).

    Heads ``ready[v, d]``, the earliest v can start on d with unlimited devices (free ops
    on whichever device suits them, every transfer between devices paying latency +
    bytes / bandwidth, a fixed op's inputs from one device arriving one after another
    over their link), are a dynamic programme over the topological order; tails
    ``Q[v, d]``, the least time from v ending on d to the end of the step, the same
    programme backwards. The bound is the largest of: the latest op's earliest end; for
    each device, its fixed ops as one machine with those heads and tails
    (:func:`one_machine_bound`); for each directed link, as one machine, the transfers
    between fixed ops across it (per producer one job: released at the producer's
    earliest end, its shortest transfer there, its consumers' longest run time + tail),
    since a link carries one transfer at a time (both link terms only where links queue:
    ``links.queue = "fifo"``); and the level the devices' fixed work reaches once the free
    work (each op on its fastest device) is poured over them.
    """
    return bound_into(gdev, ops, make_work(*ops.T.shape))


@njit(cache=True)
def _link_arrivals(v, a, b, gdev, ops, F, w):
    """When the last of ``v``'s inputs from fixed producers on ``a`` can reach ``b``:
    one transfer per producer (its shortest), sent in order of the producers' earliest
    ends. (What :func:`_one_machine` gives with no tails, but called once per fixed op
    and link for one to three jobs, going through it doubled the bound's time.)"""
    group, src, comm, ptr = ops.group, ops.out_src, ops.out_comm, ops.in_ptr
    r, p, who = w.r, w.p, w.order
    m = 0
    for i in range(ptr[v], ptr[v + 1]):
        e = ops.in_edge[i]
        u = src[e]
        if gdev[group[u]] != a or comm[e, a, b] <= 0:
            continue
        j = m  # insertion by release; a producer sending twice keeps its shortest
        for x in range(m):
            if who[x] == u:
                j = -1
                p[x] = min(p[x], comm[e, a, b])
        if j < 0:
            continue
        while j > 0 and r[j - 1] > F[u, a]:
            r[j], p[j], who[j] = r[j - 1], p[j - 1], who[j - 1]
            j -= 1
        r[j], p[j], who[j] = F[u, a], comm[e, a, b], u
        m += 1
    t = 0.0
    for x in range(m):
        t = max(t, r[x]) + p[x]
    return t


@njit(cache=True)
def bound_into(gdev, ops, w):
    """:func:`partial_bound` in the scratch arrays of ``w`` (a :class:`Work`)."""
    T, group, topo, ptr, dst, comm = ops.T, ops.group, ops.topo_order, ops.out_ptr, ops.out_dst, ops.out_comm
    n, D = T.shape
    F, ready, load = w.F, w.ready, w.load
    F[:] = np.inf
    ready[:] = 0.0
    load[:] = 0.0
    best = 0.0
    free_work = 0.0
    for k in range(n):
        v = topo[k]
        dv = gdev[group[v]]
        if dv >= 0 and ops.fifo_links:  # inputs from one device to v's come over one link, one at a time
            for a in range(D):
                if a != dv:
                    ready[v, dv] = max(ready[v, dv], _link_arrivals(v, a, dv, gdev, ops, F, w))
        fmin = np.inf
        tmin = np.inf
        for d in range(D):
            if (dv >= 0 and d != dv) or not np.isfinite(T[v, d]):
                continue
            F[v, d] = ready[v, d] + T[v, d]
            fmin = min(fmin, F[v, d])
            tmin = min(tmin, T[v, d])
        if dv >= 0:
            load[dv] += T[v, dv]
        else:
            free_work += tmin
        best = max(best, fmin)
        for e in range(ptr[v], ptr[v + 1]):
            u = dst[e]
            for d in range(D):  # the input reaches d from wherever v ends first
                a = np.inf
                for d2 in range(D):
                    a = min(a, F[v, d2] + comm[e, d2, d])
                ready[u, d] = max(ready[u, d], a)
    # tails, backwards: an edge's successor u is best served on the device that ends
    # it earliest counting its transfer, run time and own tail
    Q, TQ = w.Q, w.TQ
    Q[:] = 0.0
    TQ[:] = np.inf  # T + Q where an op may go
    for k in range(n - 1, -1, -1):
        v = topo[k]
        for d in range(D):
            if not np.isfinite(F[v, d]):
                continue
            qv = 0.0
            for e in range(ptr[v], ptr[v + 1]):
                u = dst[e]
                a = np.inf
                for d2 in range(D):
                    a = min(a, TQ[u, d2] + comm[e, d, d2])
                qv = max(qv, a)
            Q[v, d] = qv
            TQ[v, d] = T[v, d] + qv
    r, p, q = w.r, w.p, w.q
    for d in range(D):
        m = 0
        for v in range(n):
            if gdev[group[v]] == d:
                r[m], p[m], q[m] = ready[v, d], T[v, d], Q[v, d]
                m += 1
        if m > 1:
            best = max(best, _one_machine(r, p, q, m, w.order, w.rem))
    # each directed link as one machine too: its jobs are the tensors a fixed op sends to
    # fixed consumers on the other end (one job per producer, its shortest transfer, the
    # longest tail of its consumers there), released when the producer can end first;
    # links that do not queue carry their transfers side by side: no machine
    for a in range(D if ops.fifo_links else 0):
        for b in range(D):
            if a == b:
                continue
            m = 0
            for v in range(n):
                if gdev[group[v]] != a:
                    continue
                pj = np.inf
                qj = 0.0
                for e in range(ptr[v], ptr[v + 1]):
                    u = dst[e]
                    if gdev[group[u]] == b and comm[e, a, b] > 0:
                        pj = min(pj, comm[e, a, b])
                        qj = max(qj, TQ[u, b])
                if pj < np.inf:
                    r[m], p[m], q[m] = F[v, a], pj, qj
                    m += 1
            if m > 1:
                best = max(best, _one_machine(r, p, q, m, w.order, w.rem))
    return max(best, _fill_level(load, free_work, w.sorted_load))


@njit(cache=True)
def fill_level(load, work):
    """The least level L with sum over devices of max(0, L - load) >= ``work``: where
    ``work`` poured over devices already holding ``load`` reaches at least."""
    return _fill_level(load, work, np.empty(load.shape[0]))


@njit(cache=True)
def _fill_level(load, work, s):
    """:func:`fill_level` with ``s`` as scratch for the sorted loads."""
    D = s.shape[0]
    s[:] = load
    s.sort()
    cum = 0.0
    level = 0.0
    for i in range(D):  # fill the i + 1 emptiest devices until the next one is reached
        cum += s[i]
        level = (work + cum) / (i + 1)
        if i + 1 == D or level <= s[i + 1]:
            break
    return level
