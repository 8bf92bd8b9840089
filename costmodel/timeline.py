"""Measured timelines: why a placement's real step takes what it takes (no TensorFlow here).

A timeline file (format ``placetool.timeline``, version 1; written by
:func:`placetool.costmodel.tf.trace_capture.capture`) holds traced steps of one placement::

    {"format": "placetool.timeline", "version": 1, "graph": "mlp", "n_ops": 93,
     "devices": ["/job:worker/replica:0/task:0/device:CPU:0", ...], "kinds": ["cpu", ...],
     "placement": {"OP": device index, ...},
     "untraced_step_us": [...],                      # wall time of steps without tracing
     "steps": [{"wall_us": ..,                       # wall time of this traced step
                "ops": [[OP, device, start_us, dur_us], ...],
                "recv": [[EDGE, PRODUCER, src, dst, bytes, start_us, dur_us], ...]}],
     "single": {"device": 0, "step_us": .., "op_us": {"OP": median_us, ...}},  # optional
     "out_order": {"OP": ["CONSUMER", "@send:1", ...], ...}}                   # optional

Times are µs from the step's first record. ``recv`` are the ``RecvTensor`` RPCs as the
receiving worker logs them. The record's end is when the tensor arrived. Its start is the
later of two times: when the receiver issued the call, and when the sender began its
response. TensorFlow stamps the second (``send_start_micros``) on the sender as it
encodes the tensor, once both the request and the tensor are there. So the start is
the *response start*: for a tensor produced before the call came, the request's
arrival at the sender; otherwise when the sender's ``_Send`` ran. Each transfer is read
as producer end <= response start <= arrival <= first consumer start (so it was in every
recorded step). Its *wire time* is arrival - max(producer end, response start). Its
*delivery time* is arrival - producer end, which adds the wait for the response to start.

``out_order`` is the order in which each worker's executor readies an op's consumers,
read from the run's partition graphs (:func:`placetool.costmodel.tf.trace_capture.executor_order`):
a consumer on the same device by name, a message to device K as ``"@send:K"`` (the
tensor's ``_Send``) or ``"@ctrl:K"`` (a control edge's). The run queue takes the last one
first, so where a ``_Send`` stands among its producer's consumers decides whether the
tensor leaves at once or after the local work they start; the partitioned graph, not the
model's, decides that order (:meth:`Recording.executed_graph`).

:func:`breakdown` splits each device's step into busy (running graph ops), ready
(an op of it had every input and had not started: the executor's own gaps), transfer
(an op had every input produced but one was still in flight) and nothing ready (waiting on
another device's compute, or the step's head and tail). :func:`replay` simulates the step
with the traced op durations put in, so what remains against the measurement is the
error of the simulator's schedule and communication rules alone.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import UserError, read_parsed

FORMAT = "placetool.timeline"
VERSION = 1
#: transfers up to this size set a traced link's latency; larger ones its bandwidth
SMALL_BYTES = 64 * 1024
#: the transfer rules :func:`replay` can put under a traced step
REPLAYS = ("fifo", "concurrent", "idle", "traced")
#: the replay on workers of one compute thread (:mod:`placetool.costmodel.workers`); needs a cluster's links
WORKERS = "workers"


class TimelineError(UserError):
    """A timeline file is malformed or belongs to another graph; the message says which."""


@dataclass
class Step:
    """One traced step, indexed by the graph's ops (µs; NaN / -1 where an op was not traced)."""

    op_dev: np.ndarray
    op_start: np.ndarray
    op_end: np.ndarray
    x_edge: list[str]
    x_producer: np.ndarray      # op index, -1 if the edge names no graph op
    x_src: np.ndarray
    x_dst: np.ndarray
    x_bytes: np.ndarray         # int64
    x_start: np.ndarray         # response start: the later of the call's issue and the sender's send start
    x_end: np.ndarray           # RecvTensor record's end: the tensor's arrival
    x_control: np.ndarray       # bool: a control edge's zero-byte message
    x_producer_end: np.ndarray  # NaN where the producer is unknown
    x_consumer_start: np.ndarray  # first consumer on the destination; NaN if none traced
    wall_us: float = float("nan")

    @property
    def n_transfers(self) -> int:
        return len(self.x_edge)

    @property
    def traced(self) -> np.ndarray:
        return np.isfinite(self.op_start)

    @property
    def t0(self) -> float:
        return float(np.nanmin(self.op_start)) if self.traced.any() else 0.0

    @property
    def span_us(self) -> float:
        """First op start to last op end: the step as its ops saw it."""
        return float(np.nanmax(self.op_end) - self.t0) if self.traced.any() else 0.0

    @property
    def op_us(self) -> np.ndarray:
        return self.op_end - self.op_start

    @property
    def wire_us(self) -> np.ndarray:
        """Per transfer: arrival - max(producer end, response start): the response's own time."""
        return self.x_end - np.fmax(self.x_producer_end, self.x_start)

    @property
    def delivery_us(self) -> np.ndarray:
        """Per transfer: arrival - producer end (the wire time plus any wait for the
        response to start): what the consumer saw."""
        return self.x_end - self.x_producer_end


