"""A lower bound from the best schedule: placement and op order solved together (CP-SAT).

The simulator runs one greedy schedule of a placement: a device starts its oldest ready
op as soon as it is idle, a link sends its oldest queued tensor. :func:`schedule_bound`
asks OR-Tools' CP-SAT for the least step time of *any* schedule of *any* placement under
the rules every such run obeys, and nothing else:

- each group on one device it may use; an op lasts its time there;
- a device runs one op at a time, a directed link carries one transfer at a time;
- a tensor goes to a device once (all its consumers there share the copy), over the
  link from its producer's device, after the producer ends, for latency + bytes /
  bandwidth; a consumer starts after its inputs are on its device and its control
  predecessors have ended.

Send and receive tasks, memory and the order rules of the simulator are left out, so
every simulated run is one of the schedules the model allows and its optimum bounds the
simulator's best placement from below. Times are floored to 1/100 µs, which keeps it a
bound. The model grows as ops x devices + tensors x devices^2 intervals: meant for
problems of up to a few hundred groups, such as the ones ``exact`` proves. On random
40-group DAGs on 3 devices CP-SAT solves it in 3-20 s, 3-10% under the best placement
known (``benchmarks/exact.py``), where the bounds of the branch-and-bound tree leave
14-49%.

>>> import numpy as np
>>> from placetool.costmodel import CostModel, presets
>>> from placetool.search import Problem
>>> p = Problem(CostModel(presets.load_graph("synthetic-50"), presets.load_cluster("k80x2")))
>>> b = schedule_bound(p, seconds=10)
>>> b.status, b.bound_us <= p.cost_model.simulate(b.assignment).step_time_us
('optimal', True)
"""

from __future__ import annotations

import os
from typing import NamedTuple

import numpy as np

#: model time units per µs (durations are floored to them)
SCALE = 100
#: largest model (op intervals + transfer intervals) built; beyond it the bound is skipped
MAX_INTERVALS = 20_000


class ScheduleBound(NamedTuple):
    """What CP-SAT proved: ``bound_us`` (a lower bound on every placement's simulated
    step time), ``status`` (``optimal``: the model was solved, ``bound``: the time ran
    out first, ``infeasible``: no placement runs at all), the placement of its best schedule (``assignment``, None if none was
    found) and that schedule's length (``schedule_us``), and the seconds it took."""

    bound_us: float
    status: str
    assignment: np.ndarray | None
    schedule_us: float | None
    seconds: float


def available() -> bool:
    """Whether OR-Tools (the ``exact`` extra) is installed."""
    import importlib.util

    return importlib.util.find_spec("ortools") is not None


def model_size(problem) -> int:
    """Intervals the model of ``problem`` would hold (see :data:`MAX_INTERVALS`)."""
    D = problem.n_devices
    return problem.graph.n_ops * D + len(problem.graph.tensor_op) * D * (D - 1)


