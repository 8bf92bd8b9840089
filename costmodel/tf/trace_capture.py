"""Record traced steps of a placement as plain data: a timeline file for ``placetool explain``.

A FULL_TRACE step's ``step_stats`` hold, per device, one record per op run (start, duration)
and, on the receiving device, one ``RecvTensor`` record per tensor fetched from another
worker (its start, the later of the call's issue and the sender's response start, and
its end, the tensor's arrival; the edge name, the bytes). :func:`capture` runs a
placement's traced steps (and optionally the same steps on one device, for the per-op
inflation) and keeps exactly those records, as JSON-ready lists that
:func:`placetool.costmodel.timeline.load` reads without TensorFlow.

Times are µs from the step's first record; ops the graph does not know (the runtime's
``_SOURCE``, the Identity/Const nodes partitioning adds for cross-device edges) are left
out: they take about a µs each and the simulator has no counterpart for them.
"""

from __future__ import annotations

import re
import statistics
import time

import numpy as np

from .runner import PlacedStep, _tf_errors, check_placement
from .session import import_tf

#: "[4096B] [8.7Mb/s] edge_9_dense/BiasAdd from /job:.../device:CPU:0 to /job:..."
_RECV = re.compile(r"\[(\d+)B\]\s*(?:\[[^\]]*\]\s*)?(\S+) from (\S+) to (\S+)")
_EDGE = re.compile(r"^edge_\d+_(.+)$")


def _dur_us(ns) -> float:
    return ns.all_end_rel_nanos / 1e3 if ns.all_end_rel_nanos else float(ns.all_end_rel_micros)


def _start_us(ns) -> float:
    return ns.all_start_nanos / 1e3 if ns.all_start_nanos else float(ns.all_start_micros)


def step_records(step_stats, graph, tf_devices) -> dict:
    """One traced step as ``{"ops": [[name, device, start, dur]], "recv": [[edge, producer,
    src, dst, bytes, start, dur]]}`` (µs from the step's first record; devices as indices
    into ``tf_devices``; producer "" where the edge names no graph op)."""
    dev_ix = {d: i for i, d in enumerate(tf_devices)}
    # worker device strings may differ in spelling (device:CPU:0 vs cpu:0); compare lowered
    low_ix = {d.lower(): i for d, i in dev_ix.items()}

    def dix(name):
        return dev_ix.get(name, low_ix.get(name.lower(), -1))

    raw = [(ds.device, ns) for ds in step_stats.dev_stats for ns in ds.node_stats]
    if not raw:
        return {"ops": [], "recv": []}
    t0 = min(_start_us(ns) for _, ns in raw)
    ops, recv = [], []
    for dev, ns in raw:
        start = _start_us(ns) - t0
        if ns.node_name == "RecvTensor":
            m = _RECV.search(ns.timeline_label)
            if not m:
                continue
            edge = m.group(2)
            e = _EDGE.match(edge)
            prod = e.group(1) if e and e.group(1) in graph.index else ""
            recv.append([edge, prod, dix(m.group(3)), dix(m.group(4)), int(m.group(1)), round(start, 3),
                         round(_dur_us(ns), 3)])
        elif ns.node_name in graph.index:
            ops.append([ns.node_name, dix(dev), round(start, 3), round(_dur_us(ns), 3)])
    ops.sort(key=lambda r: (r[2], r[1]))
    recv.sort(key=lambda r: (r[5], r[3]))
    return {"ops": ops, "recv": recv}


def construct_order(nodes) -> dict[str, list[str]]:
    """Each node's consumers in the order a TensorFlow worker adds its out-edges.

    ``nodes``: a partition graph's nodes as ``(name, inputs)`` pairs, in its GraphDef's
    order (inputs as a NodeDef spells them: ``"x"``, ``"x:1"``, ``"^x"``). The worker
    builds its graph by taking, among the nodes whose inputs are all built, the one first
    in the GraphDef, and adds that node's in-edges as it does; an op's executor readies its
    consumers in that order (up to 4 of them; TensorFlow keeps more in a hash set).

    >>> construct_order([("a", []), ("c", ["a", "r"]), ("s", ["a"]), ("r", [])])
    {'a': ['s', 'c'], 'c': [], 's': [], 'r': ['c']}
    """
    import heapq

    ix = {name: i for i, (name, _) in enumerate(nodes)}
    ins = [[x[1:] if x.startswith("^") else x.split(":")[0] for x in inputs] for _, inputs in nodes]
    ins = [[x for x in xs if x in ix] for xs in ins]
    pending = [len(xs) for xs in ins]
    users = [[] for _ in nodes]
    for i, xs in enumerate(ins):
        for x in xs:
            users[ix[x]].append(i)
    ready = [i for i, c in enumerate(pending) if c == 0]
    heapq.heapify(ready)
    out = {name: [] for name, _ in nodes}
    while ready:
        i = heapq.heappop(ready)
        for x in ins[i]:
            out[x].append(nodes[i][0])
        for u in users[i]:
            pending[u] -= 1
            if pending[u] == 0:
                heapq.heappush(ready, u)
    return out