@dataclass
class Recording:
    """A timeline file read against its graph."""

    graph: object
    devices: list[str]
    kinds: list[str]
    placement: np.ndarray
    steps: list[Step]
    untraced_step_us: list[float] = field(default_factory=list)
    single_device: int | None = None
    single_step_us: float | None = None
    single_op_us: np.ndarray | None = None   # per op, NaN where not traced
    out_order: dict | None = None            # op -> its consumers in the executor's order (module docstring)
    _executed: object = field(default=None, repr=False, compare=False)

    @property
    def n_devices(self) -> int:
        return len(self.devices)

    def executed_graph(self):
        """The graph with each op's out-edges in the traced run's executor order
        (``out_order``, :func:`edge_order`): what a replay on workers of one compute thread
        runs. The graph itself where the file records no order."""
        if not self.out_order:
            return self.graph
        if self._executed is None:
            from dataclasses import replace

            o = edge_order(self.graph, self.placement, self.out_order)
            g = self.graph
            self._executed = replace(g, edge_src=g.edge_src[o], edge_dst=g.edge_dst[o], edge_tensor=g.edge_tensor[o])
        return self._executed

    def device_names(self) -> list[str]:
        return [f"{k}:{i}" for i, k in enumerate(self.kinds)]


def message_entry(device: int, control: bool = False) -> str:
    """``out_order``'s name for an op's message to ``device``: ``"@send:K"`` or ``"@ctrl:K"``."""
    return f"@{'ctrl' if control else 'send'}:{int(device)}"


def edge_order(graph, placement, out_order: dict) -> np.ndarray:
    """A permutation of ``graph``'s edges (new edge i = old edge ``order[i]``) that puts each
    op's out-edges in ``out_order``'s order under ``placement``: an edge to a consumer on
    the producer's device where ``out_order`` names that consumer, one to another device
    where it names the message (:func:`message_entry`); edges it does not name follow, as
    they were. Edges keep their places in the list as a set per producer.

    >>> from placetool.costmodel.graph import OpGraph
    >>> g = OpGraph.from_arrays("g", ["a", "b", "c", "d"], ["X"] * 4, [8] * 4, [0, 0, 0], [1, 2, 3])
    >>> edge_order(g, np.array([0, 0, 0, 1]), {"a": ["@send:1", "c", "b"]}).tolist()
    [2, 1, 0]
    """
    src, dst, ten = graph.edge_src, graph.edge_dst, graph.edge_tensor
    E = len(src)
    p = np.asarray(placement)
    key = np.full(E, np.inf)
    rank = {(graph.index[op], c): r for op, entries in out_order.items() if op in graph.index
            for r, c in reversed(list(enumerate(entries)))}
    for e in range(E):
        s, d = int(src[e]), int(dst[e])
        c = graph.names[d] if p[s] == p[d] else message_entry(p[d], bool(ten[e] < 0))
        key[e] = rank.get((s, c), np.inf)
    at = np.lexsort((np.arange(E), src))          # each producer's edges, where they are
    ranked = np.lexsort((np.arange(E), key, src))  # the same, in the executor's order
    order = np.empty(E, np.int64)
    order[at] = ranked
    return order


# ------------------------------------------------------------------ reading
def load(src, graph) -> Recording:
    """Read a timeline (path or dict) against ``graph``; every op it names must be there."""
    where = str(src) if not isinstance(src, dict) else "timeline"
    if isinstance(src, dict):
        d = src
    else:
        d = read_parsed(Path(src), lambda p: json.loads(p.read_text()), TimelineError, "timeline",
                        "not a timeline file", (UnicodeDecodeError, json.JSONDecodeError, RecursionError))
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise TimelineError(f"{where}: not a {FORMAT} file")
    if d.get("version") != VERSION:
        raise TimelineError(f"{where}: {FORMAT} version {d.get('version')!r} is not supported (expected {VERSION})")
    try:
        devices, kinds = [str(x) for x in d["devices"]], [str(x) for x in d["kinds"]]
        D = len(devices)
        if D == 0 or len(kinds) != D:
            raise TimelineError(f"{where}: 'devices' and 'kinds' must be non-empty and of equal length")
        idx = graph.index

        def op_index(name, what):
            i = idx.get(name)
            if i is None:
                raise TimelineError(f"{where}: {what} names op {name!r}, which graph {graph.name!r} lacks "
                                    "(a timeline is read with the graph it was traced from)")
            return i

        def dev(v, what):
            v = int(v)
            if not 0 <= v < D:
                raise TimelineError(f"{where}: {what}: device {v} is not one of 0..{D - 1}")
            return v

        placement = np.full(graph.n_ops, -1, np.int64)
        for name, v in d["placement"].items():
            placement[op_index(name, "placement")] = dev(v, f"placement of {name!r}")
        if (placement < 0).any():
            raise TimelineError(f"{where}: placement names no device for op "
                                f"{graph.names[int(np.flatnonzero(placement < 0)[0])]!r}")
        steps = [_step(s, graph, placement, op_index, dev, where, k) for k, s in enumerate(d["steps"])]
        if not steps:
            raise TimelineError(f"{where}: no traced steps")
        rec = Recording(graph, devices, kinds, placement, steps,
                        [float(x) for x in d.get("untraced_step_us", [])])
        if d.get("single"):
            s = d["single"]
            rec.single_device = int(s["device"])
            rec.single_step_us = float(s["step_us"])
            rec.single_op_us = np.full(graph.n_ops, np.nan)
            for name, v in s["op_us"].items():
                rec.single_op_us[op_index(name, "single")] = float(v)
        if d.get("out_order"):
            o = d["out_order"]
            if not isinstance(o, dict) or not all(isinstance(v, list) for v in o.values()):
                raise TimelineError(f"{where}: 'out_order' must map each op to a list of consumers")
            for name in o:
                op_index(name, "out_order")
            rec.out_order = {str(k): [str(c) for c in v] for k, v in o.items()}
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise TimelineError(f"{where}: malformed timeline ({type(e).__name__}: {e})") from None
    return rec


