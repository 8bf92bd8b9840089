"""A lower bound from the best schedule: placement and op order solved together (CP-SAT).

The simulator runs one greedy schedule of a placement: a device starts its oldest ready
op as soon as it is idle, a link sends its oldest queued tensor. :func:`schedule_bound`
asks OR-Tools' CP-SAT for the least step time of *any* schedule of *any* placement under
the rules every such run obeys, and nothing else:

- each group on one device it may use; an op lasts its time there;
- a device runs one op at a time, a directed link carries one transfer at a time (on a
  cluster whose links do not queue, ``links.queue = "none"``, any number);
- a tensor goes to a device once (all its consumers there share the copy), over the
  link from its producer's device, after the producer ends, for latency + bytes /
  bandwidth; a consumer starts after its inputs are on its device and its control
  predecessors have ended.

Send and receive tasks, memory and the order rules of the simulator are left out, so
every simulated run is one of the schedules the model allows and its optimum bounds the
simulator's best placement from below. Times are floored to 1/100 µs, which keeps it a
bound. The model grows as ops x devices + tensors x devices^2 intervals: meant for
problems of up to a few hundred groups, such as the ones ``exact`` proves. On random
40-group DAGs on 3 devices CP-SAT solves it in 3-8 s, 3.4-6.0% under the best placement
``exact`` finds in a minute (``benchmarks/exact.py``), where the bounds of the
branch-and-bound tree leave 14-49%.

>>> import numpy as np
>>> from placetool.costmodel import CostModel, presets
>>> from placetool.search import Problem
>>> p = Problem(CostModel(presets.load_graph("synthetic-30"), presets.load_cluster("k80x2")))
>>> b = schedule_bound(p, seconds=60)  # 22 groups: solved in 2-3 s
>>> b.status, b.bound_us <= p.cost_model.simulate(b.assignment).step_time_us
('optimal', True)
"""

from __future__ import annotations

import io
import os
import sys
from typing import NamedTuple

import numpy as np

#: model time units per µs (durations are floored to them)
SCALE = 100
#: largest model (op intervals + transfer intervals) built; beyond it the bound is skipped
MAX_INTERVALS = 20_000


