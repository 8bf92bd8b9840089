"""sa and tpe: brute-force optima, determinism, valid placements, storage."""

from __future__ import annotations

import itertools

import networkx as nx
import numpy as np
import pytest

from placetool.costmodel import CostModel, OpGraph, presets
from placetool.search import Budget, Problem, SearchError, run
from placetool.search.tpe import coarsen

from .helpers import cluster as make_cluster


def eight_groups():
    """8 groups on 2 GPUs (256 assignments): two 4-op chains that meet at a sink, a
    variable grouped with its reader, tensors worth sending only sometimes."""
    rng = np.random.default_rng(7)
    g = nx.DiGraph()
    names = [f"op{i}" for i in range(9)]
    for i, v in enumerate(names):
        g.add_node(v, op_type="Op", out_bytes=int(rng.integers(100, 2000)),
                   group="var" if i in (0, 8) else None)
    edges = [(0, 1), (1, 2), (2, 3), (0, 4), (4, 5), (5, 6), (3, 7), (6, 7), (7, 8), (2, 6)]
    g.add_edges_from((names[u], names[v]) for u, v in edges)
    graph = OpGraph.from_networkx(g, "eight")
    assert graph.n_groups == 8
    T = rng.uniform(5, 60, size=(9, 1)) * np.array([[1.0, 1.3]])  # gpu:1 is slower
    cl = make_cluster(2, latency=2.0, bandwidth=100.0, kinds=["gpu", "gpu"])
    return CostModel(graph, cl, op_times=T)


def brute_force(cm):
    A = np.array(list(itertools.product(range(cm.n_devices), repeat=cm.graph.n_groups)), np.int32)
    r = cm.simulate_batch(A)
    step = np.where(r.feasible, r.step_time_us, np.inf)
    return float(step.min()), A


@pytest.fixture(scope="module")
def eight():
    cm = eight_groups()
    best, A = brute_force(cm)
    return cm, best


def test_the_brute_force_instance_is_not_solved_by_the_simple_baselines(eight):
    cm, best = eight
    for m in ("single", "round-robin"):
        assert run(m, Problem(cm), Budget(evals=10), seed=0).step_time_us > best * 1.02


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["auto", "incremental", "batch"])
def test_sa_finds_the_brute_force_optimum(eight, mode):
    cm, best = eight
    # seeded only by `single`, so the annealing itself must find it, in < half the space
    r = run("sa", Problem(cm), Budget(evals=120), seed=1, mode=mode, seeds=("single",))
    assert r.feasible and r.step_time_us == best
    assert r.evaluations <= 120


@pytest.mark.timeout(120)
def test_tpe_finds_the_brute_force_optimum(eight):
    cm, best = eight
    r = run("tpe", Problem(cm), Budget(evals=150), seed=1, seeds=("single",))
    assert r.metadata["variables"] == 8  # small enough not to be coarsened
    assert r.feasible and r.step_time_us == best


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["sa", "tpe"])
def test_same_seed_same_answer(method):
    cm = CostModel(presets.load_graph("synthetic-300"), presets.load_cluster("k80x2"))
    opts = {"variables": 30} if method == "tpe" else {}
    runs = [run(method, Problem(cm), Budget(evals=120), seed=s, **opts) for s in (5, 5)]
    assert np.array_equal(runs[0].assignment, runs[1].assignment)
    assert runs[0].step_time_us == runs[1].step_time_us
    assert [(e, b) for e, _, b in runs[0].history] == [(e, b) for e, _, b in runs[1].history]


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["sa", "tpe"])
def test_placements_are_valid_and_fit_in_memory(method):
    """Pinned input ops stay on the CPU, groups stay whole; with memory so tight that
    some placements run out, the answer still fits."""
    g = presets.load_graph("synthetic-300")
    cl = presets.load_cluster("k80x2")
    cm = CostModel(g, cl)
    pr = Problem(cm)
    # memory: room for about 60% of the parameters and the largest tensors on each GPU
    cap = int(0.6 * g.param_bytes.sum() + 2 * np.sort(g.out_bytes)[-20:].sum())
    for d in cl.devices[1:]:
        object.__setattr__(d, "memory_bytes", cap)
    cm = CostModel(g, cl)
    pr = Problem(cm)
    r = run(method, pr, Budget(evals=150), seed=0)
    assert pr.is_valid(r.assignment)
    assert cm.violation(r.placement) is None
    full = cm.simulate(r.placement)
    assert r.feasible and full.feasible and full.step_time_us == r.step_time_us
    cpu_only = np.flatnonzero(g.allowed == 1)
    assert cpu_only.size and np.all(r.placement[cpu_only] == 0)