def _step(s, graph, placement, op_index, dev, where, k) -> Step:
    n = graph.n_ops
    op_dev = np.full(n, -1, np.int64)
    start = np.full(n, np.nan)
    end = np.full(n, np.nan)
    for name, d, t, dur in s["ops"]:
        i = op_index(name, f"step {k}")
        t, dur = float(t), float(dur)
        if dur < 0 or not np.isfinite(t + dur):
            raise TimelineError(f"{where}: step {k}: op {name!r} has a bad time ({t}, {dur})")
        if np.isnan(start[i]):
            op_dev[i], start[i], end[i] = dev(d, f"step {k}, op {name!r}"), t, t + dur
        else:  # an op run twice in a step: its span covers both
            start[i], end[i] = min(start[i], t), max(end[i], t + dur)
    X = s["recv"]
    edge = [str(r[0]) for r in X]
    prod = np.array([op_index(r[1], f"step {k}") if r[1] else -1 for r in X], np.int64)
    src = np.array([dev(r[2], f"step {k}, transfer {r[0]!r}") for r in X], np.int64)
    dst = np.array([dev(r[3], f"step {k}, transfer {r[0]!r}") for r in X], np.int64)
    nb = np.array([int(r[4]) for r in X], np.int64)
    xs = np.array([float(r[5]) for r in X])
    xe = xs + np.array([float(r[6]) for r in X])
    st = Step(op_dev, start, end, edge, prod, src, dst, nb, xs, xe, np.zeros(len(X), bool),
              np.full(len(X), np.nan), np.full(len(X), np.nan), float(s.get("wall_us", np.nan)))
    _link_transfers(st, graph, placement)
    return st


def _consumers(graph, placement):
    """{(producer op, destination device): (data {tensor: [consumer ops]}, [control consumers])}."""
    out: dict = {}
    for s, d, t in zip(graph.edge_src.tolist(), graph.edge_dst.tolist(), graph.edge_tensor.tolist()):
        if placement[s] == placement[d]:
            continue
        data, ctrl = out.setdefault((s, int(placement[d])), ({}, []))
        if t >= 0:
            data.setdefault(t, []).append(d)
        else:
            ctrl.append(d)
    return out


def _link_transfers(st: Step, graph, placement) -> None:
    """Each transfer's producer end, kind (data or control) and first consumer start."""
    cons = _consumers(graph, placement)
    for x in range(st.n_transfers):
        p = int(st.x_producer[x])
        if p < 0:
            continue
        st.x_producer_end[x] = st.op_end[p]
        data, ctrl = cons.get((p, int(st.x_dst[x])), ({}, []))
        ops = _matching(graph, data, int(st.x_bytes[x]), st.op_start, float(st.x_end[x]))
        if not ops and ctrl:
            st.x_control[x] = True
            ops = ctrl
        elif st.x_bytes[x] == 0 and ctrl and not any(graph.tensor_bytes[t] == 0 for t in data):
            st.x_control[x] = True
            ops = ctrl
        starts = st.op_start[ops] if ops else np.array([])
        starts = starts[np.isfinite(starts)]
        if starts.size:
            st.x_consumer_start[x] = float(starts.min())


def _matching(graph, data: dict, nbytes: int, start, arrival: float) -> list[int]:
    """Consumers of the tensor of this size, else of every tensor sent. The edge name
    says the producer, not which output: where several outputs could be this one, those
    whose consumers started before it arrived were not it."""
    same = [t for t in data if int(graph.tensor_bytes[t]) == nbytes] or list(data)
    if len(same) > 1:
        later = [t for t in same if all(not start[c] < arrival for c in data[t])]
        same = later or same
    return [c for t in same for c in data[t]]


