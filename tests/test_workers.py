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

from placetool.costmodel import CostModel, OpGraph
from placetool.costmodel import graph as graphs
from placetool.costmodel import timeline as TL
from placetool.costmodel.engine import workers_kernel
from placetool.costmodel.workers import TESTBED_COSTS, WorkerCosts, device_costs, simulate_workers

from .helpers import cluster

DATA = os.path.join(os.path.dirname(__file__), "data")
LAT = np.full((2, 2), 30.0)
INF = np.full((2, 2), np.inf)


def _graph(n, edges, out_bytes=None, control=()):
    src, dst = zip(*edges) if edges else ((), ())
    return OpGraph.from_arrays("w", [f"o{i}" for i in range(n)], ["X"] * n, out_bytes or [0] * n,
                               list(src), list(dst), edge_tensor=[-1 if e in control else 0 for e in edges])


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
    1's handler for m waits until m ends at 200 (5 µs), a runs from 235 to 265, and its
    _Send, all it made ready, encodes its 1000 bytes (10 µs): c starts at 275 + 30."""
    g = _graph(4, [(1, 2), (2, 3)], out_bytes=[0, 0, 1000, 0])
    costs = WorkerCosts(handler_us=5.0, send_us_per_byte=0.01)
    t = simulate_workers(g, np.array([20.0, 200.0, 30.0, 10.0]), np.array([0, 1, 0, 1]), LAT, INF, costs)
    order = np.argsort(t.x_producer)  # transfers of m, then of a
    assert t.x_response[order].tolist() == [205.0, 275.0]
    assert t.op_start.tolist() == [0.0, 0.0, 235.0, 305.0]
    assert t.busy_us.tolist() == [20.0 + 5.0 + 30.0 + 10.0, 200.0 + 5.0 + 10.0]


@pytest.mark.parametrize("send_first", [True, False])
def test_a_send_waits_beneath_what_its_producer_readied_after_it(send_first):
    """As above, with f (4, 100 µs) on device 0 reading a too. The _Send of a's tensor is
    made ready at the place of its edge: before f's edge, it sits beneath f on the stack
    and encodes when f has run (365 to 375), so c starts at 375 + 30; after it, it goes
    first (265 to 275) and f runs after."""
    edges = [(1, 2), (2, 3), (2, 4)] if send_first else [(1, 2), (2, 4), (2, 3)]
    g = _graph(5, edges, out_bytes=[0, 0, 1000, 0, 0])
    costs = WorkerCosts(handler_us=5.0, send_us_per_byte=0.01)
    t = simulate_workers(g, np.array([20.0, 200.0, 30.0, 10.0, 100.0]), np.array([0, 1, 0, 1, 0]), LAT, INF, costs)
    sent = 375.0 if send_first else 275.0
    assert t.x_response[np.argsort(t.x_producer)].tolist() == [205.0, sent]
    assert t.op_start.tolist() == [0.0, 0.0, 235.0, sent + 30.0, 265.0 if send_first else 275.0]
    assert t.busy_us.tolist() == [20.0 + 5.0 + 30.0 + 10.0 + 100.0, 200.0 + 5.0 + 10.0]


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
    edges = [(a, b) for a in range(n) for b in range(a + 1, n) if b - a < 4 and draw(st.booleans())]
    edges = draw(st.permutations(edges))  # the edge order decides ties: not sorted by source
    control = {e for e in edges if draw(st.integers(0, 4)) == 0}
    g = _graph(n, edges, out_bytes=draw(st.lists(st.integers(0, 5000), min_size=n, max_size=n)), control=control)
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
    arrival = {(int(s), int(d), k >= 0): a for s, d, k, a in zip(t.x_producer, t.x_dst, t.x_tensor, t.x_arrival)}
    for s, d, e in zip(g.edge_src, g.edge_dst, g.edge_tensor):
        ready = t.op_end[s] if p[s] == p[d] else arrival[(int(s), int(p[d]), e >= 0)]
        assert t.op_start[d] >= ready - 1e-9
    for d in range(D):
        on = np.flatnonzero(p == d)
        order = on[np.lexsort((t.op_end[on], t.op_start[on]))]
        assert (t.op_start[order][1:] >= t.op_end[order][:-1] - 1e-9).all()
        assert t.busy_us[d] >= times[on].sum() - 1e-9
    assert np.isfinite(t.x_arrival).all()
    if len(set(p.tolist())) == 1:  # one device: one thread runs everything back to back
        assert t.span_us() == pytest.approx(times.sum())


COSTS = [WorkerCosts(), TESTBED_COSTS, WorkerCosts(10, 20, 0.01, 5, 0.02), WorkerCosts(0, 7, 0.0, 3, 0.0)]


@settings(max_examples=150, deadline=None)
@given(placed_dags(), st.sampled_from(COSTS), st.sampled_from([0.0, 30.0]))
def test_the_compiled_kernel_is_the_reference_bit_for_bit(case, costs, latency):
    """engine/workers_kernel.py against workers.simulate_workers: every time, busy time,
    peak and transfer, exactly (times on a grid make ties, which the order must break alike)."""
    g, times, p = case
    times = np.round(times / 10.0) * 10.0
    D = 3
    lat, bw = np.full((D, D), latency), np.full((D, D), 100.0)
    ref = simulate_workers(g, times, p, lat, bw, costs)
    got = workers_kernel.run(g, times, p, lat, bw, device_costs(costs, D))
    want = (ref.op_start, ref.op_end, ref.busy_us, ref.peak_bytes, ref.x_producer, ref.x_tensor, ref.x_dst,
            ref.x_issue, ref.x_response, ref.x_arrival)
    for a, b in zip(got, want):
        assert np.array_equal(a, b, equal_nan=True), (a, b)


def test_the_cost_model_runs_the_workers_rule():
    """A cluster with links.send "workers" scores with the kernel: the hand-computed case
    above, through CostModel (devices' send_us is the handler, recv_us the arrival), with
    memory: o0's 100 bytes live on device 0 until its tensor lands, the copy on device 1
    until o3 ends, beside o3's own 10."""
    from dataclasses import replace

    g = _graph(4, [(0, 3), (1, 2)], out_bytes=[100, 0, 0, 10])
    cl = cluster(2, latency=30.0, bandwidth=1e9, link_queue="none")
    cl = replace(cl, link_send="workers", devices=[replace(d, recv_us=7.0) for d in cl.devices])
    T = np.array([[10.0, 10.0], [100.0, 100.0], [20.0, 20.0], [5.0, 5.0]])
    cm = CostModel(g, cl, op_times=T)
    r = cm.simulate(np.array([0, 1, 1, 1], np.int32), trace=True)
    assert r.step_time_us == 132.0 and r.trace.op_start.tolist() == [0.0, 0.0, 107.0, 127.0]
    assert r.peak_memory_bytes.tolist() == [100, 110] and r.busy_us.tolist() == [10.0, 132.0]
    assert r.trace.n_transfers == 1 and r.trace.x_end.tolist() == pytest.approx([60.0])
    b = cm.simulate_batch(np.array([[0, 1, 1, 1], [0, 0, 0, 0]], np.int32))
    assert b.step_time_us.tolist() == [132.0, 135.0] and b.peak_memory_bytes[0].tolist() == [100, 110]
    with pytest.raises(ValueError, match="workers"):
        from placetool.costmodel.incremental import IncrementalSimulator
        IncrementalSimulator(cm, np.zeros(g.n_groups, np.int32))


def test_a_workers_cluster_reads_back():
    """links.send "workers" and a device's request_us survive a round trip; the links'
    queue does not apply to it."""
    from placetool.costmodel import Cluster

    d = cluster(2, link_queue="fifo").to_dict()
    d["links"]["send"] = "workers"
    d["devices"][1]["request_us"] = 25.0
    cl = Cluster.from_dict(d)
    assert cl.link_send == "workers" and cl.devices[1].request_us == 25.0 and not cl.fifo_links
    back = Cluster.from_dict(cl.to_dict())
    assert back.devices[1].request_us == 25.0 and "request_us" not in cl.to_dict()["devices"][0]
    assert device_costs(cl, 2)[0].tolist() == [0.0, 25.0]


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
