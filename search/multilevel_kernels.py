"""Compiled kernels of the multilevel search (:mod:`placetool.search.multilevel`):
heavy-edge matching of the group graph and the cluster-sticky topological order whose
runs become the coarse graph's ops.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .heaps import heap_pop, heap_push


@njit(cache=True)
def heavy_edge_matching(xadj, adjncy, ew, order, pattern, vw, vmem, lo, hi, max_vw, max_mem, max_span):
    """One round of heavy-edge matching, as METIS coarsens: vertices in ``order``, each
    unmatched one paired with its unmatched neighbour of the heaviest edge (ties: the
    lighter neighbour) whose allowed-device ``pattern`` is the same, whose summed
    weight ``vw`` and memory ``vmem`` stay within ``max_vw`` and ``max_mem``, and whose
    span in time together (from the lesser ``lo`` to the greater ``hi``) is at most
    ``max_span``.

    Returns (cluster id per vertex, number of clusters); ids follow the lowest vertex of
    each cluster, so they keep the vertices' order.
    """
    n = xadj.shape[0] - 1
    mate = np.full(n, -1, np.int64)
    for i in range(order.shape[0]):
        v = order[i]
        if mate[v] >= 0:
            continue
        best = -1
        bw = -1.0
        for k in range(xadj[v], xadj[v + 1]):
            u = adjncy[k]
            if u == v or mate[u] >= 0 or pattern[u] != pattern[v]:
                continue
            if vw[u] + vw[v] > max_vw or vmem[u] + vmem[v] > max_mem:
                continue
            if max(hi[u], hi[v]) - min(lo[u], lo[v]) > max_span:
                continue
            if ew[k] > bw or (ew[k] == bw and best >= 0 and vw[u] < vw[best]):
                bw = ew[k]
                best = u
        if best >= 0:
            mate[v] = best
            mate[best] = v
        else:
            mate[v] = v
    cid = np.full(n, -1, np.int64)
    c = 0
    for v in range(n):
        if cid[v] < 0:
            cid[v] = c
            cid[mate[v]] = c
            c += 1
    return cid, c


@njit(cache=True)
def sticky_segments(rank, succ_ptr, succ, n_pred, cluster, n_clusters, w, tau):
    """Cut the ops into runs that become the coarse graph's ops: a topological order
    that stays in the current op's cluster while the cluster has a ready op (its lowest
    ``rank`` first), else takes the ready op of lowest rank anywhere; a new run starts
    where the cluster changes or where the run's work ``w`` would pass ``tau``.

    Every edge goes from a run to itself or to a later one, so the runs, numbered in
    order, form a DAG whatever the clusters are. Returns (run per op, number of runs).
    """
    n = rank.shape[0]
    indeg = n_pred.astype(np.int64).copy()
    count = np.zeros(n_clusters + 1, np.int64)
    for v in range(n):
        count[cluster[v] + 1] += 1
    base = np.cumsum(count)  # cluster c's heap lives in [base[c], base[c + 1])
    # heaps of (rank, op) -> op: ranks are distinct, so the op is only the heaps' tie key
    ckeys = np.empty(n, np.int64)
    cties = np.empty(n, np.int64)
    cvals = np.empty(n, np.int64)
    csize = np.zeros(n_clusters, np.int64)
    gkeys = np.empty(n, np.int64)
    gties = np.empty(n, np.int64)
    gvals = np.empty(n, np.int64)
    gsize = 0
    done = np.zeros(n, np.bool_)
    seg = np.full(n, -1, np.int64)
    for v in range(n):
        if indeg[v] == 0:
            gsize = heap_push(gkeys, gties, gvals, gsize, rank[v], v, v)
            c = cluster[v]
            b = base[c]
            csize[c] = heap_push(ckeys[b:], cties[b:], cvals[b:], csize[c], rank[v], v, v)
    cur = -1
    nseg = 0
    segw = 0.0
    for _ in range(n):
        v = -1
        if cur >= 0:
            # each op sits in both heaps; the one it was taken from second is skipped
            b = base[cur]
            while csize[cur] > 0:
                u = cvals[b]
                csize[cur] = heap_pop(ckeys[b:], cties[b:], cvals[b:], csize[cur])
                if not done[u]:
                    v = u
                    break
        while v < 0 and gsize > 0:
            u = gvals[0]
            gsize = heap_pop(gkeys, gties, gvals, gsize)
            if not done[u]:
                v = u
        if v < 0:
            break  # a cycle: the caller checks every op got a run
        c = cluster[v]
        if c != cur or (segw > 0.0 and segw + w[v] > tau):
            nseg += 1
            segw = 0.0
            cur = c
        seg[v] = nseg - 1
        segw += w[v]
        done[v] = True
        for k in range(succ_ptr[v], succ_ptr[v + 1]):
            u = succ[k]
            indeg[u] -= 1
            if indeg[u] == 0:
                gsize = heap_push(gkeys, gties, gvals, gsize, rank[u], u, u)
                cu = cluster[u]
                b = base[cu]
                csize[cu] = heap_push(ckeys[b:], cties[b:], cvals[b:], csize[cu], rank[u], u, u)
    return seg, nseg
