"""The multilevel search: coarsening the group graph, the coarse problem, projection and the method."""

from __future__ import annotations

import numpy as np
import pytest

from placetool.costmodel import CostModel, OpGraph, presets
from placetool.search import Budget, Problem, registry, run
from placetool.search.coarsen import cluster_levels, coarse_graph, coarse_problem
from tests.helpers import cluster, nxgraph


@pytest.fixture(scope="module")
def p1k():
    return Problem(CostModel(presets.load_graph("synthetic-1k"), presets.load_cluster("k80x4")))


def chain():
    """a -> b -> c -> d, each its own group: 100 bytes a->b and c->d, 1 byte b->c; ops of
    10, 20, 30 and 40 µs, d with 8 parameter bytes."""
    g = nxgraph({"a": 100, "b": 1, "c": 100, "d": {"out_bytes": 5, "param_bytes": 8}},
                [("a", "b"), ("b", "c"), ("c", "d")], name="chain")
    og = OpGraph.from_networkx(g)
    T = np.array([[10.0, 10.0], [20.0, 20.0], [30.0, 30.0], [40.0, 40.0]])
    return Problem(CostModel(og, cluster(2, latency=1.0, bandwidth=10.0, kinds=["gpu", "gpu"]), op_times=T))


def test_the_chain_coarsens_along_its_heavy_edges():
    """One matching round pairs a with b and c with d (100 bytes each), never b with c
    (1 byte), whatever order the vertices are visited in."""
    p = chain()
    for seed in range(5):
        (cl,) = cluster_levels(p, [2], seed=seed)
        assert cl.tolist() == [0, 0, 1, 1]
    cg, T, run_of = coarse_graph(p, cl, run_us=1e9)
    # two coarse ops: {a, b} (10 + 20 µs) sends b's 1 byte to {c, d} (30 + 40 µs)
    assert cg.n_ops == 2 and run_of.tolist() == [0, 0, 1, 1]
    assert T.tolist() == [[30.0, 30.0], [70.0, 70.0]]
    assert cg.tensor_bytes.tolist() == [1] and cg.edge_src.tolist() == [0] and cg.edge_dst.tolist() == [1]
    assert cg.param_bytes.tolist() == [0, 8]
    # what a coarse op holds: what it sends out (1 byte), not what stays inside (100)
    assert cg.out_bytes.tolist() == [1, 0]
    c = coarse_problem(p, cl, run_us=1e9)
    # on one device the chain is its work; apart, one transfer of 1 byte (1 + 0.1 µs)
    same, apart = c.project([1, 1]), c.project([0, 1])
    assert same.tolist() == [1, 1, 1, 1] and apart.tolist() == [0, 0, 1, 1]
    fine = p.cost_model.simulate_batch(np.stack([same, apart])).step_time_us
    coarse = c.problem.cost_model.simulate_batch(np.array([[1, 1], [0, 1]])).step_time_us
    assert fine.tolist() == pytest.approx([100.0, 101.1]) and coarse.tolist() == pytest.approx([100.0, 101.1])


def test_levels_nest_and_shrink(p1k):
    levels = cluster_levels(p1k, [300, 60], seed=1)
    fine, coarse = levels
    assert fine.shape == coarse.shape == (p1k.n_groups,)
    assert 60 <= fine.max() + 1 <= 300 < p1k.n_groups and coarse.max() + 1 <= fine.max() + 1
    # a cluster of the coarser level is a union of clusters of the finer one
    parent = np.full(fine.max() + 1, -1)
    parent[fine] = coarse
    assert np.array_equal(parent[fine], coarse)


def test_the_coarse_graph_conserves_work_parameters_and_what_crosses(p1k):
    (cl,) = cluster_levels(p1k, [150], seed=0)
    c = coarse_problem(p1k, cl)
    g, cg = p1k.graph, c.problem.graph
    assert cg.n_ops < g.n_ops and c.n_clusters == cl.max() + 1
    T, Tc = p1k.cost_model.T, c.problem.cost_model.T
    assert np.allclose(np.where(np.isfinite(Tc), Tc, 0).sum(axis=0), np.where(np.isfinite(T), T, 0).sum(axis=0))
    assert cg.param_bytes.sum() == g.param_bytes.sum()
    # every fine tensor consumed outside its run is in exactly one coarse tensor
    data = g.edge_tensor >= 0
    t = g.edge_tensor[data]
    crossing = np.unique(t[c.of_op[g.tensor_op[t]] != c.of_op[g.edge_dst[data]]])
    assert cg.tensor_bytes.sum() == g.tensor_bytes[crossing].sum() == cg.out_bytes.sum()
    # runs keep every dependency: a fine edge between runs is a coarse edge
    pairs = {(int(a), int(b)) for a, b in zip(cg.edge_src, cg.edge_dst)}
    s, d = c.of_op[g.edge_src], c.of_op[g.edge_dst]
    assert all((int(a), int(b)) in pairs for a, b in zip(s, d) if a != b)
    assert np.all(cg.edge_src < cg.edge_dst)  # runs are numbered in a topological order