# ------------------------------------------------------------------ intervals
def _union(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint sorted intervals covering [a_i, b_i) (empty ones dropped)."""
    keep = b > a
    a, b = a[keep], b[keep]
    if not a.size:
        return a, b
    o = np.argsort(a, kind="stable")
    a, b = a[o], np.maximum.accumulate(b[o])
    new = np.r_[True, a[1:] > b[:-1]]
    last = np.r_[np.flatnonzero(new)[1:] - 1, len(a) - 1]
    return a[new], b[last]


def _measure(a, b) -> float:
    a, b = _union(np.asarray(a, float), np.asarray(b, float))
    return float((b - a).sum())


def _minus(a, b, ca, cb) -> float:
    """Length of union(a, b) not covered by union(ca, cb)."""
    ua, ub = _union(np.asarray(a, float), np.asarray(b, float))
    both = _measure(np.r_[ua, ca], np.r_[ub, cb])
    return both - _measure(ca, cb)


# ------------------------------------------------------------------ breakdown
def input_times(st: Step, graph, placement):
    """Per op: (time its last local input was done, time its last remote input was
    produced, time its last remote input arrived); 0 for none, NaN where unknown."""
    n = graph.n_ops
    local = np.zeros(n)
    produced = np.zeros(n)
    arrived = np.zeros(n)
    arr = {}
    for x in range(st.n_transfers):
        p = int(st.x_producer[x])
        if p >= 0:
            key = (p, int(st.x_dst[x]), bool(st.x_control[x]))
            arr[key] = max(arr.get(key, -np.inf), float(st.x_end[x]))
    for s, d, t in zip(graph.edge_src.tolist(), graph.edge_dst.tolist(), graph.edge_tensor.tolist()):
        e = st.op_end[s]
        if placement[s] == placement[d]:
            local[d] = max(local[d], e) if np.isfinite(e) else np.nan
            continue
        produced[d] = max(produced[d], e) if np.isfinite(e) else np.nan
        a = arr.get((s, int(placement[d]), t < 0), arr.get((s, int(placement[d]), t >= 0), e))
        arrived[d] = max(arrived[d], a) if np.isfinite(a) else np.nan
    return local, produced, arrived


def breakdown(rec: Recording, step: int | Step = 0) -> dict:
    """Where each device's time went in one traced step (µs over the step's span).

    Per device: ``busy`` (its graph ops ran), ``ready`` (idle while one of its ops had
    every input and had not started: the runtime's gaps between ops), ``transfer`` (idle
    while one of its ops had every input produced but one still in flight), ``nothing``
    (idle with nothing ready: waiting on another device's compute, or before its first
    and after its last op). The four add up to the span. Step-wide: ``none_busy`` (no
    device ran an op) and ``none_busy_in_flight`` (... while a transfer was in flight).
    """
    st = rec.steps[step] if isinstance(step, int) else step
    g, p = rec.graph, rec.placement
    t0 = st.t0
    T1 = t0 + st.span_us
    local, produced, arrived = input_times(st, g, p)
    ready_at = np.fmax(local, arrived)
    produced_all = np.fmax(local, produced)
    ok = st.traced
    devs = []
    for d in range(rec.n_devices):
        m = ok & (st.op_dev == d)
        bs, be = st.op_start[m], st.op_end[m]
        busy = _measure(bs, be)
        # [ready, start): the op could have run; [produced, min(arrival, start)): data in flight
        ra, rb = ready_at[m], st.op_start[m]
        fin = np.isfinite(ra)
        ready = _minus(ra[fin], rb[fin], bs, be)
        xa, xb = produced_all[m], np.fmin(ready_at[m], st.op_start[m])
        fin = np.isfinite(xa) & np.isfinite(xb)
        transfer = _minus(xa[fin], xb[fin], np.r_[bs, ra[np.isfinite(ra)]], np.r_[be, rb[np.isfinite(ra)]])
        devs.append({"device": d, "name": rec.device_names()[d], "ops": int(m.sum()), "busy_us": busy,
                     "ready_us": ready, "transfer_us": transfer,
                     "nothing_ready_us": max(0.0, (T1 - t0) - busy - ready - transfer)})
    all_busy_a, all_busy_b = st.op_start[ok], st.op_end[ok]
    none_busy = (T1 - t0) - _measure(all_busy_a, all_busy_b)
    known = np.isfinite(st.x_producer_end)
    fa = np.fmax(st.x_producer_end[known], st.x_start[known])
    in_flight = _minus(fa, st.x_end[known], all_busy_a, all_busy_b)
    return {"span_us": st.span_us, "wall_us": st.wall_us, "devices": devs, "none_busy_us": none_busy,
            "none_busy_in_flight_us": in_flight}


def transfers(rec: Recording, step: int | Step = 0) -> list[dict]:
    """Per transfer of one step, in arrival order: edge, producer, src, dst, bytes, kind,
    producer end, response start, arrival, first consumer start (µs from the first op start),
    wire time, delivery time and the wait after arrival."""
    st = rec.steps[step] if isinstance(step, int) else step
    t0 = st.t0
    names = rec.graph.names
    out = []
    for x in np.argsort(st.x_end, kind="stable"):
        pe, cs = st.x_producer_end[x], st.x_consumer_start[x]
        out.append({"edge": st.x_edge[x], "producer": names[st.x_producer[x]] if st.x_producer[x] >= 0 else None,
                    "src": int(st.x_src[x]), "dst": int(st.x_dst[x]), "bytes": int(st.x_bytes[x]),
                    "kind": "control" if st.x_control[x] else "data",
                    "producer_end_us": _f(pe - t0), "recv_start_us": float(st.x_start[x] - t0),
                    "recv_end_us": float(st.x_end[x] - t0), "consumer_start_us": _f(cs - t0),
                    "wire_us": _f(st.wire_us[x]), "delivery_us": _f(st.delivery_us[x]),
                    "after_arrival_us": _f(cs - st.x_end[x])})
    return out


def _f(v) -> float | None:
    return float(v) if np.isfinite(v) else None


def op_inflation(rec: Recording, step: int | Step | None = None) -> dict:
    """Each op's time in this placement against its time on one device.

    ``step`` None: the median over the traced steps. Returns {ops: [{op, device, split_us,
    single_us, ratio}], per device {split_us, single_us, ratio} over the ops both traced,
    total}; empty without a single-device trace.
    """
    if rec.single_op_us is None:
        return {}
    if step is None:
        split = np.nanmedian(np.array([s.op_us for s in rec.steps]), axis=0) if len(rec.steps) > 1 \
            else rec.steps[0].op_us
    else:
        split = (rec.steps[step] if isinstance(step, int) else step).op_us
    one = rec.single_op_us
    both = np.isfinite(split) & np.isfinite(one)
    names = rec.graph.names
    ops = [{"op": names[i], "device": int(rec.placement[i]), "split_us": float(split[i]),
            "single_us": float(one[i]), "ratio": float(split[i] / one[i]) if one[i] > 0 else None}
           for i in np.flatnonzero(both)]
    per_dev = []
    for d in range(rec.n_devices):
        m = both & (rec.placement == d)
        a, b = float(split[m].sum()), float(one[m].sum())
        per_dev.append({"device": d, "ops": int(m.sum()), "split_us": a, "single_us": b,
                        "ratio": a / b if b > 0 else None})
    a, b = float(split[both].sum()), float(one[both].sum())
    return {"ops": ops, "devices": per_dev, "split_us": a, "single_us": b, "ratio": a / b if b > 0 else None}


# ------------------------------------------------------------------ replay
def traced_cluster(rec: Recording, steps=None):
    """A cluster whose links are read off the traced transfers: per directed pair, latency
    the median wire time of its data transfers up to ``SMALL_BYTES``, bandwidth from the
    larger ones (none: no per-byte cost); no device-side send/receive cost, since the
    traced op durations already hold what transfers cost the devices' cores."""
    from .calibration import UNMEASURED_BANDWIDTH
    from .cluster import Cluster

    D = rec.n_devices
    steps = rec.steps if steps is None else steps
    wire = {(a, b): ([], []) for a in range(D) for b in range(D) if a != b}
    for st in steps:
        w = st.wire_us
        for x in range(st.n_transfers):
            if st.x_control[x] or not np.isfinite(w[x]):
                continue
            wire[(int(st.x_src[x]), int(st.x_dst[x]))][0].append(int(st.x_bytes[x]))
            wire[(int(st.x_src[x]), int(st.x_dst[x]))][1].append(max(float(w[x]), 0.0))
    all_small = [t for nb, ts in wire.values() for b, t in zip(nb, ts) if b <= SMALL_BYTES]
    default = float(np.median(all_small)) if all_small else 0.0
    pairs = []
    for (a, b), (nb, ts) in wire.items():
        nb, ts = np.array(nb, float), np.array(ts, float)
        small = nb <= SMALL_BYTES
        lat = float(np.median(ts[small])) if small.any() else default
        bw = UNMEASURED_BANDWIDTH
        big = ~small
        if big.any():
            extra = ts[big] - lat
            if np.median(extra) > 0:
                bw = float(np.median(nb[big][extra > 0] / extra[extra > 0]))
        pairs.append({"src": f"{rec.kinds[a]}:{a}", "dst": f"{rec.kinds[b]}:{b}", "latency_us": lat,
                      "bandwidth_bytes_per_us": bw})
    return Cluster.from_dict({
        "name": "traced-links",
        "metadata": {"source": "link latency and bandwidth read off a measured timeline"},
        "devices": [{"name": f"{k}:{i}", "kind": k, "memory_bytes": 1 << 50} for i, k in enumerate(rec.kinds)],
        "links": {"default": {"latency_us": default, "bandwidth_bytes_per_us": UNMEASURED_BANDWIDTH},
                  "pairs": pairs},
    }, source="traced links")