def test_coarsening_keeps_chunks_topological_and_pinned_groups_fixed():
    cm = CostModel(presets.load_graph("synthetic-1k"), presets.load_cluster("k80x4"))
    pr = Problem(cm)
    chunk, k, devs = coarsen(pr, 100)
    assert 90 <= k <= 100
    assert np.all(chunk[pr.allowed.sum(axis=1) < 2] == -1)
    first = np.full(pr.n_groups, 1 << 40)
    np.minimum.at(first, cm.graph.group, cm.graph.topo_rank)
    m = chunk >= 0
    order = np.argsort(first[m], kind="stable")
    assert np.all(np.diff(chunk[m][order]) >= 0)  # chunks are runs in topological order
    assert all(len(d) >= 2 for d in devs)


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_tpe_storage_persists_and_resumes_a_study(tmp_path, kind):
    import optuna

    from placetool.search.tpe import _storage

    cm = CostModel(presets.load_graph("synthetic-200"), presets.load_cluster("k80x2"))
    url = f"sqlite:///{tmp_path / 'study.db'}" if kind == "sqlite" else f"journal:///{tmp_path / 'study.log'}"
    # (sqlite commits every parameter: keep the study small)
    opts = dict(variables=4, seeds=("single", "round-robin"), batch=4)
    r1 = run("tpe", Problem(cm), Budget(evals=12), seed=3, storage=url, **opts)
    r2 = run("tpe", Problem(cm), Budget(evals=12), seed=3, storage=url, **opts)
    assert r1.metadata["resumed_trials"] == 0
    assert r2.metadata["study"] == r1.metadata["study"]
    # the second process found the first one's trials and added its own
    assert r2.metadata["resumed_trials"] == r1.metadata["trials"] > 0
    st = optuna.load_study(study_name=r1.metadata["study"], storage=_storage(url))
    assert len(st.trials) == r1.metadata["trials"] + r2.metadata["trials"]
    assert st.study_name.startswith("placetool-tpe-synthetic-200-200ops-k80x2-")
    attrs = st.user_attrs
    assert (attrs["graph"], attrs["cluster"], attrs["devices"], attrs["seed"]) == ("synthetic-200", "k80x2", 3, 3)
    assert attrs["groups"] == cm.graph.n_groups and attrs["lower_bound_us"] == Problem(cm).lower_bound_us()
    # a different seed is a different study
    r3 = run("tpe", Problem(cm), Budget(evals=6), seed=4, storage=url, **opts)
    assert r3.metadata["study"] != r1.metadata["study"] and r3.metadata["resumed_trials"] == 0


@pytest.mark.parametrize("url", ["sqlite:///{tmp}/no/such/folder/study.db", "journal:///{tmp}/no/such/study.log"])
def test_tpe_storage_in_a_missing_folder_is_an_error_even_when_the_seeds_use_the_budget(tmp_path, url):
    # five evaluations are all spent on the seeds: the study is never opened, and without
    # the check the run would succeed and keep nothing
    cm = CostModel(presets.load_graph("synthetic-50"), presets.load_cluster("k80x2"))
    url = url.format(tmp=tmp_path)
    with pytest.raises(SearchError, match="does not exist"):
        run("tpe", Problem(cm), Budget(evals=5), seed=0, storage=url)
    assert not any(tmp_path.iterdir())