def executor_order(partition_graphs, graph, tf_devices) -> dict[str, list[str]]:
    """The timeline file's ``out_order`` from a step's partition graphs: for each op of
    ``graph`` with more than one consumer, its consumers in its worker's order
    (:func:`construct_order`), a message to device K as ``"@send:K"`` (a tensor's
    ``_Send``) or ``"@ctrl:K"`` (a control edge's), each once, where it first comes."""
    from placetool.costmodel.timeline import message_entry

    dev_ix = {d.lower(): i for i, d in enumerate(tf_devices)}
    out = {}
    for gd in partition_graphs:
        by_name = {n.name: n for n in gd.node}
        order = construct_order([(n.name, list(n.input)) for n in gd.node])

        def send_to(name):
            n = by_name[name]
            return dev_ix.get(n.attr["recv_device"].s.decode().lower(), -1)

        def entry(c):
            if c in graph.index:
                return c
            if by_name[c].op == "_Send":
                return message_entry(send_to(c), control=False)
            sends = [u for u in order[c] if by_name[u].op == "_Send"]  # the constant a control edge sends
            return message_entry(send_to(sends[0]), control=True) if sends else None

        for name, users in order.items():
            if name in graph.index and len(users) > 1:
                entries = list(dict.fromkeys(e for e in map(entry, users) if e is not None))
                if len(entries) > 1:
                    out[name] = entries
    return out


def _traced_steps(st, n: int, timeout_s: float) -> list[dict]:
    tf1 = import_tf().compat.v1
    out = []
    with _tf_errors(timeout_s):
        for _ in range(n):
            opts = tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE)
            md = tf1.RunMetadata()
            s = time.perf_counter()
            # PlacedStep.run, where there is one, watches the workers while the step runs
            getattr(st, "run", st.sess.run)(st.ops, options=opts, run_metadata=md)
            wall = (time.perf_counter() - s) * 1e6
            rec = step_records(md.step_stats, st.traced.graph, st.spec.tf_devices)
            rec["wall_us"] = round(wall, 1)
            out.append(rec)
    return out


def _step_order(st, timeout_s: float) -> dict[str, list[str]]:
    """One untimed step that returns the workers' partition graphs: their
    :func:`executor_order` (returning the graphs lengthens the step, so no timed or
    traced step asks for them)."""
    tf1 = import_tf().compat.v1
    md = tf1.RunMetadata()
    with _tf_errors(timeout_s):
        getattr(st, "run", st.sess.run)(st.ops, options=tf1.RunOptions(output_partition_graphs=True),
                                        run_metadata=md)
    return executor_order(md.partition_graphs, st.traced.graph, st.spec.tf_devices)


def capture(traced, placement, spec, steps: int = 3, warmup: int = 3, single_device: int | None = 0,
            timeout_s: float = 120.0, log=None) -> dict:
    """Run ``steps`` FULL_TRACE steps of ``placement`` (after ``warmup`` untraced ones, at
    least 2, one of which returns the executor's order, ``out_order``) and, unless
    ``single_device`` is None, as many of every op on that one device; return the
    timeline file as a dict (format ``placetool.timeline``, see
    :mod:`placetool.costmodel.timeline`)."""
    from placetool.costmodel.timeline import FORMAT, VERSION

    g = traced.graph
    p = check_placement(g, placement, spec)
    spec.check_reachable(timeout_s=min(timeout_s, 10.0))
    out = {"format": FORMAT, "version": VERSION, "graph": g.name, "n_ops": g.n_ops,
           "devices": list(spec.tf_devices), "kinds": list(spec.kinds),
           "placement": {g.names[i]: int(d) for i, d in enumerate(p)}}
    if log:
        log(f"tracing {steps} steps of the placement ...")
    with PlacedStep(traced, p, spec, timeout_s) as st:
        out["out_order"] = _step_order(st, timeout_s)  # one of the warm-up steps
        for _ in range(max(warmup - 2, 0)):
            st.step()
        untraced = [st.step() for _ in range(max(steps, 1))]
        out["untraced_step_us"] = [round(x, 1) for x in untraced]
        out["steps"] = _traced_steps(st, max(steps, 1), timeout_s)
    if single_device is not None:
        if log:
            log(f"tracing {steps} steps of every op on device {single_device} ...")
        one = check_placement(g, np.full(g.n_ops, single_device, np.int32), spec)
        with PlacedStep(traced, one, spec, timeout_s) as st:
            for _ in range(max(warmup - 1, 0)):
                st.step()
            untraced = [st.step() for _ in range(max(steps, 1))]
            recs = _traced_steps(st, max(steps, 1), timeout_s)
        per_op: dict[str, list[float]] = {}
        for r in recs:
            this: dict[str, float] = {}
            for name, _, _, dur in r["ops"]:
                this[name] = this.get(name, 0.0) + dur
            for k, v in this.items():
                per_op.setdefault(k, []).append(v)
        out["single"] = {"device": int(single_device), "step_us": round(statistics.median(untraced), 1),
                         "op_us": {k: round(float(statistics.median(v)), 3) for k, v in per_op.items()}}
    return out
