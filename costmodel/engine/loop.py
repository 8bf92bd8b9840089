"""The event loop: one loop for full and incremental runs, on the arrays of
:mod:`placetool.costmodel.engine.state`.

Same rules as :mod:`placetool.costmodel.reference` (read its docstring), bit for bit.
:func:`_run` handles the same events as the reference with the same steps (dispatch; op,
send, link and receive done), each a commented block naming the reference's function it
mirrors.

A full simulation is the incremental loop with no checkpoints: ``simulate_full``
(:mod:`placetool.costmodel.engine.entry`) runs :func:`_run` with the literal
``INCR=False``, which compiles the checkpoint and convergence bookkeeping away.

Every array index inside the loop is cast to unsigned (``U64(...)``, free at run time):
numba then skips its negative-index wraparound, a sign test and a reload of the array's
length at every access, which was about a third of the loop's instructions. The indices
are never negative there (sentinels such as ``-1`` are tested before they index).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .checkpoints import converged, save
from .queues import evq_push, readyq_push, readyq_sort, taskq_push, time_bits
from .state import (CKF_NEXT_T, CKI_WM, CKI_WO, LOW, RECV_US, RECV_US_PER_BYTE, SC_EPOCH, SC_N_CK, SC_N_EV, SC_N_X,
                    SEND_FIRST, SEND_LAST, SEND_US, SEND_US_PER_BYTE, SF_MAKESPAN, SF_NOW, TASK_SEND_END,
                    TASK_SEND_START, U64)

# Event kinds, in the order events of one instant are handled (see reference.py).
OP_DONE = 0
SEND_DONE = 1
XFER_DONE = 2
RECV_DONE = 3


# ------------------------------------------------------- steps the loop repeats
# Plain njit functions, which LLVM inlines into the loop (not numba's inline="always",
# which made a jump table of the loop: +11%, benchmarks/README.md). With these the loop
# counted 855.4 instructions per op on synthetic-10k and 675.6 on inception_v3
# (benchmarks/simulator.py --callgrind), against 849.1 and 675.5 written out: within
# 0.8%, so the six device marks, two link appends and three ready-queue pushes are
# written once. Devices and links are marked by the one helper (855.4 and 675.6, as
# with one for each).
@njit(cache=True)
def mark(listed, order, n, i):
    """List device or link i for the next dispatch (once): ``listed`` flags it, ``order``
    holds the n listed so far in listing order; returns the new list length."""
    if not listed[U64(i)]:
        listed[U64(i)] = True
        order[U64(n)] = i
        return n + 1
    return n


@njit(cache=True)
def link_append(x_next, link_head, link_tail, link_pending, pending, n_pending, l, x):
    """reference.to_link: transfer x joins the end of link l's queue; returns the pending-link count."""
    x_next[U64(x)] = -1
    if link_tail[U64(l)] >= 0:
        x_next[U64(link_tail[U64(l)])] = x
    else:
        link_head[U64(l)] = x
    link_tail[U64(l)] = x
    return mark(link_pending, pending, n_pending, l)


@njit(cache=True)
def ready_op(rq, rq_base, rq_size, rq_unsorted, d, key):
    """reference.input_arrived's last step: an op with all inputs joins device d's ready queue."""
    if not readyq_push(rq, rq_base[U64(d)], rq_size[U64(d)], key):
        rq_unsorted[U64(d)] = True
    rq_size[U64(d)] += 1


