"""The communication-charging bound: known answers by hand, and never above a simulated
placement, brute force's best or ``exact``'s proven optimum."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from placetool.costmodel import CostModel, OpGraph
from placetool.costmodel.reference import simulate as reference_simulate
from placetool.search import Budget, Problem
from placetool.search.bounds import lower_bound
from placetool.search.comm_bound import communication_bound, heads, make_net, tails
from placetool.search.registry import run
from tests.helpers import brute_force, cluster, cost_models, nxgraph, random_problem


def problem(nodes, edges, times, **cluster_args):
    g = OpGraph.from_networkx(nxgraph(nodes, edges))
    cl = cluster(len(times[0]), kinds=["gpu"] * len(times[0]), **cluster_args)
    return Problem(CostModel(g, cl, op_times=np.asarray(times, float)))


def test_a_chain_that_pays_for_leaving_the_slow_device_by_hand():
    # a -> b -> c, 100-byte tensors; a and c take 1 µs on d0 and 20 on d1, b 40 on d0
    # and 1 on d1. A switch costs send 1 + (latency 2 + 100 / 10) + receive 2 = 15 µs.
    #   all on d0: 1 + 40 + 1 = 42        all on d1: 20 + 1 + 20 = 41
    #   d0, d1, d0: 1 + 15 + 1 + 15 + 1 = 33 (the optimum)
    #   d0, d1, d1: 1 + 15 + 1 + 20 = 37  d1, d1, d0: 20 + 1 + 15 + 1 = 37
    # (the others are slower still). With free communication the path is 1 + 1 + 1 = 3.
    p = problem({"a": 100, "b": 100, "c": 100}, [("a", "b"), ("b", "c")],
                [[1, 20], [40, 1], [1, 20]], latency=2.0, bandwidth=10.0, send_us=1.0, recv_us=2.0)
    assert communication_bound(p) == pytest.approx(33.0, rel=1e-8)
    assert communication_bound(p) <= 33.0
    assert brute_force(p) == 33.0
    lb = lower_bound(p)
    assert lb["critical_path"] == 3.0 and lb["best"] == lb["communication"]


def test_a_join_whose_branches_queue_or_pay_by_hand():
    # s -> b1, s -> b2, b1 -> j, b2 -> j on two devices; b1, b2 take 10 µs, s and j 0;
    # a transfer costs 2 + 100 / 10 = 12. Taking each input of j at its cheapest gives 10
    # (both branches on j's device, as if they ran side by side). But on j's device the
    # branches run one after the other (10 + 10 = 20), and a branch elsewhere arrives at
    # 0 + 10 + 12 = 22 at the earliest: 20, which all on one device reaches.
    p = problem({"s": 100, "b1": 100, "b2": 100, "j": 0},
                [("s", "b1"), ("s", "b2"), ("b1", "j"), ("b2", "j")],
                [[0, 0], [10, 10], [10, 10], [0, 0]], latency=2.0, bandwidth=10.0)
    assert communication_bound(p) == pytest.approx(20.0, rel=1e-8)
    assert brute_force(p) == 20.0
    assert lower_bound(p)["critical_path"] == 10.0


def test_a_group_split_by_a_chain_pays_both_ways():
    # x -> y -> z with x and z in one group: y (1 µs on d1, 30 on d0) off the group's
    # device costs a round trip of 2 x 12; x, z take 5 µs anywhere. All on one device:
    # 5 + 30 + 5 = 40 on d0, 5 + 1 + 5 = 11 on d1; the bound finds 11 and the optimum is 11.
    nodes = {"x": {"out_bytes": 100, "group": "g"}, "y": 100, "z": {"out_bytes": 100, "group": "g"}}
    p = problem(nodes, [("x", "y"), ("y", "z")], [[5, 5], [30, 1], [5, 5]], latency=2.0, bandwidth=10.0)
    assert communication_bound(p) == pytest.approx(11.0, rel=1e-8)
    assert brute_force(p) == 11.0


@st.composite
def pinned_models(draw):
    """A random cost model in which some ops have no kernel on some devices."""
    cm = draw(cost_models(min_ops=1, max_ops=10, max_devices=3, memories=(1 << 40,)))
    T = cm.T.copy()
    n, D = T.shape
    if D > 1:
        for v in range(n):
            if draw(st.integers(0, 3)) == 0:
                T[v, draw(st.integers(0, D - 1))] = np.inf
    return CostModel(cm.graph, cm.cluster, op_times=T)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pinned_models(), st.data())
def test_heads_and_tails_hold_in_every_simulated_placement(cm, data):
    # sharper than the bound alone: every op starts no earlier than its head on the
    # device it was given, and the step lasts at least its end plus its tail there
    p = Problem(cm)
    D = cm.n_devices
    a = np.array(data.draw(st.lists(st.integers(0, D - 1), min_size=p.n_groups, max_size=p.n_groups)))
    place = cm.graph.to_placement(a)
    assume(np.isfinite(cm.T[np.arange(cm.graph.n_ops), place]).all())
    ref = reference_simulate(cm.graph, cm.T, place, cm.cluster)
    net = make_net(p)
    S = heads(net)
    Q = tails(net, S)
    v = np.arange(cm.graph.n_ops)
    eps = 1e-9 * max(1.0, ref.step_time_us)
    assert (S[v, place] <= ref.op_start + eps).all()
    assert (ref.op_end + Q[v, place] <= ref.step_time_us + eps).all()
    assert communication_bound(p) <= ref.step_time_us + eps
    assert float(cm.simulate(place).step_time_us) == ref.step_time_us


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cost_models(min_ops=1, max_ops=7, max_devices=3, memories=(1 << 40,)))
def test_never_above_the_best_placement(cm):
    p = Problem(cm)
    assert communication_bound(p) <= brute_force(p) * (1 + 1e-9) + 1e-9


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("queue,costs", [("fifo", {}), ("none", {"send_us": 3.0, "recv_us_per_byte": 0.01})])
def test_never_above_the_proven_optimum(seed, queue, costs):
    base = random_problem(8, 3, seed, latency=5.0, bandwidth=20.0, hetero=True)
    cl = cluster(3, latency=5.0, bandwidth=20.0, kinds=["gpu"] * 3, link_queue=queue, **costs)
    p = Problem(CostModel(base.graph, cl, op_times=base.cost_model.T))
    r = run("exact", p, Budget(seconds=60), seed=0, incumbent_share=0.02)
    assert r.metadata["status"] == "optimal"
    assert communication_bound(p) <= r.step_time_us * (1 + 1e-9)
