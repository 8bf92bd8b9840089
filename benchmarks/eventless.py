"""A design study: the simulator without transfer events. Would it be faster?

    python benchmarks/eventless.py                          # synthetic-10k and inception_v3 on k80x4
    python benchmarks/eventless.py --graphs nmt,transformer --placements 32 --json
    python benchmarks/eventless.py --callgrind              # instructions and misses per op instead

The engine (``costmodel/engine/``) queues an event when an op ends and when a
transfer lands, about 2.2 events per op on random placements. Under its rules a link
serves its transfers first come first served, so a transfer's landing time is known the
moment it is queued: ``max(now, link free) + latency + bytes / bandwidth``. An op's
inputs are then all timed once its last producer has ended. Here each device keeps its
waiting ops in a heap keyed by (ready time, rank), and holds at most one pending event
(its op's end, or the ready time of its first waiting op), so the next instant is a
minimum over devices. The consumers of a tensor are read once, when it is produced, not
again when each copy lands.

Memory is where the transfers come back. A received copy is allocated when its
transfer starts, which may be after a busy link frees up, and the producer's output is
freed when its last transfer has landed: both happen between the device events. Exact
peaks need them in time order, so ``memory=True`` keeps a heap of these pending changes
(frees before allocations at one instant, as in the engine: a change's kind sits in its
key's top bits). ``memory=False`` leaves peaks out, to show what the events alone cost.
The figures, and a second way to keep peaks exact that was tried, are in
``benchmarks/README.md`` ("Transfers without events").

The script first checks that the design gives the engine's step time and per-device
peak memory exactly on every placement, then times both kernels side by side
(``engine.simulate_full`` without the Python around ``CostModel.simulate``). It is a
measurement, not a second simulator: no send/receive costs, no trace, no checkpoints.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
from numba import njit


@njit(cache=True, inline="always")
def _less(ta, ka, tb, kb):
    return ta < tb or (ta == tb and ka < kb)


@njit(cache=True, inline="always")
def _push(ht, hk, base, size, t, k):
    """Push (t, k) onto the min-heap at ``base`` of two parallel arrays; returns the new
    size (inlined: an array passed to a call costs reference counting)."""
    j = size
    while j > 0:
        p = (j - 1) >> 1
        if _less(t, k, ht[base + p], hk[base + p]):
            ht[base + j] = ht[base + p]
            hk[base + j] = hk[base + p]
            j = p
        else:
            break
    ht[base + j] = t
    hk[base + j] = k
    return size + 1


@njit(cache=True, inline="always")
def _pop(ht, hk, base, size):
    """Remove the root of the heap at ``base``; returns the new size."""
    size -= 1
    t, k = ht[base + size], hk[base + size]
    j = 0
    while True:
        c = 2 * j + 1
        if c >= size:
            break
        if c + 1 < size and _less(ht[base + c + 1], hk[base + c + 1], ht[base + c], hk[base + c]):
            c += 1
        if _less(ht[base + c], hk[base + c], t, k):
            ht[base + j] = ht[base + c]
            hk[base + j] = hk[base + c]
            j = c
        else:
            break
    if size > 0:
        ht[base + j] = t
        hk[base + j] = k
    return size


FREE, ALLOC = 0, 1 << 62  # a pending change's kind, in its key's top bits: frees first at one instant


@njit(cache=True, inline="always")
def _apply(live, peak, v):
    """One pending memory change, ``v`` = kind | device << 40 | bytes."""
    dd = (v >> 40) & 0xFFFF
    b = v & ((1 << 40) - 1)
    if v < ALLOC:
        live[dd] -= b
    else:
        live[dd] += b
        if live[dd] > peak[dd]:
            peak[dd] = live[dd]


@njit(cache=True, error_model="numpy")
def simulate_eventless(net, placement, ws, memory):
    """Step time of ``placement``; per-device peak live bytes left in ``ws[-1]`` when
    ``memory`` (see the module docstring for the design)."""
    (ht, hk, hsize, hbase, missing, ready_at, out_refs, land_max, copy_refs, mt, mk, peak) = ws
    rank, topo_order, tensor_op, tensor_bytes = net.rank, net.topo_order, net.tensor_op, net.tensor_bytes
    op_tensor_ptr, tensor_ptr, tensor_cons = net.op_tensor_ptr, net.tensor_ptr, net.tensor_cons
    ctrl_ptr, ctrl_dst, in_ptr, in_tensor, out_bytes = net.ctrl_ptr, net.ctrl_dst, net.in_ptr, net.in_tensor, net.out_bytes
    n = placement.shape[0]
    D = net.latency.shape[0]
    lat = net.latency.reshape(-1)
    bw = net.bandwidth.reshape(-1)
    link_free = np.zeros(D * D)
    dev_next = np.full(D, np.inf)  # each device's one pending event
    running = np.full(D, -1, np.int64)
    stamp = np.full(D, -1, np.int64)  # the tensor whose copy to a device this op's end made
    land = np.zeros(D)
    live = np.zeros(D, np.int64)
    alloc_now = np.zeros(D, np.int64)
    ends = np.empty(D, np.int64)
    tp = np.empty(n)
    for d in range(D):
        hsize[d] = 0
        peak[d] = 0
    for op in range(n):
        hsize[placement[op]] += 1
        tp[op] = net.T[op, placement[op]]
    acc = 0
    for d in range(D):
        hbase[d] = acc
        acc += hsize[d]
        hsize[d] = 0
    for r in range(n):  # in rank order: each device's slice is then a valid heap
        op = topo_order[r]
        missing[op] = net.n_inputs[op]
        ready_at[op] = 0.0
        if missing[op] == 0:
            d = placement[op]
            ht[hbase[d] + hsize[d]] = 0.0
            hk[hbase[d] + hsize[d]] = r
            hsize[d] += 1
            dev_next[d] = 0.0
    nm = 0
    makespan = 0.0
    while True:
        now = np.inf
        for d in range(D):
            now = min(now, dev_next[d])
        if now == np.inf:
            break
        if memory:  # what happened between device events, in time order; this instant's frees
            while nm > 0 and (mt[0] < now or (mt[0] == now and mk[0] < ALLOC)):
                v = mk[0]
                nm = _pop(mt, mk, 0, nm)
                _apply(live, peak, v)
        # the ops that end now, in rank order as the engine handles them
        m = 0
        for d in range(D):
            if dev_next[d] == now and running[d] >= 0:
                op = running[d]
                j = m
                while j > 0 and rank[ends[j - 1]] > rank[op]:
                    ends[j] = ends[j - 1]
                    j -= 1
                ends[j] = op
                m += 1
        for k in range(m):
            op = ends[k]
            d = placement[op]
            running[d] = -1
            makespan = max(makespan, now)
            if memory:
                for e in range(in_ptr[op], in_ptr[op + 1]):
                    t = in_tensor[e]
                    prod = tensor_op[t]
                    if placement[prod] == d:
                        out_refs[prod] -= 1
                        if out_refs[prod] == 0:
                            if land_max[prod] <= now:
                                live[d] -= out_bytes[prod]
                            else:
                                nm = _push(mt, mk, 0, nm, land_max[prod], FREE | (d << 40) | out_bytes[prod])
                    else:
                        copy_refs[t * D + d] -= 1
                        if copy_refs[t * D + d] == 0:
                            live[d] -= tensor_bytes[t]
            refs = 0
            last_land = -1.0
            for t in range(op_tensor_ptr[op], op_tensor_ptr[op + 1]):
                for e in range(tensor_ptr[t], tensor_ptr[t + 1]):
                    c = tensor_cons[e]
                    dc = placement[c]
                    if dc == d:
                        a = now
                        refs += 1
                    else:
                        if stamp[dc] != t:  # the first consumer there: queue the copy
                            stamp[dc] = t
                            l = d * D + dc
                            start = max(now, link_free[l])
                            land[dc] = start + (lat[l] + tensor_bytes[t] / bw[l])
                            link_free[l] = land[dc]
                            if memory:
                                copy_refs[t * D + dc] = 0
                                last_land = max(last_land, land[dc])
                                if start == now:  # allocated after this instant's frees
                                    alloc_now[dc] += tensor_bytes[t]
                                else:
                                    nm = _push(mt, mk, 0, nm, start, ALLOC | (dc << 40) | tensor_bytes[t])
                        if memory:
                            copy_refs[t * D + dc] += 1
                        a = land[dc]
                    ready_at[c] = max(ready_at[c], a)
                    missing[c] -= 1
                    if missing[c] == 0:
                        hsize[dc] = _push(ht, hk, hbase[dc], hsize[dc], ready_at[c], rank[c])
                        if running[dc] < 0 and ready_at[c] < dev_next[dc]:
                            dev_next[dc] = ready_at[c]
            if memory:
                out_refs[op] = refs
                land_max[op] = last_land
                if refs == 0:
                    if last_land <= now:
                        live[d] -= out_bytes[op]
                    else:
                        nm = _push(mt, mk, 0, nm, last_land, FREE | (d << 40) | out_bytes[op])
            # as above, written out again: the same lines as one inline="always" helper for
            # both loops made this kernel 1.4-1.5x slower (measured; the cause not looked into)
            for e in range(ctrl_ptr[op], ctrl_ptr[op + 1]):
                c = ctrl_dst[e]
                dc = placement[c]
                ready_at[c] = max(ready_at[c], now)
                missing[c] -= 1
                if missing[c] == 0:
                    hsize[dc] = _push(ht, hk, hbase[dc], hsize[dc], ready_at[c], rank[c])
                    if running[dc] < 0 and ready_at[c] < dev_next[dc]:
                        dev_next[dc] = ready_at[c]
        # every device whose instant this is starts its best ready op, or waits for one
        for d in range(D):
            if dev_next[d] != now:
                continue
            dev_next[d] = np.inf
            if hsize[d] > 0:
                b = hbase[d]
                if ht[b] <= now:
                    op = topo_order[hk[b]]
                    hsize[d] = _pop(ht, hk, b, hsize[d])
                    running[d] = op
                    dev_next[d] = now + tp[op]
                    if memory:
                        live[d] += out_bytes[op]
                        peak[d] = max(peak[d], live[d])
                else:
                    dev_next[d] = ht[b]
        if memory:
            for dd in range(D):
                if alloc_now[dd] != 0:
                    live[dd] += alloc_now[dd]
                    alloc_now[dd] = 0
                    peak[dd] = max(peak[dd], live[dd])
            while nm > 0 and mt[0] <= now:
                v = mk[0]
                nm = _pop(mt, mk, 0, nm)
                _apply(live, peak, v)
    while memory and nm > 0:
        v = mk[0]
        nm = _pop(mt, mk, 0, nm)
        _apply(live, peak, v)
    return makespan


def workspace(cm):
    """The arrays ``simulate_eventless`` reuses from call to call."""
    n, D, nt = cm.graph.n_ops, len(cm.cluster.names), cm.graph.n_tensors
    z = np.zeros
    # ready heaps (time, rank) | sizes, bases | missing inputs, ready time | output refs,
    # last landing | copy refs | memory heap (time, kind | device | bytes) | peaks
    return (z(n), z(n, np.int64), z(D, np.int64), z(D, np.int64), z(n, np.int64), z(n), z(n, np.int64), z(n),
            z(nt * D, np.int64), z(nt * D + n), z(nt * D + n, np.int64), z(D, np.int64))


def setup(graph, cluster, placements, seed=0):
    from placetool.costmodel import CostModel, presets
    from placetool.search import Problem

    cm = CostModel(presets.load_graph(graph), presets.load_cluster(cluster))
    if cm.net.has_tasks:
        sys.exit("eventless: send/receive costs are not modelled here")
    pr, rng = Problem(cm), np.random.default_rng(seed)
    P = [cm.graph.to_placement(pr.random_assignment(rng)) for _ in range(placements)]
    return cm, P


def check(cm, P, ws) -> int:
    """Placements on which the design's step time and peak memory equal the engine's."""
    from placetool.costmodel import engine

    params = np.ascontiguousarray(cm.graph.param_bytes, np.int64)
    same = 0
    for p in P:
        ref = cm.simulate(p)
        step = simulate_eventless(cm.net, p, ws, True)
        peak = engine.device_peak(ws[-1], p, params)
        same += int(step == ref.step_time_us and np.array_equal(peak, ref.peak_memory_bytes))
    return same


def timed(cm, P, ws, rounds):
    """ms per placement (min and median over rounds; the three kernels interleaved)."""
    from placetool.costmodel import engine

    w = cm.work()
    fns = {"engine": lambda p: engine.simulate_full(cm.net, w, p, False),
           "eventless": lambda p: simulate_eventless(cm.net, p, ws, True),
           "eventless_no_memory": lambda p: simulate_eventless(cm.net, p, ws, False)}
    out = {k: [] for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            t = time.perf_counter()
            for p in P:
                f(p)
            out[k].append((time.perf_counter() - t) / len(P) * 1e3)
    return {k: (float(np.min(v)), float(np.median(v))) for k, v in out.items()}


def callgrind(graph, cluster, reps=4):
    """Instructions, first-level data read misses and branch misses per op of each kernel."""
    from simulator import callgrind_counts

    # the child runs from no folder of ours: it loads this script from its file
    head = (f"import importlib.util, sys\n"
            f"spec = importlib.util.spec_from_file_location('eventless', {os.path.abspath(__file__)!r})\n"
            f"eventless = sys.modules['eventless'] = importlib.util.module_from_spec(spec)\n"
            f"spec.loader.exec_module(eventless)\n"
            f"import numpy as np\nfrom placetool.costmodel import engine\n"
            f"cm, P = eventless.setup({graph!r}, {cluster!r}, {reps + 1})\nws = eventless.workspace(cm)\n"
            f"w = cm.work()\n")
    bodies = {"engine": "engine.simulate_full(cm.net, w, P[i + 1], False)",
              "eventless": "eventless.simulate_eventless(cm.net, P[i + 1], ws, True)",
              "eventless_no_memory": "eventless.simulate_eventless(cm.net, P[i + 1], ws, False)"}
    from placetool.costmodel import presets

    n = presets.load_graph(graph).n_ops
    out = {}
    for k, body in bodies.items():
        first = body.replace("P[i + 1]", "P[0]")
        counts = callgrind_counts(head + first + "\n", body, reps)
        out[k] = {e: counts[e] / n for e in ("Ir", "D1mr", "Bcm")}
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", default="synthetic-10k,inception_v3")
    ap.add_argument("--cluster", default="k80x4")
    ap.add_argument("--placements", type=int, default=16, help="random group assignments per graph")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--callgrind", action="store_true", help="count per op under callgrind instead of timing")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = []
    for g in args.graphs.split(","):
        cm, P = setup(g, args.cluster, args.placements)
        ws = workspace(cm)
        row = {"graph": g, "cluster": args.cluster, "placements": len(P), "exact": check(cm, P, ws)}
        if args.callgrind:
            row["per_op"] = callgrind(g, args.cluster)
        else:
            row["ms"] = timed(cm, P, ws, args.rounds)
        rows.append(row)
        if not args.json:
            print(f"{g} on {args.cluster}: step time and peaks equal to the engine's on {row['exact']} of {len(P)}")
            for k in ("engine", "eventless", "eventless_no_memory"):
                if args.callgrind:
                    c = row["per_op"][k]
                    print(f"  {k:20s} {c['Ir']:8.1f} instructions/op  {c['D1mr']:6.2f} L1 read misses/op  "
                          f"{c['Bcm']:6.2f} branch misses/op")
                else:
                    lo, med = row["ms"][k]
                    ratio = row["ms"]["engine"][0] / lo
                    print(f"  {k:20s} {lo:8.3f} ms (median {med:.3f})  engine / this: {ratio:.2f}x")
    if args.json:
        print(json.dumps({"rows": rows}, indent=1))


if __name__ == "__main__":
    main()
