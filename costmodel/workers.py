"""A TensorFlow worker's own schedule: one compute thread per device, and its run queue.

The testbed's workers run with one inter-op thread (``tf_Compute``). TensorFlow's gRPC
worker service runs each RecvTensor request on that same pool, and the executor hands it
every op to run, so everything a worker does for a step passes through one Eigen run
queue, which has two ends:

- work the thread schedules itself goes to the **front** and is taken last in, first out:
  the ops an op's end makes ready (the executor runs them depth first), and the step's
  root nodes, scheduled in node order as the step starts;
- work scheduled from another thread goes to the **back** and is taken first in, first
  out, once the front is empty: the RecvTensor handler of a request from another worker,
  and an op made ready by a tensor that arrived (the ``_Recv``'s callback runs on a gRPC
  thread).

A tensor needed on another device travels as TensorFlow sends it:

1. the receiver's ``_Recv`` node, a root, issues the request when the thread reaches it
   (``request_us`` of the receiver's thread); the request reaches the sender after the
   link's latency back;
2. the sender's thread runs the handler from the back of its queue (``handler_us``). If
   the ``_Send`` has run, the handler encodes the tensor (``send_us_per_byte``) and the
   response leaves at its end; if not, the ``_Send`` encodes it when it runs and the
   response leaves then. The ``_Send`` is one more op its producer makes ready, at the place
   of its first edge among the producer's out-edges: pushed to the front with the others,
   it runs after any that were pushed later, and after everything those make ready. The
   out-edges are taken in the graph's order; a recording's replay passes the graph in its
   executor's order (:meth:`placetool.costmodel.timeline.Recording.executed_graph`);
3. the response takes the link's latency + bytes / bandwidth;
4. the receiver's thread spends ``arrive_us + recv_us_per_byte x bytes`` on it, next
   after what it is running (the gRPC threads share the worker's core), and the
   consumers it makes ready go to the back.

This is the reference for the cluster rule ``links.send = "workers"``: plain Python,
written to be read against TensorFlow's executor. :mod:`placetool.costmodel.engine.workers_kernel`
is its compiled twin, equal to it bit for bit, which :class:`~placetool.costmodel.CostModel`
runs for search; replays of measured steps run this one
(:func:`placetool.costmodel.timeline.replay`, ``links="workers"``).

Example: ops ``a`` (50 µs) and ``b`` (30 µs) on device 0 each feed ``c`` (20 µs) on
device 1; a request costs the receiver 10 µs, a handler the sender 5 µs, and a link
100 µs each way.

>>> import numpy as np
>>> from placetool.costmodel.graph import OpGraph
>>> g = OpGraph.from_arrays("ex", ["a", "b", "c"], ["X"] * 3, [0, 0, 0], [0, 1], [2, 2])
>>> t = simulate_workers(g, np.array([50.0, 30.0, 20.0]), np.array([0, 0, 1]),
...     np.full((2, 2), 100.0), np.full((2, 2), np.inf), WorkerCosts(request_us=10, handler_us=5))
>>> t.op_start.tolist(), t.op_end.tolist(), t.x_issue.tolist(), t.x_response.tolist()
([30.0, 0.0, 225.0], [80.0, 30.0, 245.0], [20.0, 10.0], [125.0, 115.0])

Device 0 takes its later root ``b`` first. Device 1 issues the two requests one after
the other, ``b``'s first (10 and 20 µs); they reach device 0 at 110 and 120 µs, after
its ops, its handlers answer at 115 and 125, and ``c`` starts when the last tensor lands.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass

import numpy as np

OP, REQUEST, HANDLER, SEND, RECEIVE = range(5)
# Event kinds: a task ends on a thread; a request reaches the sender; a response reaches the receiver.
TASK_END, REQUEST_IN, RESPONSE_IN = range(3)


@dataclass(frozen=True)
class WorkerCosts:
    """CPU a worker's compute thread spends per message (µs, and µs per byte)."""

    request_us: float = 0.0        # the receiver issuing a request (its _Recv node)
    handler_us: float = 0.0        # the sender's RecvTensor handler
    send_us_per_byte: float = 0.0  # the sender encoding the tensor
    arrive_us: float = 0.0         # the receiver taking the response in
    recv_us_per_byte: float = 0.0


#: where ``calibrate`` takes the run queue's per-message costs from: the designed splits'
#: whole steps, or their traced timelines
WORKER_COSTS = ("steps", "traces")

#: the 2-core testbed's, the grid point that replays the recorded split steps of four
#: graphs best together, and each graph best from the other three
#: (``benchmarks/replay_workers.py``: median |error| 2.8%)
TESTBED_COSTS = WorkerCosts(request_us=50.0, handler_us=75.0, send_us_per_byte=250e-6,
                            arrive_us=0.0, recv_us_per_byte=250e-6)