def replay(rec: Recording, step: int | Step = 0, cluster=None, ready_us: float = 0.0,
           links: str = "fifo", costs=None) -> dict:
    """Simulate a traced step with its own op durations (oracle op times).

    Transfers: ``cluster`` None takes the links of :func:`traced_cluster` (the wire times
    this trace measured; no device-side transfer cost), else ``cluster``'s link and
    device transfer model (e.g. a calibrated one) — then what differs is the error of
    that model's communication parameters as well as of the rules. ``links``: ``"fifo"``
    runs the simulator with transfers on one directed link one at a time (links.queue
    "fifo"); ``"concurrent"`` runs it with transfers side by side, each taking latency +
    bytes / bandwidth from when it is sent (links.queue "none", as gRPC runs RecvTensor
    calls); the two differ by what the link queue alone costs; ``"traced"`` runs the
    simulator's list schedule (:func:`list_schedule`) with each transfer taking its own
    traced delivery time, arrival - producer end (control messages too), so only op
    order and the runtime's gaps remain unmodelled; None (with ``cluster``) runs the
    simulator under the cluster's own links.queue and links.send; ``"workers"`` (with
    ``cluster``, whose links should be lone transfers' latency + bytes / bandwidth) runs
    :func:`placetool.costmodel.workers.simulate_workers`, TensorFlow's run queue with
    each op's consumers in the executor's order where the file records it
    (:meth:`Recording.executed_graph`) and ``costs`` per message on the compute threads
    (default: a ``links.send`` "workers" cluster's own, else
    :data:`~placetool.costmodel.workers.TESTBED_COSTS`; the result's ``costs`` are the
    devices' means). ``ready_us`` is added to every traced op (the runtime's gap per op,
    which op durations omit). Control edges across devices cost nothing but in
    ``"traced"``; the trace's zero-byte control
    messages are counted in ``control_transfers``.

    Returns {replay_us, measured_us (the step's traced span), error_pct, wall_us, links,
    cluster (its name), ready_us, transfers, control_transfers}.
    """
    from .simulate import CostModel

    if links is None and cluster is None:
        raise TimelineError("links None replays under a cluster's own rules: give the cluster")
    if links is not None and links not in REPLAYS + (WORKERS,):
        raise TimelineError(f"links {links!r}: expected one of {', '.join(map(repr, REPLAYS + (WORKERS,)))}")
    st = rec.steps[step] if isinstance(step, int) else step
    g = rec.graph
    if links == WORKERS and cluster is None:
        raise TimelineError("links 'workers' puts each message's CPU on the compute threads: give the cluster "
                            "whose links are the lone transfers (e.g. the calibrated one)")
    cl = traced_cluster(rec, [st]) if cluster is None else cluster
    if cl.n_devices != rec.n_devices:
        raise TimelineError(f"cluster {cl.name!r} has {cl.n_devices} devices; the timeline has {rec.n_devices}")
    if links not in ("traced", None, WORKERS):  # the rule under test is the simulator's
        from dataclasses import replace

        cl = replace(cl, link_queue="fifo" if links == "fifo" else "none",
                     link_send="idle" if links == "idle" else "eager")
    dur = np.where(st.traced, st.op_us + ready_us, 0.0)
    p = np.ascontiguousarray(rec.placement, np.int32)
    extra = {}
    if links == WORKERS:
        ms, extra["costs"] = _workers_span(st, rec.executed_graph(), dur, p, cl, costs)
    else:
        cm = CostModel(g, cl, op_times=np.repeat(dur[:, None], cl.n_devices, axis=1))
        reason = cm.violation(p)
        if reason:
            raise TimelineError(f"cannot replay: {reason}")
        if links != "traced":
            ms = float(cm.simulate(p).step_time_us)
        else:
            wire = {}
            w = st.delivery_us
            for x in range(st.n_transfers):
                if st.x_producer[x] >= 0 and np.isfinite(w[x]):
                    key = (int(st.x_producer[x]), int(st.x_dst[x]), bool(st.x_control[x]))
                    wire[key] = max(wire.get(key, 0.0), max(float(w[x]), 0.0))
            ms = float(list_schedule(g, dur, p, cl.latency_us, cl.bandwidth_bytes_per_us, wire)[1].max(initial=0.0))
    meas = st.span_us
    return {"replay_us": ms, "measured_us": meas,
            "error_pct": 100.0 * (ms - meas) / meas if meas > 0 else None,
            "wall_us": st.wall_us, "links": links, "cluster": cl.name,
            "ready_us": float(ready_us), "transfers": int((~st.x_control).sum()),
            "control_transfers": int(st.x_control.sum()), "simulated_transfers": simulated_transfers(g, p), **extra}


