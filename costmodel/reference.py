"""The reference simulator: plain Python, written to be obviously right.

It is the oracle for the compiled kernel in :mod:`placetool.costmodel.kernels`; both must return
bit-identical numbers. The semantics (see DESIGN.md, "The simulator"):

- Time advances from event to event (op finished, transfer finished). At each instant,
  all events of that instant are handled first (freeing memory, making ops ready,
  queueing transfers); then every idle device starts its best ready op, and every idle
  link starts the oldest queued transfer.
- A device runs one op at a time; its ready ops are started in order of
  (ready time, topological rank).
- A tensor needed on another device is sent once per (tensor, destination). Transfers
  on one directed link run one at a time, first queued first served, and take
  ``latency + bytes / bandwidth``. A control edge across devices costs nothing.
- Memory per device: parameter bytes of the ops placed there, always; an op's outputs
  from its start until its last local consumer has finished and its outgoing transfers
  are done (at its end if nothing consumes them); a received copy from the start of its
  transfer until its last consumer on that device has finished.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

OP_DONE, XFER_DONE = 0, 1


@dataclass
class RefResult:
    step_time_us: float
    busy_us: np.ndarray
    peak_memory_bytes: np.ndarray
    op_start: np.ndarray
    op_end: np.ndarray
    transfers: list  # (tensor, src_dev, dst_dev, start, end)


def simulate(graph, T, placement, latency_us, bandwidth_bytes_per_us, memory_bytes=None) -> RefResult:
    """Simulate ``placement`` (device per op) with op times ``T[op, device]`` in µs.

    Memory capacities are not checked here; the caller compares ``peak_memory_bytes``.
    Every op must have a finite time on its device.
    """
    n = graph.n_ops
    D = T.shape[1]
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

    ready = [[] for _ in range(D)]  # heaps of (ready time, rank, op)
    running = [False] * D
    link_queue = {}  # (src, dst) -> list of transfer ids, FIFO
    link_busy = {}
    events = []  # heap of (time, kind, tiebreak, id)
    op_start = [0.0] * n
    op_end = [0.0] * n
    out_refs = [0] * n  # holders of an op's outputs: local consumer edges + transfers
    transfers = []  # [tensor, src, dst, start, end, refs]
    copy_of = {}  # (tensor, device) -> transfer id

    for op in range(n):
        if missing[op] == 0:
            heapq.heappush(ready[p[op]], (0.0, rank[op], op))

    def input_arrived(op, now):
        missing[op] -= 1
        if missing[op] == 0:
            heapq.heappush(ready[p[op]], (now, rank[op], op))

    def dispatch(now):
        for d in range(D):
            if not running[d] and ready[d]:
                _, _, op = heapq.heappop(ready[d])
                running[d] = True
                op_start[op] = now
                op_end[op] = now + T[op, d]
                busy[d] += T[op, d]
                mem[d] += int(graph.out_bytes[op])
                peak[d] = max(peak[d], mem[d])
                heapq.heappush(events, (op_end[op], OP_DONE, rank[op], op))
        for (s, d), q in sorted(link_queue.items()):
            if not link_busy.get((s, d), False) and q:
                x = q.pop(0)
                tr = transfers[x]
                link_busy[(s, d)] = True
                tr[3] = now
                tr[4] = now + (latency_us[s, d] + tensor_bytes[tr[0]] / bandwidth_bytes_per_us[s, d])
                mem[d] += tensor_bytes[tr[0]]
                peak[d] = max(peak[d], mem[d])
                heapq.heappush(events, (tr[4], XFER_DONE, x, x))

    def release_output(op, now):
        out_refs[op] -= 1
        if out_refs[op] == 0:
            mem[p[op]] -= int(graph.out_bytes[op])

    def op_done(op, now):
        d = p[op]
        running[d] = False
        # Release the memory this op's inputs held.
        for t in inputs[op]:
            producer = tensor_op[t]
            if p[producer] == d:
                release_output(producer, now)
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
                    copy_of[(t, dc)] = len(transfers)
                    transfers.append([t, d, dc, 0.0, 0.0, 1])
                    link_queue.setdefault((d, dc), []).append(len(transfers) - 1)
                    refs += 1
        for c in ctrl_succ[op]:
            input_arrived(c, now)
        out_refs[op] = refs + 1
        release_output(op, now)  # drops the +1: frees now if nothing holds the outputs

    def xfer_done(x, now):
        t, s, d = transfers[x][0], transfers[x][1], transfers[x][2]
        link_busy[(s, d)] = False
        release_output(tensor_op[t], now)
        for c in consumers[t]:
            if p[c] == d:
                input_arrived(c, now)

    dispatch(0.0)
    while events:
        now = events[0][0]
        while events and events[0][0] == now:
            _, kind, _, i = heapq.heappop(events)
            if kind == OP_DONE:
                op_done(i, now)
            else:
                xfer_done(i, now)
        dispatch(now)

    return RefResult(
        step_time_us=max(op_end) if n else 0.0,
        busy_us=np.array(busy),
        peak_memory_bytes=np.array(peak, dtype=np.int64),
        op_start=np.array(op_start),
        op_end=np.array(op_end),
        transfers=[tuple(tr[:5]) for tr in transfers],
    )
