"""``exact``: branch and bound proves optima that brute force confirms, its bound never
exceeds a completion, and sa, tpe and rl reach the optima on small random problems."""

from __future__ import annotations

import itertools

import networkx as nx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from placetool.costmodel import CostModel, OpGraph, presets
from placetool.search import Budget, Problem, Tracker, run
from placetool.search.exact import (bound_into, branching_order, descend, device_classes, fill_level, make_ops,
                                    make_work, one_machine_bound, partial_bound)
from tests.helpers import brute_force, cluster, cost_models, nxgraph, random_problem


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("hetero", [False, True])
def test_exact_matches_brute_force(seed, hetero):
    p = random_problem(8, 3, seed, hetero=hetero)
    r = run("exact", p, Budget(seconds=60), seed=0, incumbent_share=0.02)
    assert r.metadata["status"] == "optimal" and r.metadata["gap"] == pytest.approx(0.0)
    assert r.step_time_us == pytest.approx(brute_force(p))
    # the bound is a bound: nothing can beat it
    assert r.metadata["bound_us"] <= r.step_time_us + 1e-9


@pytest.mark.parametrize("seed", range(3))
def test_probing_keeps_the_optimum(seed):
    # probing only drops devices that cannot win: fixed order, probing the top three
    # levels and probing all of them prove the same step time as brute force
    p = random_problem(10, 3, seed, hetero=True)
    runs = {d: run("exact", p, Budget(seconds=60), seed=0, incumbent_share=0.02, probe_depth=d)
            for d in (0, 3, None)}
    assert all(r.metadata["status"] == "optimal" for r in runs.values())
    assert runs[0].step_time_us == runs[3].step_time_us == runs[None].step_time_us == brute_force(p)


def test_one_machine_bound_by_hand():
    # job 0 (released 0, 4 µs, tail 1) is pre-empted at 1 by job 1 (2 µs, tail 5):
    # job 1 ends at 3 (+5 = 8), job 0 at 6 (+1 = 7); no order ends before 8
    r, p, q = np.array([0.0, 1.0]), np.array([4.0, 2.0]), np.array([1.0, 5.0])
    assert one_machine_bound(r, p, q, 2) == 8.0
    # one job: its release, run time and tail
    assert one_machine_bound(np.array([3.0]), np.array([2.0]), np.array([1.0]), 1) == 6.0
    # a zero-length job ends at its release (0 + tail 5); the 2 µs job ends at 3 + 0
    assert one_machine_bound(np.array([0.0, 1.0]), np.array([0.0, 2.0]), np.array([5.0, 0.0]), 2) == 5.0


def test_fill_level_by_hand():
    load = np.array([10.0, 0.0, 30.0])
    assert fill_level(load, 20.0) == 15.0  # the two emptiest reach 15, below 30
    assert fill_level(load, 5.0) == 5.0
    assert fill_level(load, 100.0) == pytest.approx(140.0 / 3)
    assert fill_level(load, 0.0) == 0.0


def test_branching_order_by_hand():
    # a (10 µs) feeds c (5 µs) over a 5 + 100 / 20 = 10 µs transfer; b (6 µs) stands alone
    g = OpGraph.from_networkx(nxgraph({v: 100 for v in "abc"}, [("a", "c", {"bytes": 100})], name="abc"))
    p = Problem(CostModel(g, cluster(2, latency=5.0, bandwidth=20.0, kinds=["gpu"] * 2),
                          op_times=np.array([[10.0, 10.0], [6.0, 6.0], [5.0, 5.0]])))
    ops = make_ops(p)
    ga, gb, gc = (int(g.group[g.index[v]]) for v in "abc")
    # after a, c weighs 5 + 0.5 x 10 = 10 against b's 6; by work alone b comes first
    assert branching_order(p, ops).tolist() == [ga, gc, gb]
    assert branching_order(p, ops, affinity=0.0).tolist() == [ga, gb, gc]


@pytest.mark.parametrize("n,seed,affinity", [(12, 0, 0.5), (30, 1, 0.5), (30, 2, 0.0), (40, 3, 2.0)])
def test_branching_order_is_the_greedy_scan(n, seed, affinity):
    # the definition, one scan per pick: the most work + affinity x pull, ties in topological order
    p = random_problem(n, 3, seed, hetero=True)
    ops = make_ops(p)
    g, G = p.graph, p.n_groups
    work = np.zeros(G)
    np.add.at(work, g.group, ops.T.min(axis=1))
    first = np.full(G, 1 << 60)
    np.minimum.at(first, g.group, g.topo_rank)
    comm = ops.out_comm.max(axis=(1, 2))
    pull, left, want = np.zeros(G), np.ones(G, bool), []
    for _ in range(G):
        s = np.where(left, work + affinity * pull, -np.inf)
        top = np.flatnonzero(s == s.max())
        k = int(top[np.argmin(first[top])])
        want.append(k)
        left[k] = False
        for e in range(len(ops.out_src)):
            a, b = g.group[ops.out_src[e]], g.group[ops.out_dst[e]]
            if a != b and k in (a, b):
                pull[b if a == k else a] += comm[e]
    assert branching_order(p, ops, affinity).tolist() == want