def _workers_span(st: Step, graph, dur, p, cluster, costs) -> tuple[float, dict]:
    """The traced span of ``st`` replayed on workers of one compute thread (op times
    ``dur``), and the costs it used (the devices' means)."""
    from .workers import TESTBED_COSTS, device_costs, simulate_workers

    if costs is None:  # a "workers" cluster carries its own; any other, the testbed's
        costs = cluster if cluster.link_send == "workers" else TESTBED_COSTS
    t = simulate_workers(graph, dur, p, cluster.latency_us, cluster.bandwidth_bytes_per_us, costs)
    used = device_costs(costs, cluster.n_devices).mean(axis=1).tolist()
    return t.span_us(st.traced), dict(zip(("request_us", "handler_us", "send_us_per_byte", "arrive_us",
                                           "recv_us_per_byte"), used))


def simulated_transfers(graph, placement) -> int:
    """How many transfers the simulator makes of a placement: one per (tensor,
    destination device) across devices. Fewer traced data transfers than this means
    RecvTensor records missing from the step's trace."""
    p = np.asarray(placement, np.int64)
    t = graph.edge_tensor
    cross = (t >= 0) & (p[graph.edge_src] != p[graph.edge_dst])
    return int(len(set(zip(t[cross].tolist(), p[graph.edge_dst[cross]].tolist()))))


