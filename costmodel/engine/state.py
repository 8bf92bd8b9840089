"""The engine's arrays: what the event loop reads and writes, allocated once.

- :class:`Net`: the graph on the cluster (CSR adjacency, op times, links, device
  transfer costs), read only;
- :class:`Work`: the running state, allocated once and reused across calls (one per
  thread); nothing in it needs clearing between runs except what :func:`init_fresh`
  resets;
- :class:`Checkpoints` and :class:`Base`: the incremental simulator's saved states and
  its base run (see :mod:`placetool.costmodel.incremental`).

Memory is tracked as *live* bytes (outputs and received copies) per device; parameter
bytes are constant over a run, so peak = parameters + peak live, added by the caller.
``copy_of[t * D + d]`` (the transfer bringing tensor t to device d) is never cleared:
it is read only for transfers made in this run (an op's inputs, a restored base run's
transfers). Whether tensor t already goes to device d is asked only while t's producer
ends, when all of t's transfers are made: ``sent[d]`` (the last transfer made to d in
this run; reset with each run and each restore) answers it if it lies among the
transfers made for t, so the loop never reads a stale entry of the large table (that
read missed the cache on most remote consumers).

The loop's footprint is kept small because it decides its speed once a graph outgrows
the core's cache: index arrays of the workspace are int32, each op's time on its device
is gathered once per placement (``tp``, 8 bytes an op instead of a row of ``T``), and a
plain run writes no trace (``trace``) and no instant times (read only by checkpoints).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

#: array indices in the engine are cast to unsigned (see :mod:`placetool.costmodel.engine.loop`)
U64 = np.uint64
#: the low half of a ready key: the op's rank
LOW = np.int64(0xFFFFFFFF)
#: the bit an idle send's task key carries (cluster.link_send "idle"): it sorts after every
#: receive task and above every op key, so the device runs it only with nothing else ready
SEND_LAST = np.int64(1) << np.int64(62)
#: the bits an aside send's task key carries (cluster.link_send "aside"): a negative key,
#: so it sorts before every other task and every op key (its epoch and rank bits stay
#: below, and ``(key >> 32) & EPOCH`` still reads its epoch)
SEND_FIRST = np.int64(-1) << np.int64(62)
#: a task key's epoch is ``(key >> 32) & EPOCH`` (epochs stay far below 2**30)
EPOCH = np.int64((1 << 30) - 1)

# Named slots of the small arrays that carry scalars (numba folds these global ints).
# ``Work.sc``, int64: the loop's integer state between calls
SC_N_EV = 0  # pending events
SC_N_X = 1  # transfers made
SC_N_CK = 2  # checkpoints recorded (incremental runs that record)
SC_EPOCH = 3  # distinct event instants so far
N_SC = 4
# ``Work.sf``, float64
SF_MAKESPAN = 0
SF_NOW = 1  # the last instant handled
N_SF = 2
# ``Net.xcost`` rows: a device's send and receive task costs (its columns are devices)
SEND_US = 0
SEND_US_PER_BYTE = 1
RECV_US = 2
RECV_US_PER_BYTE = 3
# ``Work.x_task`` columns: the send task's start and end, then the receive task's (a
# task of kind SEND + recv starts at column 2 * recv)
TASK_SEND_START = 0
TASK_SEND_END = 1
TASK_RECV_START = 2
TASK_RECV_END = 3
# ``Checkpoints.f``, float64 per checkpoint
CKF_NEXT_T = 0  # the next event's time
CKF_MAKESPAN = 1
CKF_NOW = 2
N_CKF = 3
# ``Checkpoints.i``, int64 per checkpoint
CKI_N_X = 0
CKI_N_EV = 1
CKI_EPOCH = 2
CKI_CLEAN = 3  # saved before any event of its instant was handled
CKI_WM = 4  # op-weighted sum of missing inputs (a cheap first test of equal states)
CKI_WO = 5  # op-weighted sum of output references
CKI_TASK_OFF = 6  # where its queued tasks start in the task pool
CKI_N_TASKS = 7  # how many
N_CKI = 8
# rows of ``Checkpoints.link`` (per link), ``.op`` (per op) and ``.x`` (per transfer)
CK_LINK_HEAD = 0
CK_LINK_TAIL = 1
CK_LINK_BUSY = 2
CK_OP_MISSING = 0
CK_OP_OUT_REFS = 1
CK_X_REFS = 0
CK_X_NEXT = 1


class Net(NamedTuple):
    """The graph on the cluster, as the engine reads it (index arrays are int32)."""

    T: np.ndarray  # float64 [n, D]: op time on each device
    rank: np.ndarray  # [n] topological rank
    topo_order: np.ndarray  # [n] op of each rank
    out_bytes: np.ndarray  # int64 [n]
    tensor_op: np.ndarray  # [nt] producer
    tensor_bytes: np.ndarray  # int64 [nt]
    op_tensor_ptr: np.ndarray  # [n + 1] -> tensors (tensors are sorted by op)
    tensor_ptr: np.ndarray  # [nt + 1] -> tensor_cons
    tensor_cons: np.ndarray  # [n_data] consumer per data edge
    ctrl_ptr: np.ndarray  # [n + 1] -> ctrl_dst
    ctrl_dst: np.ndarray
    in_ptr: np.ndarray  # [n + 1] -> in_tensor
    in_tensor: np.ndarray  # [n_data] tensor per data edge into op
    n_inputs: np.ndarray  # [n] data + control edges in
    latency: np.ndarray  # float64 [D, D]
    bandwidth: np.ndarray  # float64 [D, D]
    xcost: np.ndarray  # float64 [4, D]: rows SEND_US, SEND_US_PER_BYTE, RECV_US, RECV_US_PER_BYTE
    has_tasks: bool  # some device has a nonzero send/receive cost, or sends wait for an idle device
    fifo_links: bool  # transfers on one link run one at a time (cluster.link_queue "fifo"), else side by side
    idle_sends: bool  # a transfer leaves only when its device has no ready op (cluster.link_send "idle")
    aside_sends: bool  # the send task runs first on its device, beside the link transfer ("aside")


def make_net(graph, cluster, T) -> Net:
    """Pack a graph, cluster and op-time matrix for the engine."""
    c = graph.csr
    ip = np.int32  # half the memory traffic of intp; the loop widens on use

    def a(x, dt=ip):
        return np.ascontiguousarray(x, dt)

    xcost = np.ascontiguousarray(cluster.transfer_costs(), np.float64)
    idle_sends = cluster.link_send == "idle"
    return Net(
        T=a(T, np.float64), rank=a(graph.topo_rank), topo_order=a(graph.topo_order),
        out_bytes=a(graph.out_bytes, np.int64), tensor_op=a(graph.tensor_op),
        tensor_bytes=a(graph.tensor_bytes, np.int64), op_tensor_ptr=a(c.op_tensor_ptr), tensor_ptr=a(c.tensor_ptr),
        tensor_cons=a(c.tensor_cons), ctrl_ptr=a(c.ctrl_ptr), ctrl_dst=a(c.ctrl_dst), in_ptr=a(c.in_ptr),
        in_tensor=a(c.in_tensor), n_inputs=a(c.n_inputs), latency=a(cluster.latency_us, np.float64),
        bandwidth=a(cluster.bandwidth_bytes_per_us, np.float64), xcost=xcost,
        has_tasks=bool(np.any(xcost != 0)) or idle_sends, fifo_links=cluster.link_queue == "fifo",
        idle_sends=idle_sends, aside_sends=cluster.link_send == "aside",
    )


class Work(NamedTuple):
    """The engine's running state (and the trace of the last run)."""

    live: np.ndarray  # int64 [D] output and copy bytes held now
    livepeak: np.ndarray  # int64 [D]
    seg: np.ndarray  # int64 [D] live peak since the last checkpoint
    busy: np.ndarray  # float64 [D]
    running: np.ndarray  # bool [D]
    rq: np.ndarray  # int64 [n] ready-op keys, one sorted slice per device
    rq_base: np.ndarray  # [D] start of each slice (moves on as ops are popped)
    rq_size: np.ndarray  # [D]
    tq_k1: np.ndarray  # int64 task queues, one sorted slice per device: (epoch << 32) | producer rank
    tq_k2: np.ndarray  # int64 (tensor * D + destination) * 2 + kind - 1
    tq_id: np.ndarray  # transfer * 2 + kind - 1
    tq_base: np.ndarray  # [D] start of each slice (moves on as tasks are popped)
    tq_size: np.ndarray  # [D]
    epoch_time: np.ndarray  # float64: time of each distinct event instant
    missing: np.ndarray  # [n] inputs not yet on the op's device
    out_refs: np.ndarray  # [n] holders of the op's outputs
    x_tensor: np.ndarray  # per transfer, in creation order
    x_src: np.ndarray
    x_dst: np.ndarray
    x_refs: np.ndarray  # consumers on the destination not yet finished
    x_next: np.ndarray  # next transfer in the link queue
    copy_of: np.ndarray  # [nt * D] transfer of (tensor, destination); see the module docstring
    link_head: np.ndarray  # [D * D]
    link_tail: np.ndarray
    link_busy: np.ndarray
    link_pending: np.ndarray  # link in ``pending`` (may start a transfer at the next dispatch)
    pending: np.ndarray
    ev_t: np.ndarray  # event queue, next event last: time, kind * key_span + (rank or transfer), op or transfer
    ev_k: np.ndarray
    ev_id: np.ndarray
    op_start: np.ndarray  # float64 [n] (traced runs only)
    op_end: np.ndarray  # float64 [n] (traced and incremental runs)
    x_start: np.ndarray  # float64 link start and end (traced runs only)
    x_end: np.ndarray
    x_task: np.ndarray  # float64 [n_data, 4] columns TASK_* (traced; NaN set by the caller)
    moved: np.ndarray  # bool [n] ops a move changed (incremental only)
    mark: np.ndarray  # [n] scratch
    sc: np.ndarray  # int64 [N_SC]: slots SC_*
    sf: np.ndarray  # float64 [N_SF]: slots SF_*
    dev_pending: np.ndarray  # bool [D] device in ``dpend`` (may start a task at the next dispatch)
    dpend: np.ndarray  # [D]
    tp: np.ndarray  # float64 [n] each op's time on its device (gathered by set_bases)
    sent: np.ndarray  # [D] the last transfer made to each device (see the module docstring)
    last_op: np.ndarray  # [D] the op each device started last (traced runs)
    op_prev: np.ndarray  # [n] the op its device started before it, -1 for its first (traced runs)
    rq_unsorted: np.ndarray  # bool [D] the device's ready queue needs readyq_sort before its next pop


