"""Fitting placements into device memory (search/memory.py) and how seeding and the
annealer's objective treat placements that do not fit."""

from __future__ import annotations

import numpy as np
import pytest

from placetool.costmodel import CostModel, OpGraph, presets
from placetool.search import Budget, Problem, Tracker, run
from placetool.search.annealing import objective, seed_assignments
from placetool.search.memory import fit_memory

from .helpers import cluster, nxgraph


def two_chains(gpu_memory: int) -> Problem:
    """Two independent chains a1 -> a2 and b1 -> b2 (100-byte outputs, 10 µs per op on
    a GPU, 100 µs on the host) on a host and two GPUs of ``gpu_memory`` bytes."""
    g = OpGraph.from_networkx(nxgraph({v: 100 for v in ("a1", "a2", "b1", "b2")},
                                      [("a1", "a2"), ("b1", "b2")], name="chains"))
    cl = cluster(3, latency=1.0, bandwidth=10.0, memory=[1 << 30, gpu_memory, gpu_memory])
    return Problem(CostModel(g, cl, op_times=[[100.0, 10.0, 10.0]] * 4))


def test_fit_memory_moves_a_chain_to_the_other_gpu():
    p = two_chains(gpu_memory=250)
    cm = p.cost_model
    one_gpu = np.ones(p.n_groups, np.int32)
    assert not cm.simulate(p.placement(one_gpu)).feasible  # both chains' outputs overlap on gpu 1
    t = Tracker(p, Budget(evals=10))
    a, r = fit_memory(p, one_gpu, t)
    assert r.feasible[0] and cm.simulate(p.placement(a)).feasible
    # the faster device with room, not the roomier host: one chain per GPU, 20 µs
    idx = p.graph.index
    assert a[p.graph.group[idx["a1"]]] == a[p.graph.group[idx["a2"]]]
    assert a[p.graph.group[idx["b1"]]] == a[p.graph.group[idx["b2"]]]
    assert sorted(set(a.tolist())) == [1, 2] and r.step_time_us[0] == 20.0
    assert t.evaluations == 2  # the placement as given, then the fitted one


def test_fit_memory_gives_up_where_nothing_has_room():
    p = two_chains(gpu_memory=50)  # no GPU holds even one output; the host runs everything
    a, r = fit_memory(p, np.ones(p.n_groups, np.int32), Tracker(p, Budget(evals=20)))
    assert r.feasible[0] and set(a.tolist()) == {0}
    p = two_chains(gpu_memory=250)
    a, r = fit_memory(p, np.ones(p.n_groups, np.int32), Tracker(p, Budget(evals=1)))
    assert not r.feasible[0] and r.assignments.shape == (1, p.n_groups)  # the budget ended first


@pytest.mark.parametrize("ref", [0.0, 50.0, 500.0])
def test_objective_never_prefers_an_infeasible_placement_to_the_reference(ref):
    cap = np.array([100.0, 100.0])
    step = np.array([10.0, 40.0, 400.0])
    o = objective(step, [False] * 3, np.array([[150.0, 0.0]] * 3), cap, ref)
    assert np.all(o >= 1.5 * max(ref, 0.0)) and np.all(o >= step * 2.0)  # 50% over: 1.5 + 0.5
    assert np.all(np.diff(o) >= 0)  # still ordered by step time among the infeasible
    assert objective([10.0], [True], np.array([[150.0, 0.0]]), cap, ref)[0] == 10.0


def test_objective_without_a_feasible_reference_is_the_plain_penalty():
    cap = np.array([100.0, 100.0])
    step = np.array([10.0, 40.0])
    o = objective(step, [False, True], np.array([[150.0, 0.0]] * 2), cap)  # none known: inf
    assert o.tolist() == [10.0 * 2.0, 40.0]


def tight_synthetic() -> Problem:
    """synthetic-1k on k80x2 with each GPU holding half of what one GPU's run peaks at."""
    cm = CostModel(presets.load_graph("synthetic-1k"), presets.load_cluster("k80x2"))
    p = Problem(cm)
    on_gpu = np.where(p.allowed[:, 1], 1, 0).astype(np.int32)
    cm.capacity = cm.capacity.copy()
    cm.capacity[1:] = cm.simulate(p.placement(on_gpu)).peak_memory_bytes[1] // 2
    return p


def test_seeds_out_of_memory_are_fitted_and_never_rank_above_the_best_feasible_one():
    p = tight_synthetic()
    t = Tracker(p, Budget(evals=400))
    seeds, _ = seed_assignments(p, Budget(evals=400), 0, t)
    names = [n for _, n, _ in seeds]
    assert any(n.endswith("(fitted)") for n in names)
    cm = p.cost_model
    feas = [bool(cm.simulate(p.placement(a)).feasible) for _, _, a in seeds]
    assert feas[0] and not all(feas)
    assert all(o >= 1.5 * seeds[0][0] for (o, _, _), ok in zip(seeds, feas) if not ok)
    host = np.zeros(p.n_groups, np.int32)
    assert cm.simulate(p.placement(seeds[0][2])).step_time_us < cm.simulate(p.placement(host)).step_time_us


def test_sa_on_a_memory_tight_problem_returns_a_feasible_placement_faster_than_the_host():
    p = tight_synthetic()
    r = run("sa", p, Budget(evals=600), seed=0)
    cm = p.cost_model
    s = cm.simulate(p.placement(r.assignment))
    host = cm.simulate(p.placement(np.zeros(p.n_groups, np.int32)))
    assert s.feasible and s.step_time_us == r.step_time_us < host.step_time_us