def list_schedule(graph, dur, placement, latency_us, bandwidth, wire=None) -> tuple[np.ndarray, np.ndarray]:
    """(op start, op end) of the simulator's list schedule with uncontended transfers.

    Each device runs one op at a time, the ready one with the smallest (ready time,
    topological rank) first, as in the simulator; a tensor needed on another device
    arrives ``latency + bytes / bandwidth`` after its producer ends, whatever else is in
    flight; a control edge across devices costs nothing. ``wire``: {(producer op,
    destination device, is control): µs} overrides those delays where it has an entry.
    """
    import heapq

    n = graph.n_ops
    p = np.asarray(placement, np.int64)
    rank = graph.topo_rank
    missing = np.zeros(n, np.int64)
    out = [[] for _ in range(n)]
    for s, d, t in zip(graph.edge_src.tolist(), graph.edge_dst.tolist(), graph.edge_tensor.tolist()):
        missing[d] += 1
        delay = 0.0
        if p[s] != p[d]:
            if wire is not None and (s, int(p[d]), t < 0) in wire:
                delay = wire[(s, int(p[d]), t < 0)]
            elif t >= 0:
                delay = float(latency_us[p[s], p[d]] + graph.tensor_bytes[t] / bandwidth[p[s], p[d]])
        out[s].append((d, delay))
    D = int(p.max(initial=-1)) + 1
    ready = [[] for _ in range(D)]
    running = [False] * D
    ready_t = np.zeros(n)
    start, end = np.zeros(n), np.zeros(n)
    ev = [(0.0, 1, int(rank[i]), i) for i in range(n) if missing[i] == 0]
    heapq.heapify(ev)
    while ev:
        now = ev[0][0]
        while ev and ev[0][0] == now:
            _, kind, r, i = heapq.heappop(ev)
            if kind == 0:  # op done
                running[p[i]] = False
                for c, delay in out[i]:
                    ready_t[c] = max(ready_t[c], now + delay)
                    missing[c] -= 1
                    if missing[c] == 0:
                        heapq.heappush(ev, (ready_t[c], 1, int(rank[c]), c))
            else:
                heapq.heappush(ready[p[i]], (now, r, i))
        for d in range(D):
            if not running[d] and ready[d]:
                _, r, i = heapq.heappop(ready[d])
                running[d] = True
                start[i], end[i] = now, now + float(dur[i])
                heapq.heappush(ev, (end[i], 0, r, i))
    return start, end