def make_work(n, nt, n_data, D, fifo_links=True):
    """A Work for graphs of n ops, nt tensors and n_data data edges on D devices."""
    n1 = max(n, 1)
    m = max(n_data, 1)
    L = D * D
    cap = n + 3 * n_data + 1
    # pending events: at most one per device, one per link (links that do not queue: one
    # per transfer in flight), plus time_bits' free slot
    E = 2 * D + (L if fifo_links else max(L, m)) + 1
    ip = np.int32  # half the memory traffic of intp (see the module docstring)
    z = np.zeros
    return Work(
        live=z(D, np.int64), livepeak=z(D, np.int64), seg=z(D, np.int64), busy=z(D), running=z(D, np.bool_),
        rq=z(n1, np.int64), rq_base=z(D, ip), rq_size=z(D, ip),
        tq_k1=z(2 * m, np.int64), tq_k2=z(2 * m, np.int64), tq_id=z(2 * m, ip), tq_base=z(D, ip), tq_size=z(D, ip),
        epoch_time=z(cap + 1), missing=z(n1, ip), out_refs=z(n1, ip),
        x_tensor=z(m, ip), x_src=z(m, ip), x_dst=z(m, ip), x_refs=z(m, ip), x_next=z(m, ip),
        copy_of=np.full(max(nt, 1) * D, -1, ip),
        link_head=np.full(L, -1, ip), link_tail=np.full(L, -1, ip), link_busy=z(L, np.bool_),
        link_pending=z(L, np.bool_), pending=z(L, ip),
        ev_t=z(E), ev_k=z(E, np.int64), ev_id=z(E, ip),
        op_start=z(n1), op_end=z(n1), x_start=z(m), x_end=z(m), x_task=z((m, 4)),
        moved=z(n1, np.bool_), mark=z(n1, ip), sc=z(N_SC, np.int64), sf=z(N_SF),
        dev_pending=z(D, np.bool_), dpend=z(D, ip), tp=z(n1), sent=z(D, ip),
        last_op=np.full(D, -1, ip), op_prev=np.full(n1, -1, ip), rq_unsorted=z(D, np.bool_),
    )