class ScheduleBound(NamedTuple):
    """What CP-SAT proved: ``bound_us`` (a lower bound on every placement's simulated
    step time), ``status`` (``optimal``: the model was solved, ``bound``: the time ran
    out first, ``infeasible``: no placement runs at all, ``failed: WHY``: the solver's
    process failed, bound 0), the placement of its best schedule (``assignment``, None if
    none was found), that schedule's length (``schedule_us``) and the solver's seconds
    (without the ~0.6 s its process takes to start)."""

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
    most 8).

    CP-SAT runs in a child process: OR-Tools and TensorFlow ship different builds of
    protobuf and absl, and CP-SAT crashes a process that has loaded TensorFlow (the rl
    methods do). A child that fails or crashes gives status ``failed`` and bound 0."""
    import subprocess
    import time

    g, cm, cl = problem.graph, problem.cost_model, problem.cluster
    n, D, G = g.n_ops, problem.n_devices, problem.n_groups
    if n == 0:
        return ScheduleBound(0.0, "optimal", np.zeros(G, np.int32), 0.0, 0.0)
    T = cm.T
    lat, bw = cl.latency_us, cl.bandwidth_bytes_per_us
    # a device where some op of the group has no kernel is no choice for the group
    ok = problem.allowed.copy()
    np.logical_and.at(ok, g.group, np.isfinite(T))
    comm = np.zeros((len(g.tensor_op), D, D), np.int64)
    for a in range(D):
        for b in range(D):
            if a != b:
                comm[:, a, b] = np.floor((lat[a, b] + g.tensor_bytes / bw[a, b]) * SCALE)
    arrays = dict(
        dur=np.floor(np.where(np.isfinite(T), T, 0.0) * SCALE).astype(np.int64), ok=ok,
        group=np.asarray(g.group, np.int64), edge_src=np.asarray(g.edge_src, np.int64),
        edge_dst=np.asarray(g.edge_dst, np.int64), tensor_op=np.asarray(g.tensor_op, np.int64),
        tensor_ptr=np.asarray(g.csr.tensor_ptr, np.int64), tensor_cons=np.asarray(g.csr.tensor_cons, np.int64),
        comm=comm, fifo_links=np.array(cl.fifo_links), settings=np.array([max(float(seconds), 0.01), int(workers or min(8, os.cpu_count() or 1)),
                                      int(seed) & 0x7FFFFFFF, os.getpid()], np.float64))
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    t0 = time.perf_counter()
    try:
        out = subprocess.run([sys.executable, "-m", __name__], input=buf.getvalue(), capture_output=True,
                             timeout=float(seconds) + 60.0, check=True).stdout
        with np.load(io.BytesIO(out), allow_pickle=False) as z:
            status, bound, schedule, wall = str(z["status"]), float(z["bound"]), float(z["schedule"]), float(z["wall"])
            assignment = z["assignment"].astype(np.int32) if z["assignment"].size else None
    except (subprocess.SubprocessError, OSError, ValueError, KeyError) as e:
        why = getattr(e, "stderr", b"") or b""
        last = why.decode("utf-8", "replace").strip().splitlines()[-1:] or [type(e).__name__]
        return ScheduleBound(0.0, f"failed: {last[0]}", None, None, time.perf_counter() - t0)
    if status == "infeasible":
        return ScheduleBound(np.inf, status, None, None, wall)
    return ScheduleBound(bound, status, assignment, schedule if assignment is not None else None, wall)


def _solve(z) -> dict:
    """Build and solve the model from the arrays :func:`schedule_bound` packs (in the child)."""
    from ortools.sat.python import cp_model

    dur, ok, group, comm = z["dur"], z["ok"], z["group"], z["comm"]
    ptr, cons, tensor_op = z["tensor_ptr"], z["tensor_cons"], z["tensor_op"]
    seconds, workers, seed, _ = z["settings"]
    n, D = dur.shape
    G = ok.shape[0]
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
    for u, v in zip(z["edge_src"].tolist(), z["edge_dst"].tolist()):
        m.add(start[v] >= end[u])  # data or control: never before the producer ends
    on_link = {}
    for t in range(len(tensor_op)):
        prod = int(tensor_op[t])
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
    if bool(z["fifo_links"]):
        for ivs in on_link.values():
            m.add_no_overlap(ivs)
    span = m.new_int_var(0, horizon, "span")
    m.add_max_equality(span, end)
    m.minimize(span)

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(seconds)
    solver.parameters.num_workers = int(workers)
    solver.parameters.random_seed = int(seed)
    st = solver.solve(m)
    found = st in (cp_model.OPTIMAL, cp_model.FEASIBLE)
    assignment = np.zeros(0, np.int32)
    if found:
        assignment = np.array([next(d for d in range(D) if (gr, d) in y and solver.value(y[gr, d]))
                               for gr in range(G)], np.int32)
    status = {cp_model.OPTIMAL: "optimal", cp_model.INFEASIBLE: "infeasible"}.get(st, "bound")
    # without a solution CP-SAT's bound is still one (0 if it proved nothing)
    return dict(status=np.array(status), bound=np.array(max(float(solver.best_objective_bound), 0.0) / SCALE),
                schedule=np.array(float(solver.objective_value) / SCALE if found else np.nan),
                wall=np.array(float(solver.wall_time)), assignment=assignment)


def _die_with_parent(ppid: int) -> None:
    """A solver left behind by a killed search would run out its time limit: follow the
    parent instead (Linux; elsewhere the time limit still ends it)."""
    import signal

    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != ppid:  # the parent ended before the line above
        os._exit(1)


if __name__ == "__main__":
    with np.load(io.BytesIO(sys.stdin.buffer.read()), allow_pickle=False) as arrays:
        z = {k: arrays[k] for k in arrays.files}
    _die_with_parent(int(z["settings"][3]))
    res = _solve(z)
    out = io.BytesIO()
    np.savez(out, **res)
    sys.stdout.buffer.write(out.getvalue())