def device_costs(costs, n_devices: int) -> np.ndarray:
    """Per-device costs, rows request, handler, encode per byte, arrival, decode per byte:
    from one :class:`WorkerCosts` for every device, or from a cluster's devices
    (``request_us``, ``send_us``, ``send_us_per_byte``, ``recv_us``, ``recv_us_per_byte``)."""
    if isinstance(costs, WorkerCosts):
        row = [costs.request_us, costs.handler_us, costs.send_us_per_byte, costs.arrive_us, costs.recv_us_per_byte]
        return np.ascontiguousarray(np.repeat(np.array(row, np.float64)[:, None], n_devices, axis=1))
    return np.ascontiguousarray([[d.request_us, d.send_us, d.send_us_per_byte, d.recv_us, d.recv_us_per_byte]
                                 for d in costs.devices], np.float64).T.copy()


def with_worker_costs(cluster, costs: WorkerCosts = TESTBED_COSTS):
    """``cluster`` under ``links.send`` "workers" with ``costs`` on every device (request,
    handler as ``send_us``, its encoding per byte, arrival as ``recv_us``, decoding per
    byte); its links untouched (they should be lone transfers' latency and bandwidth)."""
    from dataclasses import replace

    devs = [replace(d, request_us=costs.request_us, send_us=costs.handler_us, send_us_per_byte=costs.send_us_per_byte,
                    recv_us=costs.arrive_us, recv_us_per_byte=costs.recv_us_per_byte) for d in cluster.devices]
    return replace(cluster, devices=devs, link_send="workers", link_queue="none")


@dataclass
class WorkerTrace:
    op_start: np.ndarray     # µs, per op
    op_end: np.ndarray
    x_producer: np.ndarray   # per transfer: producing op
    x_tensor: np.ndarray     # its tensor, -1 for a control edge's message
    x_dst: np.ndarray        # destination device
    x_issue: np.ndarray      # the request's issue (end of the receiver's request task)
    x_response: np.ndarray   # the response leaving the sender
    x_arrival: np.ndarray    # the response reaching the receiver
    busy_us: np.ndarray      # per device: ops and message work
    peak_bytes: np.ndarray   # per device: live outputs and received copies (parameters not counted)

    @property
    def step_us(self) -> float:
        """The last op's end: the step as the simulator scores it."""
        return float(self.op_end.max(initial=0.0))

    def span_us(self, mask=None) -> float:
        """First op start to last op end, over ``mask`` (all ops if None)."""
        m = slice(None) if mask is None else mask
        return float(self.op_end[m].max() - self.op_start[m].min())


def _transfers(graph, p):
    """One transfer per (tensor, destination) of a data edge across devices, and per
    (producer, destination) of a control edge (TensorFlow sends an empty tensor), in the
    order of their first edge; what each op's end makes ready, in edge order: its local
    consumers and, at its first edge, each transfer's ``_Send``."""
    index, producer, tensor, dst, nbytes, consumers, first = {}, [], [], [], [], [], []
    succ = [[] for _ in range(graph.n_ops)]
    for s, d, t in zip(graph.edge_src.tolist(), graph.edge_dst.tolist(), graph.edge_tensor.tolist()):
        if p[s] == p[d]:
            succ[s].append((OP, d))
            continue
        key = (t if t >= 0 else -1 - s, int(p[d]))
        x = index.setdefault(key, len(producer))
        if x == len(producer):
            succ[s].append((SEND, x))
            producer.append(s)
            tensor.append(t)
            dst.append(int(p[d]))
            nbytes.append(int(graph.tensor_bytes[t]) if t >= 0 else 0)
            consumers.append([])
            first.append(d)
        consumers[x].append(d)
        first[x] = min(first[x], d)
    return succ, producer, tensor, dst, nbytes, consumers, first