def work_for(net: Net) -> Work:
    """A Work sized for ``net``."""
    n, D = net.T.shape
    return make_work(n, net.tensor_op.shape[0], net.tensor_cons.shape[0], D, net.fifo_links)


class Checkpoints(NamedTuple):
    """Saved states of a base run (leading axis: checkpoint)."""

    f: np.ndarray  # float64 [C, N_CKF]: slots CKF_*
    i: np.ndarray  # int64 [C, N_CKI]: slots CKI_*
    busy: np.ndarray  # [C, D]
    live: np.ndarray
    livepeak: np.ndarray
    running: np.ndarray
    rqsize: np.ndarray
    tqsize: np.ndarray
    link: np.ndarray  # [C, 3, L] rows CK_LINK_*: head, tail, busy
    ev_t: np.ndarray  # [C, E] the event queue
    ev_k: np.ndarray
    ev_id: np.ndarray
    op: np.ndarray  # [C, 2, n] rows CK_OP_*: missing, out_refs
    rq: np.ndarray  # [C, n] ready-op keys, device by device
    rqready: np.ndarray  # [C, n] their ready times
    x: np.ndarray  # [C, 2, n_data] rows CK_X_*: refs, next
    seg: np.ndarray  # [C, D] live peak of the segment that starts at each checkpoint
    alive: np.ndarray  # [C] transfers with refs > 0
    tq_k1: np.ndarray  # [P] pool of saved task queues (checkpoint j at i[j, CKI_TASK_OFF], i[j, CKI_N_TASKS] long)
    tq_k2: np.ndarray
    tq_id: np.ndarray
    tq_ready: np.ndarray