def test_projection_maps_every_group_and_restriction_inverts_it(p1k):
    (cl,) = cluster_levels(p1k, [100], seed=0)
    c = coarse_problem(p1k, cl)
    rng = np.random.default_rng(0)
    a = c.problem.random_assignment(rng)
    f = c.project(a)
    assert f.shape == (p1k.n_groups,) and p1k.is_valid(f)
    assert np.array_equal(f, a[c.of_group])
    assert np.array_equal(c.restrict(f, p1k), a)


def test_clusters_that_keep_an_assignment_hold_it_exactly(p1k):
    a = p1k.random_assignment(np.random.default_rng(3))
    (cl,) = cluster_levels(p1k, [50], seed=0, assignment=a)
    c = coarse_problem(p1k, cl)
    assert c.n_clusters < p1k.n_groups
    assert np.array_equal(c.project(c.restrict(a, p1k)), a)


def test_many_runs_simulate_like_the_fine_graph(p1k):
    """With a run per op the coarse graph is the fine one (tensors of an op with the
    same consumers merged), so a projected placement's step times agree."""
    (cl,) = cluster_levels(p1k, [100], seed=0)
    c = coarse_problem(p1k, cl, run_us=1e-9)
    assert c.problem.graph.n_ops == p1k.graph.n_ops
    A = np.stack([c.problem.random_assignment(np.random.default_rng(s)) for s in range(4)])
    coarse = c.problem.cost_model.simulate_batch(A).step_time_us
    fine = p1k.cost_model.simulate_batch(np.stack([c.project(a) for a in A])).step_time_us
    assert coarse == pytest.approx(fine, rel=0.02)


def test_the_method_is_registered():
    assert "multilevel" in registry.methods()
    assert registry.info("multilevel").seed_rank is None


def test_an_evaluation_budget_is_kept_and_the_result_fits(p1k):
    r = run("multilevel", p1k, Budget(evals=80), seed=0, seeds="m-etf")
    assert r.evaluations <= 80 and r.feasible and p1k.is_valid(r.assignment)
    assert r.step_time_us == pytest.approx(p1k.cost_model.simulate(r.placement).step_time_us)
    assert r.metadata["best_from"] and r.metadata["levels"][0]["stage"] == "v-cycle 1"


def test_a_seconds_budget_is_kept_without_seeds(p1k):
    """With no fine seeds the coarse pass starts the search (its levels coarsest first)."""
    r = run("multilevel", p1k, Budget(seconds=1.5), seed=2, seeds="none", clusters="200,40")
    assert r.seconds <= 1.5 + 0.3 and r.feasible and p1k.is_valid(r.assignment)
    stages = [row["stage"] for row in r.metadata["levels"]]
    assert stages[:2] == ["level 2", "level 1"]
    assert r.metadata["levels"][0]["clusters"] <= 40 and r.metadata["levels"][1]["clusters"] <= 200


def test_memory_is_honoured():
    """GPUs too small for the graph on one of them: the result still fits."""
    cm = CostModel(presets.load_graph("synthetic-1k"), presets.load_cluster("k80x4"))
    p = Problem(cm)
    on_gpu = np.where(p.allowed[:, 1], 1, 0).astype(np.int32)
    peak = cm.simulate(p.placement(on_gpu)).peak_memory_bytes[1]
    cm.capacity = cm.capacity.copy()
    cm.capacity[1:] = peak // 3
    p = Problem(cm)
    r = run("multilevel", p, Budget(evals=60), seed=0, seeds="single")
    assert r.feasible and np.all(cm.simulate(r.placement).peak_memory_bytes <= cm.capacity)


def test_a_segment_moves_a_stretch_of_the_path_onto_the_device_with_most_of_its_work(p1k):
    from placetool.search.multilevel import _heavy_candidates, _segment_candidates

    # a path of six groups that may run anywhere, on devices 1 1 2 1 3 3: it changes
    # device at positions 2, 3 and 4
    path = np.flatnonzero(p1k.allowed.all(axis=1))[:6]
    cur = np.zeros(p1k.n_groups, np.int32)
    cur[path] = [1, 1, 2, 1, 3, 3]
    work = np.zeros(p1k.n_groups)
    work[path] = [5.0, 5.0, 1.0, 5.0, 2.0, 2.0]
    # two hops from the start span the first four (devices 1 1 2 1): the third joins device 1
    (a,) = _segment_candidates(p1k, np.random.default_rng(0), cur, path, work, 1, hops=(2,))
    assert np.flatnonzero(a != cur).tolist() == [path[2]] and a[path[2]] == 1
    # the most work, not the most groups, picks the device
    work[path[2]] = 20.0
    (a,) = _segment_candidates(p1k, np.random.default_rng(0), cur, path, work, 1, hops=(2,))
    assert np.flatnonzero(a != cur).tolist() == path[[0, 1, 3]].tolist() and (a[path[[0, 1, 3]]] == 2).all()
    # as many hops as the path has: all of it, here onto device 3 (the last two weigh most)
    work[path[4:]] = 50.0
    for b in _segment_candidates(p1k, np.random.default_rng(1), cur, path, work, 4, hops=(3,)):
        assert np.flatnonzero(b != cur).tolist() == path[:4].tolist() and (b[path] == 3).all()
    # a path that never changes device offers nothing
    assert _segment_candidates(p1k, np.random.default_rng(0), np.ones_like(cur), path, work, 3) == []
    rng = np.random.default_rng(0)
    heavy = np.arange(5)
    for b in _heavy_candidates(p1k, rng, cur, heavy, np.full(5, 0.2), 4):
        diff = np.flatnonzero(b != cur)
        assert diff.size == 1 and diff[0] in heavy and p1k.is_valid(b)