def simulate_workers(graph, op_us, placement, latency_us, bandwidth, costs=WorkerCosts()) -> WorkerTrace:
    """Run one step of ``placement`` with op times ``op_us`` (µs per op) on workers of one
    compute thread each (module docstring); links from ``latency_us`` and ``bandwidth``
    (bytes per µs), indexed [source, destination]; ``costs`` a :class:`WorkerCosts` for
    every device or a cluster whose devices hold them (:func:`device_costs`).

    Memory as the simulator counts it: an op's outputs from its start until its last
    local consumer has ended and each of its messages has arrived; a received copy from
    the moment its response leaves until its last consumer there has ended.
    """
    p = np.asarray(placement, dtype=np.int64)
    n = graph.n_ops
    D = len(latency_us)
    c_req, c_handler, c_enc, c_arr, c_dec = device_costs(costs, D)
    succ, producer, tensor, dst, nbytes, consumers, first = _transfers(graph, p)
    X = len(producer)
    missing = np.zeros(n, dtype=np.int64)
    np.add.at(missing, graph.edge_dst, 1)
    out_bytes = [int(b) for b in graph.out_bytes]
    # what keeps an op's outputs live: its local data edges and its data messages
    holders = [0] * n
    inputs_of = [[] for _ in range(n)]  # the local producers an op reads, one per data edge
    for s_, d_, t_ in zip(graph.edge_src.tolist(), graph.edge_dst.tolist(), graph.edge_tensor.tolist()):
        if t_ >= 0 and p[s_] == p[d_]:
            holders[s_] += 1
            inputs_of[d_].append(s_)
    copies_of = [[] for _ in range(n)]  # the received copies an op reads
    copy_holders = [0] * X
    for x in range(X):
        if tensor[x] >= 0:
            holders[producer[x]] += 1
            copy_holders[x] = len(consumers[x])
            for c in consumers[x]:
                copies_of[c].append(x)

    urgent = [deque() for _ in range(D)]  # arrivals: they take the core next
    front = [[] for _ in range(D)]        # taken from the end: last in, first out
    back = [deque() for _ in range(D)]
    running = [False] * D
    busy = np.zeros(D)
    live = np.zeros(D, np.int64)
    peak = np.zeros(D, np.int64)
    op_start, op_end = np.zeros(n), np.zeros(n)
    produced = [False] * X  # the _Send has run: the tensor waits in the sender's rendezvous
    handled = [False] * X  # the handler ran before the _Send
    issue, response, arrival = (np.full(X, np.nan) for _ in range(3))
    events = []
    seq = 0

    def at(t, kind, a, b=-1):
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, seq, kind, a, b))

    def duration(kind, i):
        if kind == OP:
            return float(op_us[i])
        if kind == REQUEST:
            return c_req[dst[i]]
        s = p[producer[i]]
        if kind == HANDLER:
            return c_handler[s] + (c_enc[s] * nbytes[i] if produced[i] else 0.0)
        if kind == SEND:
            return c_enc[s] * nbytes[i] if handled[i] else 0.0
        return c_arr[dst[i]] + c_dec[dst[i]] * nbytes[i]

    def alloc(d, b):
        live[d] += b
        peak[d] = max(peak[d], live[d])

    def release(op):
        holders[op] -= 1
        if holders[op] == 0:
            live[p[op]] -= out_bytes[op]

    def start(d, now):
        if running[d] or not (urgent[d] or front[d] or back[d]):
            return
        kind, i = urgent[d].popleft() if urgent[d] else front[d].pop() if front[d] else back[d].popleft()
        dur = duration(kind, i)
        if kind == OP:
            op_start[i], op_end[i] = now, now + dur
            alloc(d, out_bytes[i])
        elif kind == HANDLER and not produced[i]:
            handled[i] = True
        running[d] = True
        busy[d] += dur
        at(now + dur, TASK_END, d, kind * (n + X) + i)

    def respond(x, now):
        response[x] = now
        s = p[producer[x]]
        arrival[x] = now + latency_us[s, dst[x]] + nbytes[x] / bandwidth[s, dst[x]]
        alloc(dst[x], nbytes[x])
        at(arrival[x], RESPONSE_IN, x)

    def make_ready(ops, d):
        for c in ops:
            missing[c] -= 1
            if missing[c] == 0:
                back[d].append((OP, c))

    # Roots in node order, the first taken last: a _Recv node sits just before its first consumer.
    for d in range(D):
        roots = [(2 * int(op), 0, (OP, int(op))) for op in np.flatnonzero((p == d) & (missing == 0))]
        roots += [(2 * first[x] - 1, x, (REQUEST, x)) for x in range(X) if dst[x] == d]
        front[d] = [task for *_, task in sorted(roots)]
    for d in range(D):
        start(d, 0.0)
    while events:
        now, _, kind, a, b = heapq.heappop(events)
        if kind == TASK_END:
            d, (task, i) = a, divmod(b, n + X)
            running[d] = False
            if task == OP:
                for k, j in succ[i]:
                    if k == SEND:
                        front[d].append((SEND, j))
                        continue
                    missing[j] -= 1
                    if missing[j] == 0:
                        front[d].append((OP, j))
                if holders[i] == 0:
                    live[d] -= out_bytes[i]  # nothing holds its outputs
                for q in inputs_of[i]:
                    release(q)
                for x in copies_of[i]:
                    copy_holders[x] -= 1
                    if copy_holders[x] == 0:
                        live[d] -= nbytes[x]
            elif task == REQUEST:
                issue[i] = now
                at(now + latency_us[d, p[producer[i]]], REQUEST_IN, i)
            elif task == SEND:
                produced[i] = True
                if handled[i]:
                    respond(i, now)
            elif task == HANDLER and produced[i]:
                respond(i, now)
            elif task == RECEIVE:
                make_ready(consumers[i], d)
            start(d, now)
        elif kind == REQUEST_IN:
            s = int(p[producer[a]])
            back[s].append((HANDLER, a))
            start(s, now)
        else:
            d = dst[a]
            if tensor[a] >= 0:
                release(producer[a])
            if c_arr[d] or c_dec[d]:
                urgent[d].append((RECEIVE, a))
            else:
                make_ready(consumers[a], d)
            start(d, now)
    return WorkerTrace(op_start, op_end, np.asarray(producer, np.int64), np.asarray(tensor, np.int64),
                       np.asarray(dst, np.int64), issue, response, arrival, busy, peak)
