"""The engine's entry points: a full run, a batch's rows, an incremental run, and the
small kernels around them (placement checks, peak memory, the critical path)."""

from __future__ import annotations

import numpy as np
from numba import njit

from .loop import _run
from .state import SC_N_X, SF_MAKESPAN, U64, init_fresh


@njit(cache=True, error_model="numpy")
def simulate_full(net, w, placement, trace):
    """Simulate one placement from scratch; returns (makespan, n_transfers), or
    (inf, 0) if some op has no kernel on its device. Busy time and live peak are left
    in ``w``; with ``trace``, also op and link start and end, and in ``w.x_task`` the
    send and receive tasks that ran, over whatever it held before (fill it with NaN
    first)."""
    init_fresh(net, w, placement)
    for op in range(placement.shape[0]):
        if not np.isfinite(w.tp[op]):
            return np.inf, 0
    _run(net, w, None, None, placement, np.zeros(0, np.intp), -1, 0, False, 1, False, False, trace)
    return w.sf[SF_MAKESPAN], w.sc[SC_N_X]


@njit(cache=True)
def placement_violation(placement, op_group_first, T):
    """(first op not on its group's device, first op without a kernel on its device), -1 if none."""
    split = -1
    nok = -1
    for op in range(placement.shape[0]):
        if split < 0 and placement[op] != placement[U64(op_group_first[op])]:
            split = op
        if nok < 0 and not np.isfinite(T[op, U64(placement[op])]):
            nok = op
    return split, nok


@njit(cache=True)
def device_peak(livepeak, placement, param_bytes):
    """Peak memory per device: its parameters plus its peak live bytes."""
    peak = livepeak.copy()
    for op in range(placement.shape[0]):
        peak[U64(placement[op])] += param_bytes[op]
    return peak


@njit(cache=True, error_model="numpy", nogil=True)
def simulate_rows(net, w, placements, params, step, busy, peak, first, stride):
    """Simulate rows ``first``, ``first + stride``, ... of ``placements`` with the workspace
    ``w``; fills their step, busy and peak (``params``: parameter bytes per op). Threads
    share a batch between them by ``first`` (the GIL is released)."""
    B, n = placements.shape
    D = net.T.shape[1]
    # no trace, as a value LLVM cannot fold: with a literal False it inlines the whole
    # loop here and compiles it again
    trace = stride < 0
    for b in range(first, B, stride):
        ms, _ = simulate_full(net, w, placements[b], trace)
        step[b] = ms
        for d in range(D):
            busy[b, d] = w.busy[d]
            peak[b, d] = w.livepeak[d]
        for op in range(n):
            peak[b, placements[b, op]] += params[op]


@njit(cache=True, error_model="numpy", nogil=True)
def run_incremental(net, w, ck, base, placement, moved_ops, start_ck, n_ck, record, every, check):
    """Run on from the state in ``w`` (a fresh start or a restored checkpoint); see
    :func:`_run`. Returns the matched checkpoint or -1."""
    return _run(net, w, ck, base, placement, moved_ops, start_ck, n_ck, record, every, check, True, False)


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
