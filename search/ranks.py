"""HEFT's and CPOP's ranks of ops (Topcuoglu et al. 2002): the longest path to the exit
(upward) and from the entry (downward), at mean compute and communication costs."""

from __future__ import annotations

import numpy as np
from numba import njit


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
