"""The simulator's rules (DESIGN.md) written as CP-SAT constraints, to check the simulator
against a statement of them that shares no code with it or with ``reference.py``.

For a fixed placement, a schedule obeys the rules when:

- each device runs one op at a time, each directed link one transfer at a time;
- a tensor goes once to each other device where it has a consumer, over the link from its
  producer's device, for latency + bytes / bandwidth;
- an op's ready time is the latest arrival of its inputs (its producer's end on the same
  device, the transfer's end otherwise), 0 without inputs;
- non-delay: an op starts at its ready time or at the end of another op on its device;
- priority: an op that was ready when another op of its device started (ready time <= that
  start) has a larger (ready time, topological rank);
- a link starts a transfer at its producer's end or at the end of another transfer on it,
  in the order the transfers were enqueued (the producers' ends; one producer's tensors
  in tensor order).

The test problems have neither control edges nor send/receive costs, so those rules are
not stated here. Times are integers in 1/SCALE µs: the check is meant for problems whose times are exact
binary fractions (integer op times, bytes / 16), where the simulator's float sums are exact.
``python -m tests.cp_schedule N SEED K`` prints, for K random placements of the test
problem ``random_problem(N, 3, SEED, bandwidth=16)``, the least and the largest sum of op
starts over every schedule that obeys the rules: equal when the rules leave one schedule.
It runs in a child process because CP-SAT crashes in a process that has loaded TensorFlow.
"""

from __future__ import annotations

import json
import sys

import numpy as np

SCALE = 16


def problem(n: int, seed: int):
    from tests.test_search_exact import random_problem

    return random_problem(n, 3, seed, latency=5.0, bandwidth=16.0, hetero=True)


def _exact(x: np.ndarray, what: str) -> np.ndarray:
    v = np.rint(x * SCALE).astype(np.int64)
    if not np.array_equal(v, x * SCALE):
        raise ValueError(f"{what} are not multiples of 1/{SCALE} µs")
    return v