def test_the_union_applies_every_picked_move_and_the_last_wins_a_conflict():
    from placetool.search.multilevel import _union

    cur = np.zeros(5, np.int32)
    cands = np.array([[1, 0, 0, 0, 0], [0, 2, 2, 0, 0], [0, 0, 3, 0, 3]], np.int32)
    assert _union(cur, cands, [0, 1, 2]).tolist() == [1, 2, 3, 0, 3]
    assert _union(cur, cands, [2, 1]).tolist() == [0, 2, 2, 0, 3]
    assert cur.tolist() == [0] * 5  # cur is left as it was


def test_the_rounds_report_what_they_kept(p1k, monkeypatch):
    from placetool.search import multilevel

    opts = dict(seeds="m-etf", pull_share=1.0, cycles=1)
    r = run("multilevel", p1k, Budget(evals=120), seed=0, **opts)
    pulls = r.metadata["pulls"]
    # synthetic-1k's path has a few transfers: the rounds pull them
    assert pulls["rounds"] >= 1 and set(pulls["kept"]) <= {"sweep", "heavy", "pull 0.005", "pull 0.02", "union"}
    assert r.evaluations <= 120 and r.feasible
    # as if it had many: stretches of it instead, which gain here too
    monkeypatch.setattr(multilevel, "SEGMENT_MIN_TRANSFERS", 1)
    r = run("multilevel", p1k, Budget(evals=120), seed=0, **opts)
    kept = r.metadata["pulls"]["kept"]
    assert set(kept) <= {"sweep", "heavy", "segment", "union"} and kept.get("segment", 0) + kept.get("union", 0) > 0
    assert r.evaluations <= 120 and r.feasible


def test_a_sweep_tries_a_group_on_every_other_device(p1k):
    from placetool.search.multilevel import _sweep_candidates

    cur = np.full(p1k.n_groups, 1, np.int32)
    k = int(np.flatnonzero(p1k.allowed.all(axis=1))[0])
    out = _sweep_candidates(p1k, cur, k)
    assert sorted(int(a[k]) for a in out) == [d for d in range(p1k.n_devices) if d != 1]
    assert all(np.flatnonzero(a != cur).tolist() == [k] for a in out)


def test_pulls_that_keep_nothing_hand_the_budget_on(p1k):
    opts = dict(seeds="m-etf", pull_share=1.0, cycles=1)
    r = run("multilevel", p1k, Budget(evals=400), seed=0, pull_patience=3, **opts)
    pulls = r.metadata["pulls"]
    assert pulls["stalled"] and pulls["rounds"] >= sum(pulls["kept"].values()) + 3
    assert r.metadata["refine"]["seconds"] > 0 and r.evaluations <= 400  # the rest went on
    r = run("multilevel", p1k, Budget(evals=400), seed=0, pull_patience=None, **opts)
    assert not r.metadata["pulls"]["stalled"] and r.metadata["pulls"]["rounds"] > pulls["rounds"]


def test_a_traced_evaluation_scores_and_counts_as_the_batch_does(p1k):
    from placetool.search import BudgetExhausted, Tracker

    rng = np.random.default_rng(0)
    A = np.stack([p1k.random_assignment(rng) for _ in range(2)])
    t = Tracker(p1k, Budget(evals=2))
    r, s = t.evaluate_traced(A[0])
    batch = p1k.cost_model.simulate_batch(A)
    assert r.step_time_us[0] == s.step_time_us == batch.step_time_us[0] and s.trace is not None
    assert r.feasible[0] == batch.feasible[0] and (r.peak_memory_bytes[0] == batch.peak_memory_bytes[0]).all()
    assert t.evaluations == 1 and t.best_step_us == r.step_time_us[0]
    t.evaluate(A[1])
    with pytest.raises(BudgetExhausted):
        t.evaluate_traced(A[0])
    assert t.evaluations == 2
