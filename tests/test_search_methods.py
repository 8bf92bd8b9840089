"""Expert, partitioners and list schedulers: known answers, validity, memory, determinism."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from placetool.costmodel import CostModel, synthetic
from placetool.costmodel.graph import OpGraph
from placetool.search import Budget, Problem, SearchError, check_options, run
from placetool.search.listsched import _Data, sct_favourite_children
from placetool.search.partition import repair_memory
from placetool.search.problem import group_memory_bytes
from tests.helpers import assignments, cluster, cost_models, nxgraph

OURS = ["expert", "metis", "mincut", "heft", "critical-path", "m-topo", "m-etf", "m-sct"]
ALL = OURS + ["single", "round-robin", "random"]
MEMORY_AWARE = ["m-topo", "m-etf", "m-sct", "heft", "critical-path"]

# Topcuoglu, Hariri & Wu (IEEE TPDS 2002), Fig. 2: computation cost of n1..n10 on P1..P3
# and communication cost per edge (zero on the same processor).
TOPC_W = [(14, 16, 9), (13, 19, 18), (11, 13, 19), (13, 8, 17), (12, 13, 10),
          (13, 16, 9), (7, 15, 11), (5, 11, 14), (18, 12, 20), (21, 7, 16)]
TOPC_E = [(1, 2, 18), (1, 3, 12), (1, 4, 9), (1, 5, 11), (1, 6, 14), (2, 8, 19), (2, 9, 16),
          (3, 7, 23), (4, 8, 27), (4, 9, 23), (5, 9, 13), (6, 8, 15), (7, 10, 17), (8, 10, 11),
          (9, 10, 13)]


def topcuoglu_problem():
    g = nx.DiGraph()
    for v in range(1, 11):
        g.add_node(f"n{v}", op_type="Op", out_bytes=0)
    for k, (u, v, c) in enumerate(TOPC_E):  # one tensor per edge: bytes = cost at 1 B/µs
        g.add_edge(f"n{u}", f"n{v}", bytes=c, output=k)
    cl = cluster(3, latency=0.0, bandwidth=1.0, kinds=["gpu"] * 3)
    cm = CostModel(OpGraph.from_networkx(g, "topcuoglu"), cl, op_times=np.array(TOPC_W, float))
    return Problem(cm)


def test_heft_reproduces_topcuoglu_example():
    p = topcuoglu_problem()
    data = _Data(p, links="ideal")  # the paper's model: edges never queue
    ru = data.rank_u()
    np.testing.assert_allclose(ru, [108, 77, 80, 80, 69, 63 + 1 / 3, 42 + 2 / 3, 35 + 2 / 3, 44 + 1 / 3, 14 + 2 / 3])
    _, (place, start, finish, fallbacks) = data.eft(ru)
    # The paper's Fig. 4(a): n1 P3, n2 P1, n3 P3, n4 P2, n5 P3, n6 P2, n7 P3, n8 P1, n9 P2, n10 P2.
    assert place.tolist() == [2, 0, 2, 1, 2, 1, 2, 0, 1, 1]
    assert start.tolist() == [0, 27, 9, 18, 28, 26, 38, 57, 56, 73]
    assert finish.max() == 80 and fallbacks == 0
    r = run("heft", p, Budget(evals=5), links="ideal")
    assert r.metadata["planned_us"] == 80
    assert r.assignment.tolist() == [2, 0, 2, 1, 2, 1, 2, 0, 1, 1]


def test_heft_without_insertion_is_no_better():
    p = topcuoglu_problem()
    data = _Data(p, links="ideal")
    _, out = data.eft(data.rank_u(), insertion=False)
    assert out[2].max() >= 80


def test_cpop_reproduces_topcuoglu_example():
    # Same paper: the critical path is n1 n2 n9 n10 (|CP| = 54 on P2); CPOP's schedule is 86.
    r = run("critical-path", topcuoglu_problem(), Budget(evals=5), links="ideal")
    assert r.metadata["critical_path_ops"] == 4
    assert r.metadata["critical_path_device"] == "d1"
    assert r.metadata["planned_us"] == 86
    a = r.assignment
    assert a[0] == a[1] == a[8] == a[9] == 1


def small_problem(n=120, seed=3, **kw):
    g = synthetic.layered(n, seed=seed)
    return Problem(CostModel(g, cluster(3, **kw)))


@pytest.mark.parametrize("method", ALL)
def test_every_method_gives_a_valid_placement(method):
    p = small_problem()
    g = p.graph
    r = run(method, p, Budget(evals=50, seconds=20), seed=1)
    assert p.is_valid(r.assignment)
    assert np.array_equal(r.placement, r.assignment[g.group])  # groups whole
    pinned = np.flatnonzero(g.allowed == 1)
    assert pinned.size and np.all(r.placement[pinned] == 0)  # CPU-only ops on the CPU
    assert r.feasible and np.isfinite(r.step_time_us)
    assert r.step_time_us >= r.lower_bound_us - 1e-6
    sim = p.cost_model.simulate(r.placement)
    assert sim.step_time_us == pytest.approx(r.step_time_us)


def test_options_are_checked_against_the_signature_before_the_method_runs():
    p = small_problem()
    with pytest.raises(SearchError, match=r"method 'sa': option 'batch' must be an integer >= 1 or none, got 0"):
        run("sa", p, Budget(evals=10), batch=0)
    with pytest.raises(SearchError, match="option 'patience' must be an integer >= 1 or none, got 2.0"):
        run("sa", p, Budget(evals=10), patience=2.0)
    with pytest.raises(SearchError, match="takes no option 'bogus'"):
        run("heft", p, Budget(evals=10), bogus=1)
    with pytest.raises(SearchError, match=r"method 'tpe': option 'startup' must be an integer >= 0, got -1"):
        run("tpe", p, Budget(evals=10), startup=-1)
    # numbers become floats where a number is asked for; None where allowed; unannotated
    # options and rl's own settings pass through unchecked
    assert check_options("sa", {"guided": 1, "patience": None, "kinds": "pull"}) == \
        {"guided": 1.0, "patience": None, "kinds": "pull"}
    assert isinstance(check_options("sa", {"guided": 1})["guided"], float)
    assert check_options("rl", {"explore": 2, "lr": "x"}) == {"explore": 2.0, "lr": "x"}
    r = run("sa", p, Budget(evals=30), seed=0, guided=1, accept_end=0)  # edges of the ranges are fine
    assert r.feasible
    assert check_options("tpe", {"startup": 0}) == {"startup": 0}


@pytest.mark.parametrize("method", OURS)
def test_same_seed_same_answer(method):
    p = small_problem(n=150, seed=5)
    a = run(method, p, Budget(evals=20), seed=7)
    b = run(method, p, Budget(evals=20), seed=7)
    assert np.array_equal(a.assignment, b.assignment) and a.step_time_us == b.step_time_us


def tight_problem():
    """Parameters dominate memory; each GPU holds about 40% of all the memory needed."""
    g0 = synthetic.layered(200, seed=11)
    param = np.array([50 * int(b) if t == "VarHandleOp" else 0 for t, b in zip(g0.op_types, g0.out_bytes)], np.int64)
    g = OpGraph.from_arrays(g0.name, g0.names, g0.op_types, g0.out_bytes, g0.edge_src, g0.edge_dst,
                            edge_tensor=g0.edge_tensor, tensor_op=g0.tensor_op, tensor_bytes=g0.tensor_bytes,
                            param_bytes=param, flops=g0.flops, group=g0.group, allowed=g0.allowed)
    probe = Problem(CostModel(g, cluster(4)))
    mem = group_memory_bytes(probe)
    cpu_need = int(mem[~probe.allowed[:, 1]].sum())
    gpu_cap = int(0.4 * mem.sum())
    cl = cluster(4, memory=[cpu_need + 1, gpu_cap, gpu_cap, gpu_cap])
    return Problem(CostModel(g, cl)), mem, gpu_cap


@pytest.mark.parametrize("method", MEMORY_AWARE)
def test_list_schedulers_respect_tight_memory(method):
    p, mem, cap = tight_problem()
    # the memory really is tight: all GPU groups on one GPU overflow it in simulation
    single_gpu = np.where(p.allowed[:, 1], 1, 0)
    assert not p.cost_model.simulate(single_gpu).feasible
    r = run(method, p, Budget(evals=5), seed=0)
    assert r.feasible, p.cost_model.simulate(r.placement).reason
    used = np.bincount(r.assignment, weights=mem, minlength=p.n_devices)
    assert np.all(used <= p.cost_model.capacity)  # the estimate is honoured, not just the sim
    assert r.metadata.get("memory_fallbacks", 0) == 0


@pytest.mark.parametrize("method", ["metis", "mincut"])
def test_partitioners_repair_memory(method):
    p, mem, cap = tight_problem()
    r = run(method, p, Budget(evals=5), seed=0)
    assert r.feasible  # the tracker keeps the faster of the cut and its repaired version
    # the repair itself honours the estimate, starting from everything on one GPU
    fixed = repair_memory(p, np.where(p.allowed[:, 1], 1, 0))
    assert p.is_valid(fixed) and p.cost_model.simulate(fixed).feasible
    assert np.all(np.bincount(fixed, weights=mem, minlength=p.n_devices) <= p.cost_model.capacity)


def two_cliques():
    """Two 5-op cliques (heavy tensors) joined by one light edge; no pinned ops."""
    nodes, edges = {}, []
    for c in "ab":
        for i in range(5):
            nodes[f"{c}{i}"] = {"out_bytes": 10_000_000, "flops": 1e9}
        edges += [(f"{c}{i}", f"{c}{j}") for i in range(5) for j in range(i + 1, 5)]
    nodes["a4"] = {"out_bytes": 10_000_000, "flops": 1e9}
    edges.append(("a4", "b0", {"bytes": 8, "output": 1}))
    g = OpGraph.from_networkx(nxgraph(nodes, edges))
    return Problem(CostModel(g, cluster(3)))


@pytest.mark.parametrize("method", ["metis", "mincut"])
def test_partitioners_cut_the_light_edge(method):
    p = two_cliques()
    r = run(method, p, Budget(evals=5), seed=0)
    a = r.assignment
    assert len(set(a[:5])) == 1 and len(set(a[5:])) == 1 and a[0] != a[5]
    assert set(a.tolist()) == {1, 2}  # one clique per GPU, nothing on the CPU


def test_problem_traffic_is_the_group_edges_computed_once():
    """Known answer on the two cliques: one light edge between them (8 bytes), and every
    reader gets the same read-only arrays."""
    from placetool.search.problem import group_edges

    p = two_cliques()
    s, d, w = p.traffic()
    expect = group_edges(p)
    for x, y in zip((s, d, w), expect):
        np.testing.assert_array_equal(x, y)
    cross = (s < 5) != (d < 5)
    assert cross.sum() == 1 and w[cross].tolist() == [8.0]
    assert all(x is y for x, y in zip(p.traffic(), (s, d, w)))
    with pytest.raises(ValueError):
        w[0] = 1.0


def test_a_preset_problem_is_its_bundled_graph_on_its_bundled_cluster():
    from placetool.costmodel import presets

    p = Problem.preset("synthetic-40/k80x2")
    assert p.graph.n_ops == presets.load_graph("synthetic-40").n_ops and p.cluster.names == ["cpu:0", "gpu:0", "gpu:1"]
    for bad in ("synthetic-40", "synthetic-40/", "/k80x2", "a/b/c"):
        with pytest.raises(SearchError, match="GRAPH/CLUSTER"):
            Problem.preset(bad)


def test_problem_neighbours_are_each_groups_linked_groups_computed_once():
    """Known answer on the two cliques (groups a0..a4, b0..b4 = 0..9, a4 -> b0 the one
    link between them): a group's clique mates, and across the light edge for a4 and b0;
    every reader gets the same read-only arrays."""
    p = two_cliques()
    nb_ptr, nb = p.neighbours()
    links = [sorted(nb[nb_ptr[g]:nb_ptr[g + 1]].tolist()) for g in range(p.n_groups)]
    assert links[0] == [1, 2, 3, 4] and links[9] == [5, 6, 7, 8]
    assert links[4] == [0, 1, 2, 3, 5] and links[5] == [4, 6, 7, 8, 9]
    assert all(x is y for x, y in zip(p.neighbours(), (nb_ptr, nb)))
    with pytest.raises(ValueError):
        nb[0] = 1


def test_sct_favourite_child_known_answers():
    # chain: every edge is co-located (x = 0); fork: the heavier edge is the favourite
    nodes = {"p": {"out_bytes": 0, "flops": 1e9}, "a": {"out_bytes": 0, "flops": 1e9},
             "b": {"out_bytes": 0, "flops": 1e9}, "c": {"out_bytes": 0, "flops": 1e9}}
    edges = [("p", "a", {"bytes": 4_000_000, "output": 0}), ("p", "b", {"bytes": 1_000_000, "output": 1}),
             ("a", "c", {"bytes": 100_000, "output": 0})]
    g = OpGraph.from_networkx(nxgraph(nodes, edges))
    p = Problem(CostModel(g, cluster(3, latency=5.0, bandwidth=1e4)))
    fav, status = sct_favourite_children(_Data(p))
    assert "Optimal" in status
    assert fav.tolist() == [-1, 0, -1, 1]  # a's favourite parent is p, c's is a; b has none


def expert_graph(meta, layers, kinds=None):
    g = nx.DiGraph(meta=meta)
    prev = None
    for i, L in enumerate(layers):
        attrs = {"op_type": "Op", "out_bytes": 1000, "flops": 1e6, "layer": L}
        if kinds and i in kinds:
            attrs["kinds"] = kinds[i]
        g.add_node(f"op{i}", **attrs)
        if prev is not None:
            g.add_edge(prev, f"op{i}")
        prev = f"op{i}"
    return OpGraph.from_networkx(g)


def test_expert_layers_put_layer_k_on_gpu_k():
    g = expert_graph({"expert": "layers"}, [0, 0, 1, 1, 2, 2, 3, 3, 3], kinds={0: ["cpu"]})
    r = run("expert", Problem(CostModel(g, cluster(5))), Budget(evals=1))
    # device 0 is the CPU; gpu k is device k + 1; op0 is pinned to the CPU
    assert r.placement.tolist() == [0, 1, 2, 2, 3, 3, 4, 4, 4]
    assert r.metadata["rule"] == "layers"
    r2 = run("expert", Problem(CostModel(g, cluster(3))), Budget(evals=1))  # layer k -> gpu k mod 2
    assert r2.placement.tolist() == [0, 1, 2, 2, 1, 1, 2, 2, 2]


def test_expert_single_gpu_and_group_majority():
    g = expert_graph({"expert": "single-gpu"}, [0, 1, 2, 3], kinds={3: ["cpu"]})
    r = run("expert", Problem(CostModel(g, cluster(4))), Budget(evals=1))
    assert r.placement.tolist() == [1, 1, 1, 0]
    # a group whose ops are tagged 1, 1, 0 goes where most of them point
    nx_g = nx.DiGraph(meta={"expert": "layers"})
    for i, (L, grp) in enumerate([(0, "x"), (1, "v"), (1, "v"), (0, "v")]):
        nx_g.add_node(f"o{i}", op_type="Op", out_bytes=10, layer=L, group=grp)
    nx_g.add_edges_from([("o0", "o1"), ("o1", "o2"), ("o2", "o3")])
    r = run("expert", Problem(CostModel(OpGraph.from_networkx(nx_g), cluster(3))), Budget(evals=1))
    assert r.placement.tolist() == [1, 2, 2, 2]


def test_expert_depth_split_without_tags():
    g = expert_graph({}, [-1] * 8)
    r = run("expert", Problem(CostModel(g, cluster(3))), Budget(evals=1))
    assert r.metadata["rule"] == "depth"
    assert r.placement.tolist() == [1, 1, 1, 1, 2, 2, 2, 2]


def test_tracker_keeps_top_distinct_placements():
    p = small_problem(n=60)
    r = run("random", p, Budget(evals=40), seed=0, keep_top=3)
    assert len(r.top) == 3
    steps = [s for s, _, _ in r.top]
    assert steps == sorted(steps) and steps[0] == r.step_time_us
    assert len({a.tobytes() for _, _, a in r.top}) == 3


@pytest.mark.timeout(300)  # a guard against a blow-up, not a speed claim: the machine is shared
def test_list_schedulers_place_10k_ops():
    g = synthetic.layered(10_000, seed=1)
    p = Problem(CostModel(g, cluster(5)))
    for m in ("heft", "critical-path", "m-topo", "m-etf"):
        r = run(m, p, Budget(evals=1))
        assert r.feasible and r.evaluations == 1, m
        # the plan is a schedule of every op on the simulator's timeline: never shorter
        # than the lower bound, and close to what the simulator makes of it
        assert r.metadata["planned_us"] >= r.lower_bound_us - 1e-6, m
        assert r.metadata["simulated_us"] == r.step_time_us


@pytest.mark.parametrize("method", ["expert", "metis", "heft", "m-sct"])
def test_one_shot_methods_answer_even_past_a_tiny_seconds_budget(method):
    p = small_problem(n=80)
    r = run(method, p, Budget(seconds=1e-9))
    assert r.evaluations >= 1 and r.feasible
    r1 = run(method, p, Budget(evals=1))  # an evaluation budget is never exceeded
    assert r1.evaluations == 1


def test_etf_places_every_op_when_memory_forces_fallbacks():
    # GPUs too small for the estimate: the GPU-only variant must overflow, yet place all
    g = synthetic.layered(400, seed=2)
    probe = Problem(CostModel(g, cluster(3)))
    mem = group_memory_bytes(probe)
    p = Problem(CostModel(g, cluster(3, memory=[1 << 40, int(0.3 * mem.sum()), int(0.3 * mem.sum())])))
    data = _Data(p, gpu_only=True)
    for gdev, out in (data.etf(data.rank_u()), data.eft(data.rank_u())):
        place, start, finish, fallbacks = out
        assert fallbacks > 0 and np.all(place >= 0) and np.all(gdev >= 0)
        assert np.all(place[g.allowed == 1] == 0)
        # every op starts after its inputs finish
        assert np.all(start[data.dst] >= finish[data.src] - 1e-9)


def test_queued_timeline_sees_the_link_queue_the_simulator_has():
    # a1, a2 (1 µs each) on d0, b1, b2 on d1; a_i's 100-byte tensor feeds b_i over a
    # 10 B/µs link: the second transfer waits for the first (1..11, then 11..21), so b2
    # runs 21..22. The papers' model sends both at once: b2 ends at 13.
    g = nx.DiGraph()
    for v in ("a1", "a2", "b1", "b2"):
        g.add_node(v, op_type="Op", out_bytes=100 if v[0] == "a" else 0)
    g.add_edge("a1", "b1", bytes=100)
    g.add_edge("a2", "b2", bytes=100)
    p = Problem(CostModel(OpGraph.from_networkx(g, "queue"), cluster(2, latency=0.0, bandwidth=10.0,
                                                                     kinds=["gpu"] * 2), op_times=np.ones((4, 2))))
    fixed = np.array([0, 0, 1, 1])  # groups in op order
    assert p.cost_model.simulate(fixed.astype(np.int32)).step_time_us == 22.0
    for links, makespan in (("queued", 22.0), ("ideal", 13.0)):
        data = _Data(p, links=links)
        _, (place, start, finish, _) = data.etf(data.rank_u(), gdev=fixed)
        assert place.tolist() == [0, 0, 1, 1] and finish.max() == makespan, links
    # m-TOPO plans its placement on the same timeline
    r = run("m-topo", p, Budget(evals=5))
    assert r.metadata["planned_us"] == r.metadata["simulated_us"] == r.step_time_us


@pytest.mark.parametrize("method", ["heft", "critical-path", "m-etf", "m-sct", "m-topo"])
def test_queued_plans_are_never_shorter_than_the_bound_and_report_the_simulation(method):
    p = small_problem(n=150, latency=5.0, bandwidth=50.0)
    r = run(method, p, Budget(evals=5))
    assert r.metadata["links"] == "queued" and r.metadata["simulated_us"] == r.step_time_us
    assert r.metadata["planned_us"] >= r.lower_bound_us * (1 - 1e-9)


def test_unknown_links_model_is_a_user_error():
    from placetool.search import SearchError

    with pytest.raises(SearchError, match="links must be one of queued, ideal"):
        run("m-etf", topcuoglu_problem(), Budget(evals=5), links="fast")


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_etf_timeline_of_a_fixed_placement_is_the_simulation(data):
    # every group fixed beforehand, devices paying nothing for transfers: m-ETF's
    # timeline (ready ops in the simulator's order, tensors sent when produced, links
    # first come first served) must be the simulator's schedule, op by op. Ops and
    # transfers take time (a zero-length one ends within the instant the simulator has
    # already dispatched, an order the scheduler does not model).
    drawn = data.draw(cost_models(max_ops=30))
    assume(not drawn.cluster.transfer_costs().any())
    from dataclasses import replace

    c = replace(drawn.cluster, link_send="eager")  # the plan sends a tensor when produced
    c.latency_us[:] += 1.0 - np.eye(c.n_devices)
    cm = CostModel(drawn.graph, c, op_times=drawn.T + 1.0)
    gdev = np.array(data.draw(assignments(cm)), np.int64)
    d = _Data(Problem(cm))
    _, (place, start, finish, _) = d.etf(d.rank_u(), gdev=gdev)
    r = cm.simulate(cm.graph.to_placement(gdev), trace=True)
    assert np.array_equal(place, cm.graph.to_placement(gdev))
    assert np.allclose(start, r.trace.op_start, rtol=0, atol=1e-9)
    assert np.allclose(finish, r.trace.op_end, rtol=0, atol=1e-9)