# ------------------------------------------------------------------ the whole account
def median_step(rec: Recording) -> int:
    """The traced step whose span is the median one (the lower middle of an even count)."""
    spans = [s.span_us for s in rec.steps]
    return int(np.argsort(spans, kind="stable")[(len(spans) - 1) // 2])


def _stolen(rec: Recording, k: int) -> list:
    """Per device, the CPU time transfers took from it in step ``k``
    (:func:`placetool.costmodel.commfit.stolen_cpu`); empty without a single-device trace."""
    if rec.single_op_us is None:
        return []
    from .commfit import _own_single, stolen_cpu

    return stolen_cpu(rec, k, _own_single(rec))


def order_agreement(graph, step: Step) -> dict:
    """How often each device's traced choice of its next op agrees with an ordering
    rule, over the choices that had two or more ready ops: ``decisions``, and per rule
    the share of them it agrees with (ties agree): ``simulator`` (earliest ready, then
    lowest topological rank, as the simulator orders a device's ready ops),
    ``earliest_ready`` and ``latest_ready``. An op is ready when its local inputs ended
    and its remote ones arrived; an op with an input of unseen arrival is left out of
    the choices. ``mixed``: the choices among both kinds of ready op, those whose last
    input arrived from another device and those readied on the device itself, and
    ``remote_chosen``: the share of them in which the executor ran one of the first kind."""
    preds = [[] for _ in range(graph.n_ops)]
    for s, d in zip(graph.edge_src.tolist(), graph.edge_dst.tolist()):
        preds[d].append(s)
    arrived = {(int(step.x_producer[x]), int(step.x_dst[x])): step.x_end[x]
               for x in np.flatnonzero(step.x_producer >= 0) if np.isfinite(step.x_end[x])}
    ready = np.full(graph.n_ops, np.nan)
    remote = np.zeros(graph.n_ops, bool)  # its last input came from another device
    for o in np.flatnonzero(step.traced):
        d = step.op_dev[o]
        ins = [(step.op_end[q], False) if step.op_dev[q] == d else (arrived.get((q, int(d)), np.nan), True)
               for q in preds[o] if step.traced[q]]
        ready[o] = np.max([t for t, _ in ins], initial=step.t0)  # NaN where an arrival is unseen
        remote[o] = bool(ins) and max(ins)[1]
    rank = graph.topo_rank
    n = {"simulator": 0, "earliest_ready": 0, "latest_ready": 0}
    decisions = mixed = remote_chosen = 0
    for d in np.unique(step.op_dev[step.traced]):
        on = np.flatnonzero(step.traced & (step.op_dev == d))
        on = on[np.argsort(step.op_start[on], kind="stable")]
        for j, o in enumerate(on):
            rest = on[j:]
            cand = rest[ready[rest] <= step.op_start[o]]  # NaN (unseen) compares False
            if len(cand) < 2 or np.isnan(ready[o]):
                continue
            decisions += 1
            r = ready[cand]
            n["earliest_ready"] += ready[o] == r.min()
            n["latest_ready"] += ready[o] == r.max()
            n["simulator"] += (ready[o], rank[o]) == min(zip(r, rank[cand]))
            if remote[cand].any() and not remote[cand].all():
                mixed += 1
                remote_chosen += remote[o]
    return {"decisions": decisions, **{k: v / decisions if decisions else float("nan") for k, v in n.items()},
            "mixed": mixed, "remote_chosen": remote_chosen / mixed if mixed else float("nan")}


def explain(rec: Recording, step: int | None = None, cluster=None) -> dict:
    """Everything ``placetool explain`` reports about one traced step (default: the
    median one): :func:`breakdown`, :func:`transfers`, :func:`op_inflation`, the CPU
    time transfers took per device (``stolen``: op growth plus idle gaps with every input
    there, :mod:`placetool.costmodel.commfit`), how the executor ordered each device's
    ready ops (:func:`order_agreement`) and the replays (:data:`REPLAYS`: the
    simulator's link queue, transfers side by side, sent by idle workers, each its
    traced time; plus, when ``cluster`` is given, its model and its links under the
    workers' run queue, ``"workers"``), with the spread of the traced
    steps' spans."""
    k = median_step(rec) if step is None else int(step)
    if not 0 <= k < len(rec.steps):
        raise TimelineError(f"step {k}: the timeline has steps 0..{len(rec.steps) - 1}")
    st = rec.steps[k]
    spans = [s.span_us for s in rec.steps]
    xs = transfers(rec, k)
    data = [x for x in xs if x["kind"] == "data" and x["wire_us"] is not None]
    out = {"graph": rec.graph.name, "ops": rec.graph.n_ops, "devices": rec.device_names(),
           "tf_devices": rec.devices, "step": k, "median_step": median_step(rec), "steps": len(rec.steps),
           "span_us": st.span_us,
           "spans_us": spans, "wall_us": st.wall_us,
           "untraced_step_us": float(np.median(rec.untraced_step_us)) if rec.untraced_step_us else None,
           "single_step_us": rec.single_step_us,
           "breakdown": breakdown(rec, k), "transfers": xs,
           "n_data_transfers": len([x for x in xs if x["kind"] == "data"]),
           "n_control_transfers": len([x for x in xs if x["kind"] == "control"]),
           "median_wire_us": float(np.median([x["wire_us"] for x in data])) if data else None,
           "simulated_transfers": simulated_transfers(rec.graph, rec.placement),
           "inflation": op_inflation(rec),
           "stolen": _stolen(rec, k),
           "order": order_agreement(rec.graph, st),
           "replay": {m: replay(rec, k, links=m) for m in REPLAYS}}
    if cluster is not None:
        out["replay"]["cluster"] = replay(rec, k, cluster=cluster, links=None)
        out["replay"][WORKERS] = replay(rec, k, cluster=cluster, links=WORKERS)
    return out