def make_checkpoints(C, n, n_data, D, pool):
    """Room for C checkpoints; ``pool`` queued send/receive tasks across all of them."""
    L, E = D * D, 2 * D + D * D
    n1, m, P = max(n, 1), max(n_data, 1), max(pool, 1)
    z = np.zeros
    return Checkpoints(
        f=z((C, N_CKF)), i=z((C, N_CKI), np.int64), busy=z((C, D)), live=z((C, D), np.int64),
        livepeak=z((C, D), np.int64), running=z((C, D), np.bool_), rqsize=z((C, D), np.intp), tqsize=z((C, D), np.intp),
        link=z((C, 3, L), np.intp), ev_t=z((C, E)), ev_k=z((C, E), np.int64), ev_id=z((C, E), np.intp),
        op=z((C, 2, n1), np.intp), rq=z((C, n1), np.int64), rqready=z((C, n1)), x=z((C, 2, m), np.intp),
        seg=z((C, D), np.int64), alive=z(C, np.int64),
        tq_k1=z(P, np.int64), tq_k2=z(P, np.int64), tq_id=z(P, np.intp), tq_ready=z(P),
    )


class Base(NamedTuple):
    """The base run's transfers (tensor, source, destination) and copy table."""

    x_tensor: np.ndarray
    x_src: np.ndarray
    x_dst: np.ndarray
    copy_of: np.ndarray


def make_base(nt, n_data, D):
    """Room for the base run's transfers."""
    m = max(n_data, 1)
    return Base(x_tensor=np.zeros(m, np.intp), x_src=np.zeros(m, np.intp), x_dst=np.zeros(m, np.intp),
                copy_of=np.full(max(nt, 1) * D, -1, np.intp))