def schedules(p, placement: np.ndarray) -> tuple[list[int], list[int]]:
    """Op starts (1/SCALE µs) of the schedules obeying the rules with the least and the
    largest sum of starts."""
    from ortools.sat.python import cp_model

    g, cl = p.graph, p.cluster
    n, D = g.n_ops, p.n_devices
    dev = np.asarray(placement)
    dur = _exact(p.cost_model.T[np.arange(n), dev], "op times")
    csr, tensor_op, rank = g.csr, np.asarray(g.tensor_op), np.asarray(g.topo_rank)
    # everything one after another, each tensor to every device: no schedule ends later
    longest = np.ceil((cl.latency_us.max() + g.tensor_bytes / cl.bandwidth_bytes_per_us.min()) * SCALE)
    horizon = int(dur.sum() + longest.sum() * D) + 1
    m = cp_model.CpModel()
    start = [m.new_int_var(0, horizon, f"s{o}") for o in range(n)]
    end = [start[o] + int(dur[o]) for o in range(n)]
    for d in range(D):
        m.add_no_overlap([m.new_fixed_size_interval_var(start[o], int(dur[o]), "") for o in np.flatnonzero(dev == d)])

    # transfers: (tensor, destination) -> (start var, duration)
    xfer, on_link = {}, {}
    for t in range(len(tensor_op)):
        a = int(dev[tensor_op[t]])
        for b in sorted({int(dev[c]) for c in csr.tensor_cons[csr.tensor_ptr[t]:csr.tensor_ptr[t + 1]]} - {a}):
            cost = _exact(np.float64(cl.latency_us[a, b] + g.tensor_bytes[t] / cl.bandwidth_bytes_per_us[a, b]),
                          "transfer times")
            s = m.new_int_var(0, horizon, f"x{t}.{b}")
            m.add(s >= end[int(tensor_op[t])])
            xfer[t, b] = (s, int(cost))
            on_link.setdefault((a, b), []).append(t)
    for (a, b), ts in on_link.items():
        m.add_no_overlap([m.new_fixed_size_interval_var(xfer[t, b][0], xfer[t, b][1], "") for t in ts])
        for t in ts:  # non-delay: at its enqueue time or right after another transfer
            s = xfer[t, b][0]
            at = [m.new_bool_var("") for _ in ts]
            for u, z in zip(ts, at):
                m.add(s == (end[int(tensor_op[t])] if u == t else xfer[u, b][0] + xfer[u, b][1])).only_enforce_if(z)
            m.add_bool_or(at)
        for i, t in enumerate(ts):  # first come, first served
            for u in ts[i + 1:]:
                pt, pu = int(tensor_op[t]), int(tensor_op[u])
                first = m.new_bool_var("")  # t was enqueued first
                if pt == pu:
                    m.add(first == 1)
                else:
                    m.add(end[pt] < end[pu]).only_enforce_if(first)
                    m.add(end[pu] < end[pt]).only_enforce_if(first.Not())
                m.add(xfer[t, b][0] + xfer[t, b][1] <= xfer[u, b][0]).only_enforce_if(first)
                m.add(xfer[u, b][0] + xfer[u, b][1] <= xfer[t, b][0]).only_enforce_if(first.Not())

    ready = [m.new_int_var(0, horizon, f"r{o}") for o in range(n)]
    for o in range(n):
        arrive = []
        for e in range(csr.in_ptr[o], csr.in_ptr[o + 1]):
            t = int(csr.in_tensor[e])
            p_ = int(tensor_op[t])
            arrive.append(end[p_] if dev[p_] == dev[o] else xfer[t, int(dev[o])][0] + xfer[t, int(dev[o])][1])
        m.add_max_equality(ready[o], arrive or [0])
        m.add(start[o] >= ready[o])
    for d in range(D):
        ops = [int(o) for o in np.flatnonzero(dev == d)]
        for o in ops:  # non-delay: at its ready time or right after another op of its device
            at = [m.new_bool_var("") for _ in ops]
            for k, z in zip(ops, at):
                m.add(start[o] == (ready[o] if k == o else end[k])).only_enforce_if(z)
            m.add_bool_or(at)
        for i, o in enumerate(ops):  # priority among the ready ops when a device starts one
            for k in ops[i + 1:]:
                o_first = m.new_bool_var("")
                m.add(start[o] < start[k]).only_enforce_if(o_first)
                m.add(start[k] < start[o]).only_enforce_if(o_first.Not())
                for o1, o2, first in ((o, k, o_first), (k, o, o_first.Not())):
                    waiting = m.new_bool_var("")  # o2 was ready when o1 started
                    m.add(ready[o2] <= start[o1]).only_enforce_if(waiting)
                    m.add(ready[o2] > start[o1]).only_enforce_if(waiting.Not())
                    # then o1 came first by (ready time, rank)
                    m.add(ready[o1] <= ready[o2] - (0 if rank[o1] < rank[o2] else 1)).only_enforce_if([first, waiting])

    out = []
    for sense in (m.minimize, m.maximize):
        sense(sum(start))
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = 60.0
        solver.parameters.num_workers = 1
        if solver.solve(m) != cp_model.OPTIMAL:
            raise RuntimeError(f"no schedule obeys the rules ({solver.status_name()})")
        out.append([int(solver.value(s)) for s in start])
    return out[0], out[1]


def main(argv) -> None:
    n, seed, k = (int(a) for a in argv)
    p = problem(n, seed)
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(k):
        a = rng.integers(0, p.n_devices, p.n_groups).astype(np.int32)
        placement = p.graph.to_placement(a)
        lo, hi = schedules(p, placement)
        rows.append({"placement": placement.tolist(), "least": lo, "largest": hi})
    json.dump({"scale": SCALE, "rows": rows}, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1:])