def schedule_bound(problem, seconds: float, seed: int = 0, workers: int | None = None) -> ScheduleBound:
    """Solve the schedule relaxation of ``problem`` (see the module docstring) for at
    most ``seconds``; ``workers``: CP-SAT's threads (default: the machine's cores, at
    most 8)."""
    from ortools.sat.python import cp_model

    g, cm, cl = problem.graph, problem.cost_model, problem.cluster
    n, D, G = g.n_ops, problem.n_devices, problem.n_groups
    if n == 0:
        return ScheduleBound(0.0, "optimal", np.zeros(G, np.int32), 0.0, 0.0)
    T, group = cm.T, g.group
    lat, bw = cl.latency_us, cl.bandwidth_bytes_per_us
    ptr, cons = g.csr.tensor_ptr, g.csr.tensor_cons
    # a device where some op of the group has no kernel is no choice for the group
    ok = problem.allowed.copy()
    for o in range(n):
        ok[group[o]] &= np.isfinite(T[o])
    dur = np.floor(np.where(np.isfinite(T), T, 0.0) * SCALE).astype(np.int64)
    comm = np.zeros((len(g.tensor_op), D, D), np.int64)
    for a in range(D):
        for b in range(D):
            if a != b:
                comm[:, a, b] = np.floor((lat[a, b] + g.tensor_bytes / bw[a, b]) * SCALE)
    # a schedule that runs everything one after another, transfers included, fits
    horizon = int(dur.max(axis=1).sum() + comm.max(axis=(1, 2)).sum() * max(D - 1, 1)) + 1

    m = cp_model.CpModel()
    y = {}  # (group, device) -> the group runs there
    for gr in range(G):
        for d in np.flatnonzero(ok[gr]):
            y[gr, int(d)] = m.new_bool_var(f"y{gr}.{d}")
        m.add_exactly_one([y[gr, int(d)] for d in np.flatnonzero(ok[gr])])
    start = [m.new_int_var(0, horizon, f"s{o}") for o in range(n)]
    end = [m.new_int_var(0, horizon, f"e{o}") for o in range(n)]
    on_device = [[] for _ in range(D)]
    for o in range(n):
        for d in range(D):
            if (group[o], d) in y:
                on_device[d].append(m.new_optional_fixed_size_interval_var(start[o], int(dur[o, d]),
                                                                           y[group[o], d], f"op{o}.{d}"))
                m.add(end[o] == start[o] + int(dur[o, d])).only_enforce_if(y[group[o], d])
    for ivs in on_device:
        m.add_no_overlap(ivs)
    for u, v in zip(g.edge_src.tolist(), g.edge_dst.tolist()):
        m.add(start[v] >= end[u])  # data or control: never before the producer ends
    on_link = {}
    for t in range(len(g.tensor_op)):
        prod = int(g.tensor_op[t])
        gp = group[prod]
        readers = [int(c) for c in cons[ptr[t]:ptr[t + 1]] if group[c] != gp]
        for a in range(D):
            if (gp, a) not in y:
                continue
            for b in range(D):
                there = [c for c in readers if (group[c], b) in y]
                if a == b or not there:
                    continue
                sent = m.new_bool_var(f"x{t}.{a}.{b}")
                s = m.new_int_var(0, horizon, "")
                on_link.setdefault((a, b), []).append(
                    m.new_optional_fixed_size_interval_var(s, int(comm[t, a, b]), sent, f"t{t}.{a}.{b}"))
                m.add(s >= end[prod]).only_enforce_if(sent)
                for c in there:
                    both = [y[gp, a], y[group[c], b]]
                    m.add_bool_or([sent, both[0].Not(), both[1].Not()])
                    m.add(start[c] >= s + int(comm[t, a, b])).only_enforce_if(both)
    for ivs in on_link.values():
        m.add_no_overlap(ivs)
    span = m.new_int_var(0, horizon, "span")
    m.add_max_equality(span, end)
    m.minimize(span)

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(float(seconds), 0.01)
    solver.parameters.num_workers = int(workers or min(8, os.cpu_count() or 1))
    solver.parameters.random_seed = int(seed) & 0x7FFFFFFF
    st = solver.solve(m)
    if st == cp_model.INFEASIBLE:  # some group has no device whose kernels run all its ops
        return ScheduleBound(np.inf, "infeasible", None, None, float(solver.wall_time))
    found = st in (cp_model.OPTIMAL, cp_model.FEASIBLE)
    assignment = None
    if found:
        assignment = np.array([next(d for d in range(D) if (gr, d) in y and solver.value(y[gr, d]))
                               for gr in range(G)], np.int32)
    # without a solution CP-SAT's bound is still one (0 if it proved nothing)
    bound = max(float(solver.best_objective_bound), 0.0) / SCALE
    return ScheduleBound(bound, "optimal" if st == cp_model.OPTIMAL else "bound", assignment,
                         float(solver.objective_value) / SCALE if found else None, float(solver.wall_time))