# ---------------------------------------------------------------- the loop
@njit(cache=True, error_model="numpy")  # as its callers: a division by zero gives inf, not an exception
def _run(net, w, ck, base, placement, moved_ops, start_ck, n_ck, record, every, check, INCR, trace):
    """Run from the state in ``w`` to the end of the step.

    With ``trace`` it records every op's and transfer's start and end (a flag tested at
    run time: one compiled loop serves both, and the test costs nothing measurable).

    With ``INCR`` (a literal): ``record`` saves a checkpoint every ``every`` events into
    the slots after ``start_ck``; ``check`` compares the state with the base run's
    checkpoints after ``start_ck`` (up to ``n_ck``) and stops at the first that matches.
    Returns the matched checkpoint or -1; the makespan is left in ``w.sf[SF_MAKESPAN]``.

    A full run passes ``ck`` and ``base`` as None and literal constants for the rest:
    numba compiles a loop per set of literals, LLVM folds the ``INCR`` tests away, and
    numba drops the blocks under ``if ck is not None`` before typing them (it prunes
    branches on an argument's None-ness, not on a literal bool), so the first full
    simulation never compiles ``save``, ``converged`` or the checkpoint makers. ``_run``
    is a function of its own rather than inlined into its callers: inlining copied its IR
    into each, which cost about 7 s of the first incremental run's compile.
    """
    rank, topo_order, out_bytes = net.rank, net.topo_order, net.out_bytes
    tensor_op, tensor_bytes, op_tensor_ptr = net.tensor_op, net.tensor_bytes, net.op_tensor_ptr
    tensor_ptr, tensor_cons, ctrl_ptr, ctrl_dst = net.tensor_ptr, net.tensor_cons, net.ctrl_ptr, net.ctrl_dst
    in_ptr, in_tensor, latency, bandwidth, xcost = net.in_ptr, net.in_tensor, net.latency, net.bandwidth, net.xcost
    has_tasks, fifo_links, idle_sends, aside_sends = net.has_tasks, net.fifo_links, net.idle_sends, net.aside_sends
    send_class = SEND_LAST if idle_sends else (SEND_FIRST if aside_sends else np.int64(0))
    lat_l, bw_l = latency.reshape(-1), bandwidth.reshape(-1)  # by link l = src * D + dst
    live, livepeak, seg, busy, running = w.live, w.livepeak, w.seg, w.busy, w.running
    rq, rq_base, rq_size = w.rq, w.rq_base, w.rq_size
    tq_k1, tq_k2, tq_id, tq_base, tq_size = w.tq_k1, w.tq_k2, w.tq_id, w.tq_base, w.tq_size
    epoch_time, missing, out_refs = w.epoch_time, w.missing, w.out_refs
    x_tensor, x_src, x_dst, x_refs, x_next, copy_of = w.x_tensor, w.x_src, w.x_dst, w.x_refs, w.x_next, w.copy_of
    link_head, link_tail, link_busy = w.link_head, w.link_tail, w.link_busy
    link_pending, pending = w.link_pending, w.pending
    ev_t, ev_k, ev_id = w.ev_t, w.ev_k, w.ev_id
    ev_b = ev_t.view(np.int64)  # event times as ordered integers (see time_bits)
    op_start, op_end, x_start, x_end, x_task, moved = w.op_start, w.op_end, w.x_start, w.x_end, w.x_task, w.moved
    dev_pending, dpend, tp, sent = w.dev_pending, w.dpend, w.tp, w.sent
    last_op, op_prev, rq_unsorted = w.last_op, w.op_prev, w.rq_unsorted

    D = live.shape[0]
    n = placement.shape[0]
    key_span = np.int64(max(n, tensor_cons.shape[0]) + 1)
    n_ev = w.sc[SC_N_EV]
    n_x = w.sc[SC_N_X]
    epoch = w.sc[SC_EPOCH]
    makespan = w.sf[SF_MAKESPAN]
    now = w.sf[SF_NOW]
    n_pending = 0
    # dispatch visits only devices that may start a task: every device first, then those
    # that fell idle or got a ready task while idle (an idle device has nothing ready
    # after a dispatch, and the order devices start in changes nothing)
    for d in range(D):
        dev_pending[d] = True
        dpend[d] = d
    n_dpend = D
    if INCR:
        # pending links are not part of a checkpoint: after a restore every link may start
        for l in range(D * D):
            link_pending[l] = False
            if not link_busy[l] and link_head[l] >= 0:
                link_pending[l] = True
                pending[n_pending] = l
                n_pending += 1
    if ck is not None:  # see the docstring: a full run's compile drops every block under this test
        ck_f = ck.f
        cap_ck = ck_f.shape[0]
        cap_ev = ck.ev_t.shape[1]
    n_moved = moved_ops.shape[0]
    n_moved_done = 0
    next_ck = start_ck + 1
    since = every if start_ck < 0 else 0
    cj = start_ck + 1  # next base checkpoint to compare against
    cj_t = np.inf  # its time: an instant before it needs no comparison
    if ck is not None and cj < n_ck:
        cj_t = ck.f[cj, CKF_NEXT_T]
    fresh = start_ck < 0  # no event handled yet
    # op-weighted sums of missing inputs and output references: a cheap first test of
    # whether two states can be equal (a restored checkpoint saved its own)
    wm = np.int64(0)
    wo = np.int64(0)
    if ck is not None:
        if start_ck >= 0:
            wm = ck.i[start_ck, CKI_WM]
            wo = ck.i[start_ck, CKI_WO]
        else:
            for op in range(n):
                wm += missing[op] * np.int64(op + 1)
                wo += out_refs[op] * np.int64(op + 1)

    matched = -1
    while True:
        # ==== reference.dispatch: idle devices start their best ready task (an op, or a
        # send or receive task), idle links their oldest transfer
        for k in range(n_dpend):
            d = dpend[U64(k)]
            dev_pending[U64(d)] = False
            if running[U64(d)]:
                continue
            if rq_unsorted[U64(d)]:
                readyq_sort(rq, rq_base[U64(d)], rq_size[U64(d)])
                rq_unsorted[U64(d)] = False
            if has_tasks and tq_size[U64(d)] > 0 and (rq_size[U64(d)] == 0
                                                      or tq_k1[U64(tq_base[U64(d)])] < rq[U64(rq_base[U64(d)])]):
                task = tq_id[U64(tq_base[U64(d)])]
                tq_base[U64(d)] += 1
                tq_size[U64(d)] -= 1
                x = task >> 1
                recv = task & 1
                b = tensor_bytes[U64(x_tensor[U64(x)])]
                dur = (xcost[U64(SEND_US + 2 * recv), U64(d)]
                       + b * xcost[U64(SEND_US_PER_BYTE + 2 * recv), U64(d)])
                running[U64(d)] = True
                busy[U64(d)] += dur
                if trace:
                    x_task[U64(x), U64(TASK_SEND_START + 2 * recv)] = now
                    x_task[U64(x), U64(TASK_SEND_END + 2 * recv)] = now + dur
                n_ev = evq_push(ev_b, ev_k, ev_id, n_ev, time_bits(ev_t, ev_b, n_ev, now + dur),
                                 (SEND_DONE + 2 * recv) * key_span + x, x)
            elif rq_size[U64(d)] > 0:
                op = topo_order[U64(rq[U64(rq_base[U64(d)])] & LOW)]
                rq_base[U64(d)] += 1  # the slice's free room moves to its front (see set_bases)
                rq_size[U64(d)] -= 1
                running[U64(d)] = True
                end = now + tp[U64(op)]
                if trace:
                    op_start[U64(op)] = now
                    op_prev[U64(op)] = last_op[U64(d)]
                    last_op[U64(d)] = op
                if INCR or trace:
                    op_end[U64(op)] = end
                busy[U64(d)] += tp[U64(op)]
                live[U64(d)] += out_bytes[U64(op)]
                if live[U64(d)] > livepeak[U64(d)]:
                    livepeak[U64(d)] = live[U64(d)]
                if INCR and live[U64(d)] > seg[U64(d)]:
                    seg[U64(d)] = live[U64(d)]
                n_ev = evq_push(ev_b, ev_k, ev_id, n_ev, time_bits(ev_t, ev_b, n_ev, end),
                                 OP_DONE * key_span + rank[U64(op)], op)
        for k in range(n_pending):
            l = pending[U64(k)]
            link_pending[U64(l)] = False
            # reference.dispatch: a fifo link starts its oldest transfer when idle, a link
            # that does not queue every transfer queued on it
            while link_head[U64(l)] >= 0 and not (fifo_links and link_busy[U64(l)]):
                x = link_head[U64(l)]
                link_head[U64(l)] = x_next[U64(x)]
                if link_head[U64(l)] < 0:
                    link_tail[U64(l)] = -1
                link_busy[U64(l)] = fifo_links
                dd = x_dst[U64(x)]
                b = tensor_bytes[U64(x_tensor[U64(x)])]
                t_end = now + (lat_l[U64(l)] + b / bw_l[U64(l)])
                if trace:
                    x_start[U64(x)] = now
                    x_end[U64(x)] = t_end
                live[U64(dd)] += b
                if live[U64(dd)] > livepeak[U64(dd)]:
                    livepeak[U64(dd)] = live[U64(dd)]
                if INCR and live[U64(dd)] > seg[U64(dd)]:
                    seg[U64(dd)] = live[U64(dd)]
                n_ev = evq_push(ev_b, ev_k, ev_id, n_ev, time_bits(ev_t, ev_b, n_ev, t_end),
                                 XFER_DONE * key_span + x, x)
        n_pending = 0
        n_dpend = 0

        if n_ev == 0:
            break
        if ck is not None:
            if record and since >= every and next_ck < cap_ck and n_ev <= cap_ev:
                if save(ck, next_ck, w, placement, now, epoch, 1 if (now < ev_t[n_ev - 1] or fresh) else 0, n_ev,
                        n_x, makespan, wm, wo):
                    next_ck += 1
                    since = 0
            if check and ev_t[n_ev - 1] >= cj_t:
                while cj < n_ck and ck_f[cj, CKF_NEXT_T] < ev_t[n_ev - 1]:
                    cj += 1
                if cj < n_ck and ck_f[cj, CKF_NEXT_T] == ev_t[n_ev - 1]:
                    if n_moved_done == n_moved and converged(net, ck, base, cj, w, placement, moved_ops, n_ev, n_x,
                                                             key_span, wm, wo):
                        matched = cj
                        break
                    cj += 1
                cj_t = ck_f[cj, CKF_NEXT_T] if cj < n_ck else np.inf
        # ==== reference.simulate's inner loop: handle every event of the next instant
        if ev_t[n_ev - 1] > now:
            epoch += 1
            if INCR:  # only checkpoints read instants back
                epoch_time[U64(epoch)] = ev_t[n_ev - 1]
        now = ev_t[n_ev - 1]
        while n_ev > 0 and ev_t[U64(n_ev - 1)] == now:
            # pop the next event: the queue's last entry
            n_ev -= 1
            kind_key = ev_k[U64(n_ev)]
            i = ev_id[U64(n_ev)]
            if INCR:
                since += 1
                fresh = False
            if kind_key < key_span:
                # ==== reference.op_done: an op ended: free what its inputs held (release_output),
                # hand its outputs on (input_arrived locally, a new transfer to each other device)
                op = i
                d = placement[U64(op)]
                running[U64(d)] = False
                n_dpend = mark(dev_pending, dpend, n_dpend, d)
                if INCR and moved[U64(op)]:
                    n_moved_done += 1
                if now > makespan:
                    makespan = now
                for e in range(in_ptr[U64(op)], in_ptr[U64(op + 1)]):
                    t = in_tensor[U64(e)]
                    prod = tensor_op[U64(t)]
                    if placement[U64(prod)] == d:
                        out_refs[U64(prod)] -= 1
                        wo -= prod + 1
                        if out_refs[U64(prod)] == 0:
                            live[U64(d)] -= out_bytes[U64(prod)]
                    else:
                        x = copy_of[U64(t * D + d)]
                        x_refs[U64(x)] -= 1
                        if x_refs[U64(x)] == 0:
                            live[U64(d)] -= tensor_bytes[U64(t)]
                refs = 0
                for t in range(op_tensor_ptr[U64(op)], op_tensor_ptr[U64(op + 1)]):
                    x_first = n_x
                    for e in range(tensor_ptr[U64(t)], tensor_ptr[U64(t + 1)]):
                        c = tensor_cons[U64(e)]
                        dc = placement[U64(c)]
                        if dc == d:
                            refs += 1
                            missing[U64(c)] -= 1
                            wm -= c + 1
                            if missing[U64(c)] == 0:
                                ready_op(rq, rq_base, rq_size, rq_unsorted, dc, (epoch << 32) | rank[U64(c)])
                            continue
                        x = sent[U64(dc)]
                        if x >= x_first:  # sent holds only this run's transfers (reset with the run)
                            x_refs[U64(x)] += 1  # already on its way there
                            continue
                        x = n_x
                        n_x += 1
                        sent[U64(dc)] = x
                        copy_of[U64(t * D + dc)] = x
                        x_tensor[U64(x)] = t
                        x_src[U64(x)] = d
                        x_dst[U64(x)] = dc
                        x_refs[U64(x)] = 1
                        refs += 1
                        if has_tasks and (idle_sends or (xcost[SEND_US, U64(d)]
                                                         + tensor_bytes[U64(t)] * xcost[SEND_US_PER_BYTE, U64(d)])
                                          != 0.0):
                            x_next[U64(x)] = -1
                            tq_size[U64(d)] = taskq_push(tq_k1, tq_k2, tq_id, tq_base[U64(d)], tq_size[U64(d)],
                                                         send_class | (epoch << 32) | rank[U64(op)], (t * D + dc) * 2,
                                                         x * 2)
                            if not aside_sends:  # the wire waits for the send task
                                continue
                        l = d * D + dc
                        n_pending = link_append(x_next, link_head, link_tail, link_pending, pending, n_pending, l, x)
                for e in range(ctrl_ptr[U64(op)], ctrl_ptr[U64(op + 1)]):
                    c = ctrl_dst[U64(e)]
                    missing[U64(c)] -= 1
                    wm -= c + 1
                    if missing[U64(c)] == 0:
                        dc = placement[U64(c)]
                        ready_op(rq, rq_base, rq_size, rq_unsorted, dc, (epoch << 32) | rank[U64(c)])
                        if not running[U64(dc)]:
                            n_dpend = mark(dev_pending, dpend, n_dpend, dc)
                out_refs[U64(op)] = refs
                wo += refs * np.int64(op + 1)
                if refs == 0:
                    live[U64(d)] -= out_bytes[U64(op)]
            elif kind_key < 2 * key_span:
                # ==== reference.send_done: a send task ended: the transfer joins its link's queue
                # (to_link), unless it joined when made ("aside")
                x = i
                s = x_src[U64(x)]
                running[U64(s)] = False
                n_dpend = mark(dev_pending, dpend, n_dpend, s)
                if not aside_sends:  # an aside send's transfer joined its link when made
                    l = s * D + x_dst[U64(x)]
                    n_pending = link_append(x_next, link_head, link_tail, link_pending, pending, n_pending, l, x)
            else:
                x = i
                t = x_tensor[U64(x)]
                dd = x_dst[U64(x)]
                if kind_key < 3 * key_span:
                    # ==== reference.xfer_done: a link transfer ended: the link is free, the source
                    # copy may be freed, the tensor is on its destination unless a receive task runs first
                    s = x_src[U64(x)]
                    l = s * D + dd
                    link_busy[U64(l)] = False
                    n_pending = mark(link_pending, pending, n_pending, l)
                    prod = tensor_op[U64(t)]
                    out_refs[U64(prod)] -= 1
                    wo -= prod + 1
                    if out_refs[U64(prod)] == 0:
                        live[U64(s)] -= out_bytes[U64(prod)]
                    if has_tasks and (xcost[RECV_US, U64(dd)]
                                      + tensor_bytes[U64(t)] * xcost[RECV_US_PER_BYTE, U64(dd)]) != 0.0:
                        tq_size[U64(dd)] = taskq_push(tq_k1, tq_k2, tq_id, tq_base[U64(dd)], tq_size[U64(dd)],
                                                      (epoch << 32) | rank[U64(prod)], (t * D + dd) * 2 + 1,
                                                      x * 2 + 1)
                        if not running[U64(dd)]:
                            n_dpend = mark(dev_pending, dpend, n_dpend, dd)
                        continue
                else:
                    # ==== reference.recv_done: a receive task ended: dd is free, and the tensor is on it
                    running[U64(dd)] = False
                    n_dpend = mark(dev_pending, dpend, n_dpend, dd)
                # ==== reference.arrived (from xfer_done or recv_done): the tensor is on dd, its
                # consumers there have one input fewer to wait for (input_arrived)
                for e in range(tensor_ptr[U64(t)], tensor_ptr[U64(t + 1)]):
                    c = tensor_cons[U64(e)]
                    # which consumers sit on dd depends on the placement alone, so a test
                    # of it mispredicts often: count it down without one (0 elsewhere)
                    other = placement[U64(c)] ^ dd
                    on_dd = np.int32(other == 0)
                    missing[U64(c)] -= on_dd
                    wm -= on_dd * (c + 1)
                    if (missing[U64(c)] | other) == 0:
                        ready_op(rq, rq_base, rq_size, rq_unsorted, dd, (epoch << 32) | rank[U64(c)])
                        if not running[U64(dd)]:  # a receive marked dd already
                            n_dpend = mark(dev_pending, dpend, n_dpend, dd)
    if ck is not None:
        if record and next_ck > 0 and matched < 0:
            for d in range(D):
                ck.seg[next_ck - 1, d] = seg[d]
    w.sc[SC_N_EV] = n_ev
    w.sc[SC_N_X] = n_x
    w.sc[SC_EPOCH] = epoch
    if INCR and record:
        w.sc[SC_N_CK] = next_ck
    w.sf[SF_MAKESPAN] = makespan
    w.sf[SF_NOW] = now
    return matched