@pytest.mark.parametrize("seed", range(6))
def test_partial_bound_never_exceeds_a_completion(seed):
    # every partial assignment's bound is at most the best simulated completion of it
    p = random_problem(7, 3, seed, hetero=seed % 2 == 1)
    A = np.array(list(itertools.product(range(3), repeat=7)), np.int32)
    step = p.cost_model.simulate_batch(A).step_time_us
    ops = make_ops(p)
    rng = np.random.default_rng(seed)
    for _ in range(40):
        gdev = rng.integers(0, 3, size=7)
        gdev[rng.random(7) < 0.5] = -1
        fixed = gdev >= 0
        best = step[(A[:, fixed] == gdev[fixed]).all(axis=1)].min()
        assert partial_bound(gdev.astype(np.int64), ops) <= best + 1e-9


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cost_models(max_ops=6, max_devices=3), st.integers(0, 2**31))
def test_partial_bound_is_a_bound_on_any_graph(cm, seed):
    # groups, multi-output ops, control edges and send/receive costs: no partial
    # assignment is bounded above its best simulated completion
    p = Problem(cm)
    G, D = p.n_groups, p.n_devices
    A = np.array(list(itertools.product(range(D), repeat=G)), np.int32)
    step = cm.simulate_batch(A).step_time_us
    ops = make_ops(p)
    rng = np.random.default_rng(seed)
    for _ in range(10):
        gdev = rng.integers(0, D, size=G)
        gdev[rng.random(G) < 0.3] = -1
        fixed = gdev >= 0
        best = step[(A[:, fixed] == gdev[fixed]).all(axis=1)].min()
        assert partial_bound(gdev.astype(np.int64), ops) <= best + 1e-9


def two_gpus(ops, edges):
    """Ops of 1 µs on two GPUs linked at 5 µs + 20 bytes/µs; each edge carries 1,000 bytes
    (55 µs between the GPUs)."""
    g = OpGraph.from_networkx(nxgraph({v: 1000 for v in ops}, [(u, v, {"bytes": 1000}) for u, v in edges],
                                      name="two"))
    return g, Problem(CostModel(g, cluster(2, latency=5.0, bandwidth=20.0, kinds=["gpu"] * 2),
                                op_times=np.ones((len(ops), 2))))


def test_link_bound_by_hand():
    # a and b (1 µs each) on device 0 each send 1,000 bytes (5 + 1000 / 20 = 55 µs) to c
    # and d (1 µs) on device 1: the link carries 110 µs of transfers from t = 1, so d ends
    # no earlier than 1 + 55 + 55 + 1 = 112, the simulated step; without the link as a
    # machine the bound would be 58 (device 0: 2 µs of work, then 55 + 1)
    g, p = two_gpus("abcd", [("a", "c"), ("b", "d")])
    gdev = np.zeros(p.n_groups, np.int64)
    for v in "cd":
        gdev[g.group[g.index[v]]] = 1
    assert partial_bound(gdev, make_ops(p)) == 112.0
    assert p.cost_model.simulate(gdev[g.group].astype(np.int32)).step_time_us == 112.0


def test_inputs_over_one_link_arrive_one_after_another():
    # a and b (1 µs each, on device 0) both feed c on device 1 over 55 µs transfers: with
    # unlimited devices both end at 1, but the link sends one at a time, so c's inputs are
    # all there no earlier than 1 + 55 + 55 = 111 (the simulator's start of c)
    g, p = two_gpus("abc", [("a", "c"), ("b", "c")])
    gdev = np.zeros(p.n_groups, np.int64)
    gdev[g.group[g.index["c"]]] = 1
    ops = make_ops(p)
    w = make_work(*ops.T.shape)
    assert bound_into(gdev, ops, w) == 112.0
    assert w.ready[g.index["c"], 1] == 111.0
    assert p.cost_model.simulate(gdev[g.group].astype(np.int32)).step_time_us == 112.0


def test_identical_devices_are_one_class_and_a_faster_one_is_not():
    p = random_problem(6, 3, 0)
    assert device_classes(p).tolist() == [0, 0, 0]
    T = p.cost_model.T.copy()
    T[:, 2] *= 0.5
    q = Problem(CostModel(p.graph, p.cluster, op_times=T))
    assert device_classes(q).tolist() == [0, 0, 2]


