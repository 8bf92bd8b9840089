"""The workers' replay model (``costmodel/workers.py``): hand-computed schedules, invariants
on random graphs, and a recorded step of the search's pick replayed.

``tests/data/towers_sa.timeline.json`` (graph: ``towers_sa.timeline.npz``) is a real
recording: ``sa``'s placement of the 4-tower model (batch 256, 286 ops) on the 2-worker
testbed, 3 traced steps (``benchmarks/timeline_fit.py record``, quiet dev VM).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placetool.costmodel import OpGraph
from placetool.costmodel import graph as graphs
from placetool.costmodel import timeline as TL
from placetool.costmodel.workers import TESTBED_COSTS, WorkerCosts, simulate_workers

from .helpers import cluster

DATA = os.path.join(os.path.dirname(__file__), "data")
LAT = np.full((2, 2), 30.0)
INF = np.full((2, 2), np.inf)


def _graph(n, edges, out_bytes=None):
    src, dst = zip(*edges) if edges else ((), ())
    return OpGraph.from_arrays("w", [f"o{i}" for i in range(n)], ["X"] * n, out_bytes or [0] * n,
                               list(src), list(dst))


def test_the_thread_runs_what_an_op_readied_last_first():
    g = _graph(3, [(0, 1), (0, 2)])
    t = simulate_workers(g, np.array([10.0, 5.0, 7.0]), np.zeros(3, int), LAT, INF)
    assert t.op_start.tolist() == [0.0, 17.0, 10.0]


def test_an_op_readied_by_an_arrival_waits_behind_the_threads_own_work():
    """o0 (device 0) feeds o3 (device 1); device 1 runs o1 -> o2. The request goes out at
    0 (the later root first), the handler answers at 30, the tensor lands at 60; o3 waits
    until o2, readied at 100, has run, though it was ready first."""
    g = _graph(4, [(0, 3), (1, 2)])
    t = simulate_workers(g, np.array([10.0, 100.0, 20.0, 5.0]), np.array([0, 1, 1, 1]), LAT, INF)
    assert t.x_issue.tolist() == [0.0] and t.x_response.tolist() == [30.0]
    assert t.op_start.tolist() == [0.0, 0.0, 100.0, 120.0]
    assert t.span_us() == 125.0


def test_a_handler_waits_for_the_senders_queue_to_empty():
    """The request for o0's tensor reaches device 0 at 30, while o1 (readied by o0) runs
    until 110: the handler runs then."""
    g = _graph(3, [(0, 1), (0, 2)])
    t = simulate_workers(g, np.array([10.0, 100.0, 5.0]), np.array([0, 0, 1]), LAT, INF,
                         WorkerCosts(handler_us=4.0))
    assert t.x_response.tolist() == [114.0]
    assert t.op_start[2] == 144.0 and t.busy_us.tolist() == [114.0, 5.0]


def test_a_handler_that_came_first_has_the_producer_answer_at_once():
    """z (0) and a (2) on device 0, m (1) and c (3) on device 1; m -> a -> c across. Device
    1's handler for m waits until m ends at 200 (5 µs), a runs from 235 to 265 and encodes
    its 1000 bytes (10 µs) before anything else: c starts at 275 + 30."""
    g = _graph(4, [(1, 2), (2, 3)], out_bytes=[0, 0, 1000, 0])
    costs = WorkerCosts(handler_us=5.0, send_us_per_byte=0.01)
    t = simulate_workers(g, np.array([20.0, 200.0, 30.0, 10.0]), np.array([0, 1, 0, 1]), LAT, INF, costs)
    order = np.argsort(t.x_producer)  # transfers of m, then of a
    assert t.x_response[order].tolist() == [205.0, 275.0]
    assert t.op_start.tolist() == [0.0, 0.0, 235.0, 305.0]
    assert t.busy_us.tolist() == [20.0 + 5.0 + 30.0 + 10.0, 200.0 + 5.0 + 10.0]


def test_a_response_costs_the_receiver_before_its_queued_work():
    """As the hand-computed case above with 7 µs per arrival on device 1: the tensor lands
    at 60 while o1 runs; device 1 takes it in at 100 (107), then runs o2, then o3."""
    g = _graph(4, [(0, 3), (1, 2)])
    t = simulate_workers(g, np.array([10.0, 100.0, 20.0, 5.0]), np.array([0, 1, 1, 1]), LAT, INF,
                         WorkerCosts(arrive_us=7.0))
    assert t.op_start.tolist() == [0.0, 0.0, 107.0, 127.0]


@st.composite
def placed_dags(draw):
    n = draw(st.integers(1, 14))
    edges = sorted({(a, b) for a in range(n) for b in range(a + 1, n) if draw(st.booleans()) and b - a < 4})
    g = _graph(n, edges, out_bytes=draw(st.lists(st.integers(0, 5000), min_size=n, max_size=n)))
    times = np.array(draw(st.lists(st.floats(0, 100), min_size=n, max_size=n)))
    p = np.array(draw(st.lists(st.integers(0, 2), min_size=n, max_size=n)))
    return g, times, p


@settings(max_examples=60, deadline=None)
@given(placed_dags(), st.sampled_from([WorkerCosts(), TESTBED_COSTS, WorkerCosts(10, 20, 0.01, 5, 0.02)]))
def test_every_schedule_is_feasible(case, costs):
    """Each op starts after its local inputs end and its remote ones arrive; a device runs
    one thing at a time; its busy time is its ops plus its message work."""
    g, times, p = case
    D = 3
    t = simulate_workers(g, times, p, np.full((D, D), 30.0), np.full((D, D), 100.0), costs)
    assert np.allclose(t.op_end - t.op_start, times)
    arrival = {(int(s), int(d)): a for s, d, a in zip(t.x_producer, t.x_dst, t.x_arrival)}
    for s, d in zip(g.edge_src, g.edge_dst):
        ready = t.op_end[s] if p[s] == p[d] else arrival[(int(s), int(p[d]))]
        assert t.op_start[d] >= ready - 1e-9
    for d in range(D):
        on = np.flatnonzero(p == d)
        order = on[np.lexsort((t.op_end[on], t.op_start[on]))]
        assert (t.op_start[order][1:] >= t.op_end[order][:-1] - 1e-9).all()
        assert t.busy_us[d] >= times[on].sum() - 1e-9
    assert np.isfinite(t.x_arrival).all()
    if len(set(p.tolist())) == 1:  # one device: one thread runs everything back to back
        assert t.span_us() == pytest.approx(times.sum())


def test_the_search_pick_replayed_on_workers():
    """sa's towers split, as recorded: the simulator's rules with a per-message cost on both
    ends (50 µs + 250 µs/MB, the best of its grid on these recordings) replay it 25-26% too
    fast; TensorFlow's run queue with the testbed's costs within 8% on each traced step."""
    g = graphs.load(os.path.join(DATA, "towers_sa.timeline.npz"))
    rec = TL.load(os.path.join(DATA, "towers_sa.timeline.json"), g)
    links = cluster(2, latency=120.0, bandwidth=2000.0, link_queue="none")
    workers = [TL.replay(rec, k, cluster=links, links=TL.WORKERS)["error_pct"] for k in range(3)]
    assert all(abs(e) < 8.0 for e in workers), workers
    from dataclasses import replace
    devs = [replace(d, send_us=50.0, send_us_per_byte=250e-6, recv_us=50.0, recv_us_per_byte=250e-6)
            for d in links.devices]
    sim = [TL.replay(rec, k, cluster=replace(links, devices=devs), links=None)["error_pct"] for k in range(3)]
    assert all(-30.0 < e < -20.0 for e in sim), sim


def test_the_workers_replay_needs_links():
    g = graphs.load(os.path.join(DATA, "towers_sa.timeline.npz"))
    rec = TL.load(os.path.join(DATA, "towers_sa.timeline.json"), g)
    with pytest.raises(TL.TimelineError, match="give the cluster"):
        TL.replay(rec, 0, links=TL.WORKERS)
