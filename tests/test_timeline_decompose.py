"""benchmarks/timeline_decompose.py: the executor-order replay on a hand-computed step and
on the checked-in recording."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from placetool.costmodel import OpGraph
from placetool.costmodel import graph as graphs
from placetool.costmodel import timeline
from placetool.costmodel.timeline import Step
from tests.helpers import nxgraph

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("timeline_decompose", ROOT / "benchmarks" / "timeline_decompose.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def two_devices():
    """a (dev 0, 0-10 µs) sends 1 MB to b (dev 1, traced 50-60); c (dev 0, 10-30) is
    independent. Its RecvTensor record ran 12-40 (response start, arrival): a delivery of 30 µs."""
    g = OpGraph.from_networkx(nxgraph({"a": 1_000_000, "b": 1, "c": 1}, [("a", "b")]), "two")
    i = {n: g.names.index(n) for n in "abc"}
    dev, start, end = np.zeros(3, np.int64), np.zeros(3), np.zeros(3)
    for n, d, s, e in (("a", 0, 0, 10), ("b", 1, 50, 60), ("c", 0, 10, 30)):
        dev[i[n]], start[i[n]], end[i[n]] = d, s, e
    st = Step(op_dev=dev, op_start=start, op_end=end, x_edge=["a:0"], x_producer=np.array([i["a"]]),
              x_src=np.array([0]), x_dst=np.array([1]), x_bytes=np.array([1_000_000], np.int64),
              x_start=np.array([12.0]), x_end=np.array([40.0]), x_control=np.array([False]),
              x_producer_end=np.array([10.0]), x_consumer_start=np.array([50.0]))
    return g, st, dev


def test_the_executor_order_replay_by_hand(bench):
    g, st, placement = two_devices()
    # no cost: a 0-10, c 10-30, b at a's end + 30 µs of delivery: 40-50
    assert bench.traced_order_span(g, st, placement) == pytest.approx(50.0)
    # 5 µs + 10 µs/MB per message: a's device busy sending until 25 (c 25-45); b receives
    # for 15 after the arrival at 40: 55-65
    assert bench.traced_order_span(g, st, placement, 5.0, 10e-6) == pytest.approx(65.0)
    d = bench.deliveries(st, (np.full((2, 2), 2.0), np.full((2, 2), 1e5)))
    assert d["delivery"].tolist() == [30.0] and d["wait"].tolist() == [2.0] and d["wire"].tolist() == [28.0]
    assert d["sender_busy"].tolist() == [pytest.approx(20 / 30)] and d["receiver_busy"].tolist() == [0.0]
    assert d["estimate"].tolist() == [pytest.approx(12.0)]
    assert d["quiet"].tolist() == [np.inf]  # no call had ended when a did
    # the first response starts at 12; a (0-10) and c (10-30) computed all the time before it
    assert bench.first_response(st) == (12.0, 0.0)
    late = Step(**{**st.__dict__, "x_start": np.array([35.0]), "x_end": np.array([40.0])})
    assert bench.first_response(late) == (35.0, 5.0)  # 30-35: no op ran


def test_quiet_counts_from_the_last_call_that_ended(bench):
    g, st, _ = two_devices()
    two = Step(**{**st.__dict__, "x_edge": ["a:0", "c:0"], "x_producer": np.array([0, 2]),
                  "x_src": np.array([0, 0]), "x_dst": np.array([1, 1]), "x_bytes": np.array([8, 8], np.int64),
                  "x_start": np.array([12.0, 31.0]), "x_end": np.array([14.0, 33.0]),
                  "x_control": np.array([False, False]), "x_producer_end": np.array([10.0, 30.0]),
                  "x_consumer_start": np.array([50.0, 50.0])})
    assert bench.deliveries(two)["quiet"].tolist() == [np.inf, 16.0]


def test_without_costs_the_replay_never_outlasts_the_recorded_step(bench):
    """The traced schedule is one that keeps every rule of the replay, so the replay's
    earliest starts can only come sooner; costs only add."""
    g = graphs.load(DATA / "mlp_split.timeline.npz")
    rec = timeline.load(DATA / "mlp_split.timeline.json", g)
    for st in rec.steps:
        free = bench.traced_order_span(g, st, rec.placement)
        assert 0 < free <= st.span_us + 1e-6
        assert bench.traced_order_span(g, st, rec.placement, 20.0, 150e-6) >= free


def test_lone_deliveries_in_the_traced_order(bench):
    g, st, placement = two_devices()
    # a 0-10 on dev 0; the 1 MB tensor takes 2 + 1e6 / 1e5 = 12 µs on the link: b 22-32
    lat, bw = np.full((2, 2), 2.0), np.full((2, 2), 1e5)
    assert bench.traced_order_span(g, st, placement, links=(lat, bw)) == pytest.approx(32.0)



def test_the_sender_at_each_response_by_hand(bench):
    g, st, placement = two_devices()
    c = bench.response_context(g, st, placement)
    # the response starts at 12 while c (dev 0, 10-30) computes; c's run overlaps the window after a's end
    assert c["sender"].tolist() == [0] and c["both_idle"].tolist() == [False]
    assert c["delivery"].tolist() == [30.0] and c["spacing"].size == 0
    # the response at 35: c has ended and nothing else is ready on dev 0
    late = Step(**{**st.__dict__, "x_start": np.array([35.0])})
    assert bench.response_context(g, late, placement)["sender"].tolist() == [2]
    # c moved to 45-65: ready from the start (no inputs), not started at 35; neither device
    # computes in the 30 µs after a's end (10), but c does within 200 µs of it
    i = g.names.index("c")
    start, end = st.op_start.copy(), st.op_end.copy()
    start[i], end[i] = 45.0, 65.0
    held = Step(**{**late.__dict__, "op_start": start, "op_end": end})
    c = bench.response_context(g, held, placement, window_us=30.0)
    assert c["sender"].tolist() == [1] and c["both_idle"].tolist() == [True]
    assert bench.response_context(g, held, placement)["both_idle"].tolist() == [False]