def test_exact_two_independent_ops_known_answer():
    # a -> nothing, b -> nothing: 10 and 7 µs on two devices in parallel: 10
    g = nx.DiGraph()
    g.add_node("a", op_type="Op", out_bytes=0)
    g.add_node("b", op_type="Op", out_bytes=0)
    p = Problem(CostModel(OpGraph.from_networkx(g, "two"), cluster(2, kinds=["gpu"] * 2),
                          op_times=np.array([[10.0, 10.0], [7.0, 7.0]])))
    r = run("exact", p, Budget(seconds=10))
    assert r.step_time_us == 10.0 and r.metadata["status"] == "optimal"
    assert r.assignment[0] != r.assignment[1]


@pytest.mark.parametrize("seed", range(3))
def test_descend_ends_where_no_single_group_move_is_faster(seed):
    p = random_problem(12, 3, seed, latency=5.0, bandwidth=20.0, hetero=True)
    start = np.random.default_rng(seed).integers(0, 3, p.n_groups).astype(np.int32)
    step0 = float(p.cost_model.simulate_batch(start[None]).step_time_us[0])
    t = Tracker(p, Budget(evals=10**5))
    step = descend(p, t, start, step0)
    a = t.best_assignment
    assert step == t.best_step_us <= step0
    assert step == float(p.cost_model.simulate_batch(a[None]).step_time_us[0])
    # every neighbour, simulated here one by one: none is faster
    for g, d in itertools.product(range(p.n_groups), range(3)):
        b = a.copy()
        b[g] = d
        assert p.cost_model.simulate(p.graph.to_placement(b)).step_time_us >= step


def test_exact_reports_a_gap_when_the_budget_ends_first():
    p = random_problem(40, 4, 1, hetero=True)
    r = run("exact", p, Budget(evals=300), seed=0, seeds=("single",))
    m = r.metadata
    assert m["bound_us"] <= r.step_time_us
    if m["status"] == "feasible":
        assert m["gap"] == pytest.approx(r.step_time_us / m["bound_us"] - 1)


def test_exact_keeps_its_time_budget_on_a_large_graph():
    # a node of synthetic-10k bounds 5 children over 28k ops and edges (~3 ms): 4,096
    # nodes between budget checks took 12 s against a budget of 1 s
    run("exact", random_problem(8, 2, 0), Budget(seconds=0.2))  # compiled code loaded outside the timing
    p = Problem(CostModel(presets.load_graph("synthetic-10k"), presets.load_cluster("k80x4")))
    r = run("exact", p, Budget(seconds=1), seed=0)
    assert r.seconds < 3
    assert r.metadata["status"] == "feasible" and r.metadata["nodes"] >= r.metadata["nodes_per_call"]


INSTANCES = [(12, 3, 0), (16, 2, 1), (16, 3, 4), (24, 3, 0), (28, 3, 0)]
#: the share above the proven optimum each searcher must come within at these budgets
#: (seed 0): 2% by default; where one stops short, its measured gap plus about a point,
#: so that stopping further short fails (measured gaps in the comments)
CEILING = {("tpe", (16, 3, 4)): 0.095,  # 8.6% (356.2 against 328.0) at 300 trials
           ("tpe", (24, 3, 0)): 0.10,   # 9.3% (401.8 against 367.75)
           ("tpe", (28, 3, 0)): 0.11,   # 10.1% (424.1 against 385.2) since dispatch joined its starting points; 7.3% before
           ("rl", (16, 3, 4)): 0.085,   # 7.7% (353.2 against 328.0); earlier code stayed 8.6% above at 20,000 samples
           ("rl", (24, 3, 0)): 0.10}    # 9.3% (401.8), as earlier on 4 of seeds 0-9 (on 1 with widen_after=5)


@pytest.fixture(scope="module")
def optima():
    """Each instance with its proven optimum (computed once for all methods)."""
    out = {}
    for n, devices, seed in INSTANCES:
        p = random_problem(n, devices, seed, latency=5.0, bandwidth=20.0, hetero=True)
        ex = run("exact", p, Budget(seconds=60), seed=0, incumbent_share=0.01)
        assert ex.metadata["status"] == "optimal", ex.metadata
        out[n, devices, seed] = (p, ex.step_time_us)
    return out


@pytest.mark.parametrize("inst", INSTANCES)
@pytest.mark.parametrize("method,evals", [("sa", 5000), ("tpe", 300), ("rl", 5000)])
def test_searchers_reach_the_proven_optimum(optima, inst, method, evals):
    p, best = optima[inst]
    r = run(method, p, Budget(evals=evals), seed=0)
    ceiling = CEILING.get((method, inst), 0.02)
    assert r.step_time_us <= best * (1 + ceiling), f"{r.step_time_us / best - 1:.1%} above the optimum {best}"