def test_tpe_bad_storage_is_a_clear_error():
    cm = CostModel(presets.load_graph("synthetic-200"), presets.load_cluster("k80x2"))
    with pytest.raises(SearchError, match="cannot open Optuna storage"):
        run("tpe", Problem(cm), Budget(evals=40), seed=0, storage="nosuchdb://x/y", seeds=("single",))


@pytest.mark.timeout(120)
def test_sa_engines_give_the_same_run():
    """Whichever engine scores the batches (auto switches between them as it times
    them), a run under an evaluation budget takes the same steps to the same answer."""
    cm = CostModel(presets.load_graph("synthetic-300"), presets.load_cluster("k80x4"))
    runs = {m: run("sa", Problem(cm), Budget(evals=600), seed=3, mode=m, threads=2)
            for m in ("auto", "incremental", "batch")}
    auto = runs["auto"].metadata
    assert auto["mode"] in ("incremental", "batch")
    assert all(v is not None and v > 0 for v in auto["us_per_evaluation"].values())  # both timed
    assert runs["incremental"].metadata["mode"] == "incremental" and runs["batch"].metadata["mode"] == "batch"
    for m in ("incremental", "batch"):
        assert np.array_equal(runs[m].assignment, runs["auto"].assignment)
        assert [(e, b) for e, _, b in runs[m].history] == [(e, b) for e, _, b in runs["auto"].history]
        assert runs[m].metadata["accepted"] == auto["accepted"] and runs[m].metadata["restarts"] == auto["restarts"]


def test_sa_rejects_an_unknown_mode():
    cm = CostModel(presets.load_graph("synthetic-200"), presets.load_cluster("k80x2"))
    with pytest.raises(SearchError, match="mode"):
        run("sa", Problem(cm), Budget(evals=10), seed=0, mode="quantum")


def _chain_problem():
    """a (1 µs) -> b (1 µs) with a 10-byte tensor over a 1 B/µs link, no latency."""
    import networkx as nx

    from tests.helpers import cluster

    g = nx.DiGraph()
    g.add_node("a", op_type="Op", out_bytes=10)
    g.add_node("b", op_type="Op", out_bytes=0)
    g.add_edge("a", "b", bytes=10)
    cl = cluster(2, latency=0.0, bandwidth=1.0, kinds=["gpu"] * 2)
    return Problem(CostModel(OpGraph.from_networkx(g, "chain"), cl, op_times=np.ones((2, 2))))


def test_critical_path_of_a_split_chain_holds_its_transfer():
    from placetool.search.critical import CriticalMoves, CriticalPath

    p = _chain_problem()
    cp = CriticalPath(p.cost_model, np.array([0, 1], np.int32))  # a 0..1, transfer 1..11, b 11..12
    assert cp.step_time_us == 12.0
    assert cp.groups.tolist() == [0, 1] and cp.comm.tolist() == [[0, 1]]
    pulled = CriticalMoves(p, np.random.default_rng(0)).propose(np.array([0, 1], np.int32), cp, "pull")
    assert pulled[0] == pulled[1]  # both ends of the transfer on one device: 2 µs
    assert p.cost_model.simulate(pulled).step_time_us == 2.0


def test_critical_path_is_kept_only_for_sideways_moves_off_it():
    import networkx as nx

    from placetool.search.critical import CriticalPath
    from tests.helpers import cluster

    g = nx.DiGraph()  # a -> b on device 0 is the path (1 + 1 µs); c runs alone on device 1
    for name in "abc":
        g.add_node(name, op_type="Op", out_bytes=0)
    g.add_edge("a", "b", bytes=0)
    cl = cluster(2, latency=0.0, bandwidth=1.0, kinds=["gpu"] * 2)
    p = Problem(CostModel(OpGraph.from_networkx(g, "fork"), cl,
                          op_times=np.array([[1.0, 1.0], [1.0, 1.0], [0.5, 0.25]])))
    grp = p.graph.group[[p.graph.names.index(n) for n in "abc"]]
    a = np.zeros(p.n_groups, np.int32)
    a[grp[2]] = 1
    cp = CriticalPath(p.cost_model, a)
    assert cp.step_time_us == 2.0 and sorted(cp.groups.tolist()) == sorted(grp[:2].tolist())
    assert cp.still_holds(grp[[2]], 2.0)  # c moved, the step unchanged: keep the path
    assert not cp.still_holds(grp[[2]], 2.5)  # the step changed
    assert not cp.still_holds(grp[[1]], 2.0)  # b is on the path
    cp.moved(grp[[2]], np.array([1]), np.array([0]), p.group_time)
    assert cp.busy_us.tolist() == [2.5, 0.0]


