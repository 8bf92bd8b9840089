"""The reference simulator: plain Python, written to be obviously right.

It is the oracle for the compiled engine in :mod:`placetool.costmodel.engine`; both must return
bit-identical numbers. The rules (also in docs/simulator.md):

- Time advances from event to event (op finished, send task finished, link transfer
  finished, receive task finished). At each instant all events of that instant are
  handled first, in the order (kind: op, send, link, receive; then op rank or transfer
  id); then every idle device starts its best ready task, and every idle link starts
  the oldest queued transfer.
- A device runs one task at a time. Its tasks are its ops and the send and receive
  tasks of transfers from and to it. The ready one with the smallest key
  ``(ready time, rank, tensor, destination, kind)`` starts first, where rank is the op's
  topological rank (for a send or receive task: that of the tensor's producer), tensor
  and destination are -1 for an op, and kind is 0 op, 1 send, 2 receive. The key is
  unique among the tasks a device can hold at once, so the order is total.
- A tensor needed on another device is sent once per (tensor, destination), in up to
  three stages: a send task on the source device (``send_us + bytes *
  send_us_per_byte`` of that device), ready when the producer ends; the link transfer
  (``latency + bytes / bandwidth``; with the cluster's ``link_queue`` ``"fifo"``
  transfers on one directed link run one at a time, first queued first served, with
  ``"none"`` each starts as soon as it is queued); a receive task on the destination
  (``recv_us + bytes * recv_us_per_byte``), ready when the link transfer ends. The
  tensor is on the destination when the last stage ends. A send or receive stage of
  duration exactly 0 is skipped: no task is made, and the next stage starts from the
  same instant. A control edge across devices costs nothing.
- With the cluster's ``link_send`` ``"idle"``, every transfer has a send task, even of
  duration 0, and a device starts a send task only when it has no ready op or receive
  task: a send task's key is ``(1, ready time, rank, tensor, destination, kind)`` against
  ``(0, ...)`` for everything else. (``"eager"``: every key has the leading 0.)
- With ``link_send`` ``"aside"``, the send task does not gate the wire: the link transfer
  is queued when the producer ends, and the send task (made only where its duration is
  not 0) runs on the source device beside it, before anything else the device holds: its
  key is ``(-1, ready time, ...)``. It is CPU the sender spends on the message (for a
  TensorFlow worker: serialising it and serving the RecvTensor call) while the bytes are
  already on their way. The outputs are held until the link transfer ends, as always.
- Memory per device: parameter bytes of the ops placed there, always; an op's outputs
  from its start until its last local consumer has finished and its outgoing transfers
  are done (send task and link transfer; at its end if nothing consumes them); a
  received copy from the start of its link transfer until its last consumer on that
  device has finished.
- Busy time per device: the durations of its ops and its send and receive tasks.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

# Event kinds, in the order events of one instant are handled.
OP_DONE, SEND_DONE, XFER_DONE, RECV_DONE = 0, 1, 2, 3
# Task kinds on a device's ready queue.
OP, SEND, RECV = 0, 1, 2


@dataclass
class RefResult:
    step_time_us: float
    busy_us: np.ndarray
    peak_memory_bytes: np.ndarray
    op_start: np.ndarray
    op_end: np.ndarray
    transfers: list  # (tensor, src_dev, dst_dev, link start, link end), in creation order
    tasks: list  # (kind SEND or RECV, transfer index, device, start, end), one per task run


def simulate(graph, T, placement, cluster) -> RefResult:
    """Simulate ``placement`` (device per op) with op times ``T[op, device]`` in µs on
    ``cluster`` (links and the devices' send/receive costs).

    Memory capacities are not checked here; the caller compares ``peak_memory_bytes``.
    Every op must have a finite time on its device.
    """
    if cluster.link_send == "workers":
        raise ValueError("links.send 'workers' has its own reference: placetool.costmodel.workers.simulate_workers")
    n = graph.n_ops
    D = T.shape[1]
    latency_us, bandwidth = cluster.latency_us, cluster.bandwidth_bytes_per_us
    devs = cluster.devices
    fifo = cluster.link_queue == "fifo"
    idle_sends = cluster.link_send == "idle"
    aside_sends = cluster.link_send == "aside"
    p = [int(x) for x in placement]
    rank = [int(x) for x in graph.topo_rank]
    tensor_op = [int(x) for x in graph.tensor_op]
    tensor_bytes = [int(x) for x in graph.tensor_bytes]

    tensors_of = [[] for _ in range(n)]
    for t, op in enumerate(tensor_op):
        tensors_of[op].append(t)
    consumers = [[] for _ in tensor_op]  # one entry per data edge, in edge order
    ctrl_succ = [[] for _ in range(n)]
    inputs = [[] for _ in range(n)]  # tensors consumed, one per data edge
    missing = [0] * n
    for s, d, t in zip(graph.edge_src.tolist(), graph.edge_dst.tolist(), graph.edge_tensor.tolist()):
        missing[d] += 1
        if t < 0:
            ctrl_succ[s].append(d)
        else:
            consumers[t].append(d)
            inputs[d].append(t)
    # Edges were given in arbitrary order; the kernel reads them grouped by tensor / op
    # in edge order, which is what the loops above produce.

    mem = [0] * D
    for op in range(n):
        mem[p[op]] += int(graph.param_bytes[op])
    peak = list(mem)
    busy = [0.0] * D

    ready = [[] for _ in range(D)]  # heaps of (class, ready time, rank, tensor, destination, kind, op or transfer)
    running = [False] * D
    link_queue = {}  # (src, dst) -> list of transfer ids, FIFO
    link_busy = {}
    events = []  # heap of (time, kind, tiebreak, id)
    op_start = [0.0] * n
    op_end = [0.0] * n
    out_refs = [0] * n  # holders of an op's outputs: local consumer edges + transfers
    transfers = []  # [tensor, src, dst, start, end, refs]
    tasks = []
    copy_of = {}  # (tensor, device) -> transfer id

    for op in range(n):
        if missing[op] == 0:
            heapq.heappush(ready[p[op]], (0, 0.0, rank[op], -1, -1, OP, op))

    def send_time(x):
        t, s = transfers[x][0], transfers[x][1]
        return devs[s].send_us + tensor_bytes[t] * devs[s].send_us_per_byte

    def recv_time(x):
        t, d = transfers[x][0], transfers[x][2]
        return devs[d].recv_us + tensor_bytes[t] * devs[d].recv_us_per_byte

    def task_key(x, kind, now):
        t, dst = transfers[x][0], transfers[x][2]
        cls = (int(idle_sends) - int(aside_sends)) if kind == SEND else 0
        return (cls, now, rank[tensor_op[t]], t, dst, kind, x)

    def input_arrived(op, now):
        missing[op] -= 1
        if missing[op] == 0:
            heapq.heappush(ready[p[op]], (0, now, rank[op], -1, -1, OP, op))

    def dispatch(now):
        for d in range(D):
            if not running[d] and ready[d]:
                *_, kind, i = heapq.heappop(ready[d])
                running[d] = True
                if kind == OP:
                    op_start[i] = now
                    op_end[i] = now + T[i, d]
                    busy[d] += T[i, d]
                    mem[d] += int(graph.out_bytes[i])
                    peak[d] = max(peak[d], mem[d])
                    heapq.heappush(events, (op_end[i], OP_DONE, rank[i], i))
                else:
                    dur = send_time(i) if kind == SEND else recv_time(i)
                    busy[d] += dur
                    tasks.append((kind, i, d, now, now + dur))
                    heapq.heappush(events, (now + dur, SEND_DONE if kind == SEND else RECV_DONE, i, i))
        for (s, d), q in sorted(link_queue.items()):
            while q and not (fifo and link_busy.get((s, d), False)):
                x = q.pop(0)
                tr = transfers[x]
                link_busy[(s, d)] = True
                tr[3] = now
                tr[4] = now + (latency_us[s, d] + tensor_bytes[tr[0]] / bandwidth[s, d])
                mem[d] += tensor_bytes[tr[0]]
                peak[d] = max(peak[d], mem[d])
                heapq.heappush(events, (tr[4], XFER_DONE, x, x))

    def release_output(op):
        out_refs[op] -= 1
        if out_refs[op] == 0:
            mem[p[op]] -= int(graph.out_bytes[op])

    def to_link(x):
        s, d = transfers[x][1], transfers[x][2]
        link_queue.setdefault((s, d), []).append(x)

    def op_done(op, now):
        d = p[op]
        running[d] = False
        # Release the memory this op's inputs held.
        for t in inputs[op]:
            producer = tensor_op[t]
            if p[producer] == d:
                release_output(producer)
            else:
                tr = transfers[copy_of[(t, d)]]
                tr[5] -= 1
                if tr[5] == 0:
                    mem[d] -= tensor_bytes[t]
        # Hand outputs to consumers: local ones directly, remote ones by transfer.
        refs = 0
        for t in tensors_of[op]:
            for c in consumers[t]:
                dc = p[c]
                if dc == d:
                    refs += 1
                    input_arrived(c, now)
                elif (t, dc) in copy_of:
                    transfers[copy_of[(t, dc)]][5] += 1
                else:
                    x = copy_of[(t, dc)] = len(transfers)
                    transfers.append([t, d, dc, 0.0, 0.0, 1])
                    if aside_sends:
                        to_link(x)
                        if send_time(x) != 0:
                            heapq.heappush(ready[d], task_key(x, SEND, now))
                    elif send_time(x) == 0 and not idle_sends:
                        to_link(x)
                    else:
                        heapq.heappush(ready[d], task_key(x, SEND, now))
                    refs += 1
        for c in ctrl_succ[op]:
            input_arrived(c, now)
        out_refs[op] = refs + 1
        release_output(op)  # drops the +1: frees now if nothing holds the outputs

    def send_done(x):
        running[transfers[x][1]] = False
        if not aside_sends:
            to_link(x)

    def arrived(x, now):
        t, d = transfers[x][0], transfers[x][2]
        for c in consumers[t]:
            if p[c] == d:
                input_arrived(c, now)

    def xfer_done(x, now):
        t, s, d = transfers[x][0], transfers[x][1], transfers[x][2]
        link_busy[(s, d)] = False
        release_output(tensor_op[t])
        if recv_time(x) == 0:
            arrived(x, now)
        else:
            heapq.heappush(ready[d], task_key(x, RECV, now))

    def recv_done(x, now):
        running[transfers[x][2]] = False
        arrived(x, now)

    dispatch(0.0)
    while events:
        now = events[0][0]
        while events and events[0][0] == now:
            _, kind, _, i = heapq.heappop(events)
            if kind == OP_DONE:
                op_done(i, now)
            elif kind == SEND_DONE:
                send_done(i)
            elif kind == XFER_DONE:
                xfer_done(i, now)
            else:
                recv_done(i, now)
        dispatch(now)

    return RefResult(
        step_time_us=max(op_end) if n else 0.0,
        busy_us=np.array(busy),
        peak_memory_bytes=np.array(peak, dtype=np.int64),
        op_start=np.array(op_start),
        op_end=np.array(op_end),
        transfers=[tuple(tr[:5]) for tr in transfers],
        tasks=sorted(tasks, key=lambda k: (k[1], k[0])),
    )
