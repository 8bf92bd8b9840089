"""The incremental simulator equals the full one, move for move."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from placetool.costmodel import Cluster, CostModel, OpGraph, UserError, presets
from placetool.costmodel.incremental import IncrementalSimulator
from placetool.search import Problem

from .helpers import assignments, cost_models
from .helpers import cluster as make_cluster


def _same(r, full):
    assert r.step_time_us == full.step_time_us
    assert np.array_equal(r.peak_memory_bytes, full.peak_memory_bytes)
    assert r.feasible == full.feasible


# ------------------------------------------------------------------ by hand
def test_hand_checked_move_of_the_middle_op_of_a_chain():
    # a(2) -> b(3) -> c(1), 10-byte tensors, links 1 us + 10 B / 10 B/us = 2 us
    g = nx.DiGraph()
    for v in "abc":
        g.add_node(v, op_type="Op", out_bytes=10)
    g.add_edges_from([("a", "b"), ("b", "c")])
    graph = OpGraph.from_networkx(g)
    cm = CostModel(graph, make_cluster(2, latency=1.0, bandwidth=10.0, kinds=["gpu", "gpu"]),
                   op_times=np.array([[2.0, 2.0], [3.0, 3.0], [1.0, 1.0]]))
    inc = IncrementalSimulator(cm, np.zeros(3, np.int32))
    assert inc.base.step_time_us == 6.0
    assert list(inc.base.peak_memory_bytes) == [20, 0]
    r = inc.evaluate_move(1, 1)
    # a 0..2 on d0; a -> d1 2..4; b 4..7 on d1; b -> d0 7..9; c 9..10 on d0
    assert r.step_time_us == 10.0
    assert list(r.peak_memory_bytes) == [20, 20]
    assert r.restored_at_us <= 2.0  # nothing before a's end can change
    _same(r, cm.simulate(np.array([0, 1, 0])))
    # the base is untouched by an evaluation; a commit moves it
    assert inc.evaluate_move(1, 0).step_time_us == 6.0
    inc.commit(np.array([0, 1, 0], np.int32))
    assert inc.base.step_time_us == 10.0
    assert inc.evaluate_move(1, 0).step_time_us == 6.0


def test_hand_checked_move_with_send_and_receive_costs():
    # as above, with send_us = 1 and recv_us = 2 on both devices:
    # a 0..2 | send 2..3 | link 3..5 | recv on d1 5..7 | b 7..10 | send 10..11 | link 11..13
    # | recv on d0 13..15 | c 15..16
    g = nx.DiGraph()
    for v in "abc":
        g.add_node(v, op_type="Op", out_bytes=10)
    g.add_edges_from([("a", "b"), ("b", "c")])
    cm = CostModel(OpGraph.from_networkx(g),
                   make_cluster(2, latency=1.0, bandwidth=10.0, kinds=["gpu", "gpu"], send_us=1.0, recv_us=2.0),
                   op_times=np.array([[2.0, 2.0], [3.0, 3.0], [1.0, 1.0]]))
    inc = IncrementalSimulator(cm, np.zeros(3, np.int32))
    assert inc.base.step_time_us == 6.0  # no transfer, no task
    r = inc.evaluate_move(1, 1)
    assert r.step_time_us == 16.0
    # d0: a's output until its link ends (5), then the copy of b's (11..16) with c's (15..)
    # d1: the copy of a's (3..10) with b's own (7..13)
    assert list(r.peak_memory_bytes) == [20, 20]
    _same(r, cm.simulate(np.array([0, 1, 0])))
    inc.commit(np.array([0, 1, 0], np.int32))
    assert inc.base.step_time_us == 16.0
    assert inc.evaluate_move(1, 0).step_time_us == 6.0


@pytest.mark.parametrize("group,device,match", [
    (-1, 0, r"group index -1 out of range: valid groups are 0\.\.2"),
    (3, 0, r"group index 3 out of range: valid groups are 0\.\.2"),
    (0, 2, r"device index 2 out of range: valid devices are 0\.\.1"),
    (0, -1, r"device index -1 out of range"),
])
def test_moves_out_of_range_are_value_errors(group, device, match):
    g = nx.DiGraph()
    for v in "abc":
        g.add_node(v, op_type="Op", out_bytes=10)
    g.add_edges_from([("a", "b"), ("b", "c")])
    cm = CostModel(OpGraph.from_networkx(g), make_cluster(2, kinds=["gpu", "gpu"]), op_times=np.ones((3, 2)))
    inc = IncrementalSimulator(cm, np.zeros(3, np.int32))
    with pytest.raises(ValueError, match=match):
        inc.evaluate_move(group, device)


def test_moving_a_group_where_it_cannot_run_is_a_user_error():
    cm = CostModel(presets.load_graph("synthetic-1k"), presets.load_cluster("k80x2"))
    pinned = int(np.flatnonzero(~cm.group_device_ok[:, 1])[0])
    a = np.where(cm.group_device_ok[:, 1], 1, 0).astype(np.int32)
    inc = IncrementalSimulator(cm, a)
    with pytest.raises(UserError, match="cannot run on device index 1"):
        inc.evaluate_move(pinned, 1)


# ---------------------------------------------------------- property (hypothesis)
@st.composite
def problems(draw):
    # some placements run out of memory
    cm = draw(cost_models(min_ops=2, max_ops=22, min_devices=2, max_param=300, memories=(1500, 3000, 1 << 30)))
    n = cm.graph.n_ops
    moves = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, cm.n_devices - 1), st.booleans()),
                          min_size=1, max_size=8))
    return cm, draw(assignments(cm)), moves, draw(st.sampled_from([1, 3, 64]))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_incremental_equals_full_simulation(args):
    cm, assign, moves, checkpoints = args
    G, D = cm.graph.n_groups, cm.n_devices
    a = np.array(assign[:G], np.int32) % D
    inc = IncrementalSimulator(cm, a, checkpoints=checkpoints)
    _same(inc.base, cm.simulate(a))
    for k, (grp, dev, commit) in enumerate(moves):
        grp %= G
        b = a.copy()
        b[grp] = dev
        if k % 3 == 2 and G > 1:  # now and then two groups at once (a swap-like move)
            b[(grp + 1) % G] = (b[(grp + 1) % G] + 1) % D
            r = inc.evaluate(b)
        else:
            r = inc.evaluate_move(grp, dev)
        _same(r, cm.simulate(b))
        if commit:
            inc.commit(b)
            a = b
            _same(inc.base, cm.simulate(a))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(), st.integers(1, 4))
def test_moves_scored_together_equal_full_simulations(args, threads):
    cm, assign, moves, checkpoints = args
    G, D = cm.graph.n_groups, cm.n_devices
    a = np.array(assign[:G], np.int32) % D
    inc = IncrementalSimulator(cm, a, checkpoints=checkpoints, threads=threads)
    batch, moved = [], []
    for k, (grp, dev, whole) in enumerate(moves):
        b = a.copy()
        b[grp % G] = dev
        if whole and G > 1:  # a whole assignment, two groups changed
            b[(grp + 1) % G] = (b[(grp + 1) % G] + 1) % D
            batch.append(b)
        else:
            batch.append((grp % G, dev))
        moved.append(b)
    rs = inc.evaluate_many(batch)
    assert len(rs) == len(batch)
    for r, b in zip(rs, moved):
        _same(r, cm.simulate(b))
    _same(inc.base, cm.simulate(a))  # scoring leaves the base alone


@pytest.mark.parametrize("transfer_costs", [False, True])
def test_incremental_equals_full_on_a_synthetic_graph_with_commits(transfer_costs):
    cl = presets.load_cluster("k80x4")
    if transfer_costs:  # CPU-worker-like send/receive costs on every device
        d = cl.to_dict()
        for dev in d["devices"]:
            dev.update(send_us=20.0, send_us_per_byte=1e-5, recv_us=15.0, recv_us_per_byte=2e-5)
        cl = Cluster.from_dict(d)
    cm = CostModel(presets.load_graph("synthetic-1k"), cl)
    pr = Problem(cm)
    rng = np.random.default_rng(3)
    a = pr.random_assignment(rng)
    inc = IncrementalSimulator(cm, a, checkpoints=16)
    restarted = converged = 0
    for k in range(60):
        g = int(rng.integers(pr.n_groups))
        others = np.flatnonzero(pr.allowed[g] & (np.arange(pr.n_devices) != a[g]))
        if others.size == 0:
            continue
        b = a.copy()
        b[g] = rng.choice(others)
        r = inc.evaluate(b)
        _same(r, cm.simulate(b))
        restarted += r.restored_at_us > 0
        converged += r.converged
        if k % 7 == 0:
            inc.commit(b)
            a = b
    # the point of it: most moves restart part-way, some stop early
    assert restarted > 30 and converged > 0
    # a batch of moves of the last base, scored on two threads
    inc2 = IncrementalSimulator(cm, a, checkpoints=16, threads=2)
    batch = [(int(g), int(rng.choice(np.flatnonzero(pr.allowed[g])))) for g in rng.integers(pr.n_groups, size=16)]
    for (g, d), r in zip(batch, inc2.evaluate_many(batch)):
        b = a.copy()
        b[g] = d
        _same(r, cm.simulate(b))