def test_region_move_takes_a_connected_region_to_a_neighbours_device():
    import networkx as nx

    from placetool.search.critical import CriticalMoves, CriticalPath, _region
    from tests.helpers import cluster

    # a0 -> a1 -> a2 -> a3 -> a4 and a2 -> x; a0-a2 on gpu 0, a3-a4 on gpu 1, x on gpu 2
    g = nx.DiGraph()
    names = ["a0", "a1", "a2", "a3", "a4", "x"]
    for name in names:
        g.add_node(name, op_type="Op", out_bytes=4)
    g.add_edges_from([("a0", "a1"), ("a1", "a2"), ("a2", "a3"), ("a3", "a4"), ("a2", "x")], bytes=4)
    cl = cluster(3, latency=1.0, bandwidth=1.0, kinds=["gpu"] * 3)
    p = Problem(CostModel(OpGraph.from_networkx(g, "region"), cl, op_times=np.ones((6, 3))))
    grp = {n: int(p.graph.group[p.graph.names.index(n)]) for n in names}
    a = np.zeros(p.n_groups, np.int32)
    a[[grp["a3"], grp["a4"]]] = 1
    a[grp["x"]] = 2
    mv = CriticalMoves(p, np.random.default_rng(0), region_max=8)
    out = np.zeros(p.n_groups, np.int64)
    boundary = np.zeros(3, np.int64)
    n = _region(grp["a1"], 8, a, mv.nb_ptr, mv.nb, mv.movable, np.zeros(p.n_groups, np.int64), 1, out, boundary)
    assert sorted(out[:n].tolist()) == sorted(grp[k] for k in ("a0", "a1", "a2"))
    assert boundary.tolist() == [0, 1, 1]  # a3 on gpu 1, x on gpu 2, each counted once
    n = _region(grp["a1"], 2, a, mv.nb_ptr, mv.nb, mv.movable, np.zeros(p.n_groups, np.int64), 1, out,
                np.zeros(3, np.int64))
    assert n == 2 and out[0] == grp["a1"]
    # every proposal moves a connected run of the chain's gpu-0 part, or a3-a4, or x, to a
    # device a neighbour of it is on
    cp = CriticalPath(p.cost_model, a)
    name_of = {k: name for name, k in grp.items()}
    seen = set()
    for _ in range(60):
        b = mv.propose(a, cp, "region")
        if b is None:
            continue
        moved = np.flatnonzero(b != a)
        devs = set(b[moved].tolist())
        assert len(devs) == 1 and len(set(a[moved].tolist())) == 1 and len(moved) <= 8
        seen.add((tuple(sorted(name_of[k] for k in moved)), devs.pop()))
    chain0 = [("a0",), ("a1",), ("a2",), ("a0", "a1"), ("a1", "a2"), ("a0", "a1", "a2")]
    allowed = {(c, d) for c in chain0 for d in (1, 2)} | {(c, d) for c in [("a3",), ("a4",), ("a3", "a4")]
                                                          for d in (0,)} | {(("x",), 0)}
    assert seen and seen <= allowed, seen - allowed


def test_sa_moves_option_is_checked():
    p = _chain_problem()
    with pytest.raises(SearchError, match="moves"):
        run("sa", p, Budget(evals=10), seed=0, moves="psychic")
    with pytest.raises(SearchError, match="kinds"):
        run("sa", p, Budget(evals=10), seed=0, kinds="pull,psychic")


