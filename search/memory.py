"""Fitting a placement into device memory by moving what a device holds at its peak.

The list schedulers and partitioners budget memory with a per-group estimate
(:func:`placetool.search.problem.group_memory_bytes`) that cannot see what the
simulator counts: when outputs are freed, and the copies a device receives. On graphs
that fill the cluster (gnmt8 on k80x4: about 53 GB at the peak of one device's run
against four 12 GB GPUs and a 64 GB host) every one of their placements is out of memory,
and a search that starts from them has nothing feasible to improve but the host alone.

:func:`fit_memory` repairs such a placement with the simulator's own account. For every
device over capacity it traces the run, takes what is live at the device's peak
(:func:`placetool.costmodel.trace.peak_residents`: outputs of its ops, received copies),
largest first, and moves the groups that keep each one there (the producer and its
consumers on that device) to the device that runs them fastest among those with room
for it, until the excess (plus ``margin``) is covered; then it simulates again, up to
``rounds`` times. Moving a tensor's consumers along with its producer is what frees the
bytes: moved alone, the producer would leave a received copy in its place.
"""

from __future__ import annotations

import numpy as np

from placetool.costmodel.trace import peak_residents

from .tracker import EvalResult


def fit_memory(problem, assignment, tracker, rounds: int = 8, margin: float = 0.05):
    """Move groups off devices over capacity until ``assignment`` fits (see the module
    docstring); every round's traced run is counted by ``tracker``. Returns (assignment,
    its :class:`EvalResult`): the first that fits, else the last one scored (``assignment``
    and None if the budget ended before any was).

    >>> import numpy as np
    >>> from placetool.costmodel import CostModel, presets
    >>> from placetool.search import Budget, Problem, Tracker
    >>> cm = CostModel(presets.load_graph("synthetic-1k"), presets.load_cluster("k80x2"))
    >>> p = Problem(cm)
    >>> on_gpu = np.where(p.allowed[:, 1], 1, 0).astype(np.int32)  # host-only ops stay on the host
    >>> cm.capacity = cm.capacity.copy()
    >>> cm.capacity[1] = cm.simulate(p.placement(on_gpu)).peak_memory_bytes[1] // 2
    >>> a, r = fit_memory(p, on_gpu, Tracker(p, Budget(evals=20)))
    >>> bool(r.feasible[0]), sorted(set(a.tolist()))  # some of gpu:0's groups moved to gpu:1
    (True, [0, 1, 2])
    """
    cm, g = problem.cost_model, problem.graph
    D = problem.n_devices
    cap = cm.capacity.astype(np.float64)
    ptr, cons, op_t_ptr = g.csr.tensor_ptr, g.csr.tensor_cons, g.csr.op_tensor_ptr
    a = np.array(assignment, np.int32)
    r = None
    rounds = max(int(rounds), 0)
    for k in range(rounds + 1):  # score, then move, ``rounds`` times; score the last moves
        if tracker.done():
            break
        # one traced run both scores the placement and shows what each device holds
        sim = cm.simulate(g.to_placement(a), trace=True)
        r = EvalResult(a[None, :].copy(), np.array([sim.step_time_us]), np.array([sim.feasible]),
                       sim.peak_memory_bytes[None, :])
        tracker.record(r.assignments, r.step_time_us, r.feasible, r.peak_memory_bytes)
        if sim.feasible or k == rounds:
            break
        place = np.asarray(sim.trace.placement, np.int64)
        room = cap - sim.peak_memory_bytes
        residents = peak_residents(sim.trace, g, D)
        x_tensor = np.asarray(sim.trace.x_tensor, np.int64)
        moved_any = False
        for d in np.flatnonzero(room < 0):
            _, ops, copies = residents[d]
            xt = x_tensor[copies]
            # (bytes, tensors held): an op's outputs, or a received copy
            items = [(float(g.out_bytes[op]), range(op_t_ptr[op], op_t_ptr[op + 1]), int(op)) for op in ops]
            items += [(float(g.tensor_bytes[t]), (t,), -1) for t in xt]
            items.sort(key=lambda x: -x[0])
            need, freed = -room[d] * (1 + margin), 0.0
            for b, tensors, producer in items:
                if freed >= need:
                    break
                holders = [producer] if producer >= 0 else []
                for t in tensors:
                    cs = cons[ptr[t]:ptr[t + 1]]
                    holders.extend(cs[place[cs] == d].tolist())
                groups = np.unique(g.group[np.asarray(holders, np.int64)])
                groups = groups[a[groups] == d]
                if groups.size == 0:
                    continue
                ok = problem.allowed[groups].all(axis=0) & (room >= b)
                ok[d] = False
                if not ok.any():
                    continue
                e = int(np.argmin(np.where(ok, problem.group_time[groups].sum(axis=0), np.inf)))
                a[groups] = e
                room[e] -= b
                freed += b
                moved_any = True
        if not moved_any:
            break
    return (a, r) if r is None else (r.assignments[0].copy(), r)