# ------------------------------------------------------------------ set-up
@njit(cache=True)
def set_bases(net, w, placement):
    """Slice the ready-op and task buffers by device for ``placement``, and gather
    each op's time on its device into ``w.tp``.

    Device d's ready slice starts with room for all its ops, and its task slice with
    room for all the tasks it can be given; popping moves a slice's start on, and since
    each op (task) is queued at most once a run, or after a restore at most once beside
    those restored, pushes never pass the next device's slice."""
    # Each array is taken from its named tuple once, into a local, here and in init_fresh
    # alike (so the two preambles read the same): numba increfs and decrefs an array taken
    # from a tuple at every use inside a loop; an engine that kept the look-ups ran 1.5x
    # slower (benchmarks/README.md, "attribute look-ups").
    net_in_ptr = net.in_ptr
    net_op_tensor_ptr = net.op_tensor_ptr
    net_tensor_ptr = net.tensor_ptr
    net_T = net.T
    w_live = w.live
    w_rq_base = w.rq_base
    w_rq_size = w.rq_size
    w_tp = w.tp
    w_tq_base = w.tq_base
    w_tq_size = w.tq_size
    D = w_live.shape[0]
    n = placement.shape[0]
    for d in range(D):
        w_rq_size[d] = 0  # used as a counter here
        w_tq_size[d] = 0
    for op in range(n):
        d = U64(placement[op])
        w_rq_size[d] += 1
        w_tp[op] = net_T[op, d]
    acc = 0
    for d in range(D):
        w_rq_base[d] = acc
        acc += w_rq_size[d]
    if net.has_tasks:
        # a device holds at most one send task per data edge out of its ops and one
        # receive task per data edge into them
        for op in range(n):
            d = U64(placement[op])
            w_tq_size[d] += (net_tensor_ptr[net_op_tensor_ptr[op + 1]] - net_tensor_ptr[net_op_tensor_ptr[op]]
                             + net_in_ptr[op + 1] - net_in_ptr[op])
        acc = 0
        for d in range(D):
            w_tq_base[d] = acc
            acc += w_tq_size[d]


@njit(cache=True, nogil=True)
def init_fresh(net, w, placement):
    """The state at time 0 before the first dispatch."""
    # fields unpacked once into locals, as in set_bases (why: there)
    net_n_inputs = net.n_inputs
    net_topo_order = net.topo_order
    w_busy = w.busy
    w_epoch_time = w.epoch_time
    w_link_busy = w.link_busy
    w_link_head = w.link_head
    w_link_pending = w.link_pending
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
    w_last_op = w.last_op
    w_sf = w.sf
    w_tq_size = w.tq_size
    n = placement.shape[0]
    D = w_live.shape[0]
    set_bases(net, w, placement)
    for d in range(D):
        w_live[d] = 0
        w_livepeak[d] = 0
        w_seg[d] = 0
        w_busy[d] = 0.0
        w_running[d] = False
        w_rq_size[d] = 0
        w_tq_size[d] = 0
    for l in range(D * D):
        w_link_head[l] = -1
        w_link_tail[l] = -1
        w_link_busy[l] = False
        w_link_pending[l] = False
    for op in range(n):
        w_missing[op] = net_n_inputs[op]
        w_out_refs[op] = 0
    for r in range(n):  # in rank order, so that each key goes to the end of its queue
        op = net_topo_order[r]
        if w_missing[op] == 0:
            d = U64(placement[op])
            w_rq[w_rq_base[d] + w_rq_size[d]] = np.int64(r)
            w_rq_size[d] += 1
    w_epoch_time[0] = 0.0
    w.rq_unsorted[:] = False
    w_sent[:] = -1
    w_last_op[:] = -1
    w_sc[SC_N_EV] = 0
    w_sc[SC_N_X] = 0
    w_sc[SC_EPOCH] = 0
    w_sf[SF_MAKESPAN] = 0.0
    w_sf[SF_NOW] = 0.0