def test_a_one_shot_seed_that_ends_after_the_seeding_share_still_seeds():
    import time as _time

    from placetool.search import Tracker, registry
    from placetool.search.seeding import seed_assignments
    from placetool.search.tracker import score

    p = _chain_problem()

    @registry.register("slow-one-shot", seed_rank=99)
    def slow(problem, budget, seed, tracker):
        _time.sleep(0.3)  # past the seeding share of a 0.5 s budget (0.2 s)
        score(tracker, np.array([1, 1], np.int32))

    try:
        tracker = Tracker(p, Budget(seconds=0.5))
        seeds, skipped = seed_assignments(p, Budget(seconds=0.5), 0, tracker, names=("slow-one-shot",))
        assert [(o, n, a.tolist()) for o, n, a in seeds] == [(2.0, "slow-one-shot", [1, 1])]
        assert tracker.evaluations == 1 and not skipped
    finally:
        del registry.REGISTRY["slow-one-shot"]


def test_method_table_is_complete_when_first_read_from_many_threads():
    # a fresh interpreter: the table fills on first use, here from 8 threads at once
    import subprocess
    import sys

    code = ("import threading\nfrom placetool.search import registry\nout = []\n"
            "ts = [threading.Thread(target=lambda: out.append(len(registry.methods()))) for _ in range(8)]\n"
            "[t.start() for t in ts]; [t.join() for t in ts]\nprint(sorted(set(out)))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    counts = eval(r.stdout)
    assert len(counts) == 1 and counts[0] >= 14


def test_kind_odds_favour_the_kinds_that_improve_and_keep_every_kind_alive():
    from placetool.search.annealing import KindOdds

    odds = KindOdds(("pull", "swap", "region"))
    assert odds.odds() == pytest.approx([1 / 3] * 3)  # no evidence yet: uniform
    for _ in range(200):  # pull improves in every batch it leads, the others never
        odds.record(["pull", "swap", "region", "random"], "pull", True)
        odds.record(["pull", "swap", "region"], "swap", False)
    o = odds.odds()
    assert o.sum() == pytest.approx(1.0)
    assert o[0] > 0.45 and o[1] == pytest.approx(o[2]) and o[1] >= 0.5 / 3
    # counts halve once 1000 proposals per kind were made, so the odds can turn
    for _ in range(1000):
        odds.record(["pull", "swap", "region"], "swap", True)
    assert odds.used.sum() < 3000 and odds.odds()[1] > odds.odds()[0]
    rng = np.random.default_rng(0)
    drawn = [odds.draw(rng) for _ in range(2000)]
    assert drawn.count("swap") / 2000 == pytest.approx(odds.odds()[1], abs=0.04)


def test_sa_restart_kicks_widen_while_restarts_find_nothing_new():
    # 36 groups, 3 devices: sa finds its best early and restarts from it again and again;
    # each restart that finds no new best doubles the kick (2, 4, 8) up to a quarter of
    # the groups (9), so after a few such restarts the widest kick reaches 9
    from tests.test_search_exact import random_problem

    p = random_problem(36, 3, 2, latency=5.0, bandwidth=20.0, hetero=True)
    r = run("sa", p, Budget(evals=20000), seed=0)
    assert r.metadata["restarts"] >= 8
    assert r.metadata["widest_kick"] == 36 // 4
    short = run("sa", p, Budget(evals=600), seed=0)
    assert short.metadata["widest_kick"] in (0, 2)  # no restart yet, or a first one at the smallest kick


def test_sa_batches_have_a_neighbour_per_thread_under_a_time_budget_and_8_under_an_evaluation_budget():
    import numba

    cm = CostModel(presets.load_graph("synthetic-200"), presets.load_cluster("k80x2"))
    p = Problem(cm)
    assert run("sa", p, Budget(seconds=0.3), seed=0).metadata["batch"] == max(8, numba.get_num_threads())
    assert run("sa", p, Budget(seconds=0.3), seed=0, threads=12).metadata["batch"] == 12
    # an evaluation budget: the same answer whatever the machine's cores
    assert run("sa", p, Budget(evals=100), seed=0, threads=12).metadata["batch"] == 8
    assert run("sa", p, Budget(evals=100), seed=0, batch=3).metadata["batch"] == 3
