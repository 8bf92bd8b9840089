"""Measured timelines: parsing, the per-device breakdown, op inflation, replay, ``placetool explain``.

``tests/data/mlp_split.timeline.json`` (with its graph, ``mlp_split.timeline.npz``) is a real
recording: 3 FULL_TRACE steps of the zoo's mlp (batch 16, 93 ops) with its groups
alternating between two workers of a 2-worker CPU testbed, plus 3 steps of every op on
worker 0, taken on a loaded 2-core machine (``costmodel/tf/trace_capture.py``). Only the
last test starts workers.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from placetool.cli.main import main
from placetool.costmodel import OpGraph
from placetool.costmodel import timeline as TL

from .helpers import nxgraph

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
REC = os.path.join(DATA, "mlp_split.timeline.json")
GRAPH = os.path.join(DATA, "mlp_split.timeline.npz")


@pytest.fixture(scope="module")
def rec():
    return TL.load(REC, OpGraph.load(GRAPH))


# ----------------------------------------------------------------- a hand-made step
def _tiny():
    """a (dev 0) -> b (dev 1) -> d (dev 0); c (dev 1) has no inputs.

    Traced: a [0, 10) on 0; c [0, 4) and b [18, 25) on 1; d [30, 32) on 0. a's tensor is
    asked for at 2 and arrives at 16; b's is asked for at 5 and arrives at 28.
    """
    g = OpGraph.from_networkx(nxgraph({"a": 400, "b": 400, "c": 40, "d": 40}, [("a", "b"), ("b", "d")],
                                      name="tiny"))
    d = {"format": TL.FORMAT, "version": TL.VERSION, "graph": "tiny", "devices": ["w0", "w1"],
         "kinds": ["cpu", "cpu"], "placement": {"a": 0, "b": 1, "c": 1, "d": 0},
         "untraced_step_us": [40.0],
         "steps": [{"wall_us": 45.0,
                    "ops": [["a", 0, 0, 10], ["c", 1, 0, 4], ["b", 1, 18, 7], ["d", 0, 30, 2]],
                    "recv": [["edge_1_a", "a", 0, 1, 400, 2, 14], ["edge_2_b", "b", 1, 0, 400, 5, 23]]}],
         "single": {"device": 0, "step_us": 20.0, "op_us": {"a": 5, "b": 7, "c": 2, "d": 1}}}
    return TL.load(d, g)


def test_hand_made_breakdown():
    r = _tiny()
    b = TL.breakdown(r)
    assert b["span_us"] == 32
    d0, d1 = b["devices"]
    # device 0: a and d run 12; d's input was produced at 25 and arrived at 28 (3 in
    # flight), d started at 30 (2 ready, not started); the rest nothing ready
    assert (d0["busy_us"], d0["transfer_us"], d0["ready_us"], d0["nothing_ready_us"]) == (12, 3, 2, 15)
    # device 1: c and b run 11; a's tensor in flight 10..16, b ready 16..18
    assert (d1["busy_us"], d1["transfer_us"], d1["ready_us"], d1["nothing_ready_us"]) == (11, 6, 2, 13)
    # nobody computes in [10, 18) and [25, 30): 13 µs, 9 of them with a tensor in flight
    assert (b["none_busy_us"], b["none_busy_in_flight_us"]) == (13, 9)
    xs = TL.transfers(r)
    assert [(x["producer"], x["producer_end_us"], x["recv_start_us"], x["recv_end_us"], x["consumer_start_us"],
             x["wire_us"], x["delivery_us"]) for x in xs] == [("a", 10, 2, 16, 18, 6, 6), ("b", 25, 5, 28, 30, 3, 3)]
    inf = TL.op_inflation(r)
    assert [(d["split_us"], d["single_us"]) for d in inf["devices"]] == [(12, 6), (11, 9)]
    assert inf["ratio"] == pytest.approx(23 / 15)


def test_hand_made_replay():
    r = _tiny()
    # a [0, 10) on 0, c [0, 4) on 1; a's tensor takes 6: b [16, 23); b's takes 3: d [26, 28)
    for links in ("fifo", "concurrent", "traced"):
        x = TL.replay(r, links=links)
        assert x["replay_us"] == pytest.approx(28.0), links
        assert x["error_pct"] == pytest.approx(100 * (28 - 32) / 32)
    # ops padded by the runtime's gap: each of the 4 ops 1 µs longer, 3 on the path
    assert TL.replay(r, links="traced", ready_us=1.0)["replay_us"] == pytest.approx(31.0)
    cl = TL.traced_cluster(r)
    assert cl.latency_us[0, 1] == 6 and cl.latency_us[1, 0] == 3


def test_bad_timelines_name_the_problem(tmp_path):
    g = OpGraph.from_networkx(nxgraph({"a": 4, "b": 4}, [("a", "b")], name="two"))
    base = {"format": TL.FORMAT, "version": TL.VERSION, "devices": ["w0"], "kinds": ["cpu"],
            "placement": {"a": 0, "b": 0}, "steps": [{"ops": [["a", 0, 0, 1]], "recv": []}]}
    assert TL.load(base, g).steps[0].traced.tolist() == [True, False]
    for change, words in [({"version": 9}, "version 9"), ({"format": "x"}, "not a placetool.timeline"),
                          ({"placement": {"a": 0, "zz": 0}}, "'zz'"), ({"placement": {"a": 0, "b": 3}}, "device 3"),
                          ({"placement": {"a": 0}}, "no device for op 'b'"), ({"steps": []}, "no traced steps"),
                          ({"steps": [{"ops": [["a", 0, 0, -1]], "recv": []}]}, "bad time"),
                          ({"out_order": {"zz": ["a", "b"]}}, "out_order names op 'zz'"),
                          ({"out_order": {"a": "b"}}, "'out_order' must map")]:
        with pytest.raises(TL.TimelineError, match=words.replace("(", r"\(")):
            TL.load({**base, **change}, g)
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(TL.TimelineError, match="not a timeline file"):
        TL.load(bad, g)


def _handled_early(out_order=None):
    """q (dev 1, 20 µs) feeds a (dev 0, 50 µs), which feeds b (dev 0, 100 µs) and c (dev 1,
    10 µs); links of 10 µs, no CPU per message. c's request reaches device 0 at 10, while
    it is idle: the handler runs before a has, so a's ``_Send`` answers when it runs."""
    g = OpGraph.from_arrays("early", ["q", "a", "b", "c"], ["X"] * 4, [8] * 4, [0, 1, 1], [1, 2, 3])
    d = {"format": TL.FORMAT, "version": TL.VERSION, "devices": ["w0", "w1"], "kinds": ["cpu", "cpu"],
         "placement": {"q": 1, "a": 0, "b": 0, "c": 1},
         "steps": [{"ops": [["q", 1, 0, 20], ["a", 0, 30, 50], ["b", 0, 80, 100], ["c", 1, 190, 10]], "recv": []}]}
    if out_order is not None:
        d["out_order"] = out_order
    return TL.load(d, g)


def test_the_executor_order_decides_when_a_send_runs():
    """Hand-computed: a ends at 80 and readies b and its ``_Send`` to c. The run queue takes
    the last readied first: in the graph's edge order the ``_Send`` (c's tensor lands at 90);
    in an executor order that readies the ``_Send`` first, b (the tensor leaves at 180)."""
    from placetool.costmodel.workers import WorkerCosts, simulate_workers

    from .helpers import cluster

    lat, bw, op_us = np.array([[0.0, 10.0], [10.0, 0.0]]), np.full((2, 2), np.inf), np.array([20.0, 50, 100, 10])
    for order, c_start in ((None, 90.0), ({"a": ["b", "@send:1"]}, 90.0), ({"a": ["@send:1", "b"]}, 190.0)):
        r = _handled_early(order)
        g = r.executed_graph()
        assert sorted(zip(g.edge_src.tolist(), g.edge_dst.tolist())) == [(0, 1), (1, 2), (1, 3)]
        t = simulate_workers(g, op_us, r.placement, lat, bw)
        assert t.op_start.tolist() == [0.0, 30.0, 80.0, c_start], order
        links = cluster(2, latency=10.0, bandwidth=1e9, link_queue="none")
        x = TL.replay(r, cluster=links, links=TL.WORKERS, costs=WorkerCosts())
        assert x["replay_us"] == pytest.approx(c_start + 10 if c_start > 180 else 180.0)
    assert r.executed_graph() is r.executed_graph() and r.graph.edge_dst.tolist() == [1, 2, 3]


# ----------------------------------------------------------------- the recorded step
def test_recorded_step_parses_to_checkable_facts(rec):
    g = rec.graph
    assert len(rec.steps) == 3 and rec.n_devices == 2
    for st in rec.steps:
        assert st.traced.all()  # every op of the graph ran and was traced
        assert (st.op_dev == rec.placement).all()  # on the device the placement says
        b = TL.breakdown(rec, st)
        for d in b["devices"]:
            on = st.op_dev == d["device"]
            # one op at a time per worker: busy is the plain sum of its ops' durations
            assert d["busy_us"] == pytest.approx(st.op_us[on].sum(), abs=1e-6)
            parts = d["busy_us"] + d["ready_us"] + d["transfer_us"] + d["nothing_ready_us"]
            assert parts == pytest.approx(st.span_us)
        # every transfer goes between the two workers, from the device its producer ran on
        assert ((st.x_src != st.x_dst) & (st.x_src == st.op_dev[st.x_producer])).all()
        assert (st.x_producer >= 0).all()
        # producer end <= RPC start <= RPC end (arrival) <= first consumer start
        pe, xs, xe, cs = st.x_producer_end, st.x_start, st.x_end, st.x_consumer_start
        assert np.isfinite(cs).all()
        assert (pe <= xs).all() and (xs <= xe).all() and (xe <= cs).all()
        # here the receiver asked late: delivery (arrival - producer end) exceeds the wire time
        assert (st.delivery_us >= st.wire_us).all() and (st.delivery_us > 2 * st.wire_us).any()
        assert st.x_control.sum() == 7 and (st.x_bytes[st.x_control] == 0).all()
        assert st.n_transfers == 53
    # the op inflation is the recorded medians: split 919.7 µs against 457.1 µs on one device
    inf = TL.op_inflation(rec)
    assert inf["single_us"] == pytest.approx(457.116, abs=1e-3)
    assert inf["split_us"] == pytest.approx(919.675, abs=1e-3)
    assert len(inf["ops"]) == g.n_ops


def test_recorded_step_replay_shows_the_link_queue(rec):
    """The recorded (loaded-machine) step against its replays, as measured.

    The simulator's one-transfer-at-a-time link queue serialises RecvTensor calls that
    gRPC runs side by side, and overshoots every step 3-6 times; with the same
    latencies side by side the replay is within -33..-2%, with each transfer's own
    delivery time within -20..-4%. The rest is the runtime's gaps between ops (``ready``
    in the breakdown), which traced op durations omit: the 5% goal is not met on this
    recording, and these are the figures to beat.
    """
    got = {m: [TL.replay(rec, k, links=m)["error_pct"] for k in range(3)] for m in TL.REPLAYS}
    assert got["fifo"] == pytest.approx([202.5, 505.0, 242.3], abs=0.1)
    assert got["concurrent"] == pytest.approx([-32.2, -2.9, -29.2], abs=0.1)
    # sent only from an idle worker: a little later here, where the sender was seldom busy
    assert got["idle"] == pytest.approx([-31.4, -2.1, -28.2], abs=0.1)
    assert got["traced"] == pytest.approx([-10.8, -19.1, -4.3], abs=0.1)
    for k in range(3):
        b = TL.breakdown(rec, k)
        assert b["none_busy_us"] > 0.9 * b["span_us"]  # the ops themselves are ~1 ms of a ~30 ms step


# ----------------------------------------------------------------- the command
def _call(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main([str(a) for a in argv])
    out = capsys.readouterr()
    return e.value.code, out.out, out.err


def test_explain_cli_reads_a_recording(capsys):
    code, out, err = _call(["explain", REC, "--json"], capsys)
    assert code == 0, err
    e = json.loads(out)
    assert e["step"] == 1 == e["median_step"] and e["steps"] == 3  # the median span
    assert e["n_data_transfers"] == 46 and e["n_control_transfers"] == 7
    assert e["simulated_transfers"] == 46  # every tensor the simulator sends was traced
    assert e["replay"]["fifo"]["error_pct"] == pytest.approx(505.0, abs=0.1)
    assert len(e["breakdown"]["devices"]) == 2 and len(e["transfers"]) == 53
    # what transfers took from each core: op growth (explain's own inflation account of
    # this step) plus the idle gaps, here 2.7 and 14.0 ms of a 30.7 ms step
    assert [round(x["stolen_us"]) for x in e["stolen"]] == [2729, 13988]
    assert all(x["stolen_us"] == pytest.approx(x["inflation_us"] + x["gaps_us"]) for x in e["stolen"])
    # the executor's order: latest ready first agrees more often than the simulator's, and an
    # op fed by a transfer never ran before a locally readied one (18 such choices)
    o = e["order"]
    assert o["decisions"] == 62 and o["mixed"] == 18 and o["remote_chosen"] == 0.0
    assert o["latest_ready"] > o["simulator"]
    code, out, err = _call(["explain", REC, "--step", 0, "--top", 3], capsys)
    assert code == 0, err
    assert "per device" in out and "replay" in out and "+202.5%" in out and "CPU the transfers took" in out
    assert "op order: of 64 choices" in out  # step 0
    assert "traced step 0 of 3\n" in out  # not the median one: no "(the median span)"


@pytest.mark.parametrize("args, words", [
    ([], ["TIMELINE", "-g MODEL"]),
    ([REC, "-g", "nmt"], ["lacks"]),
    ([REC, "--step", 7], ["step 7"]),
    ([REC, "-p", "round-robin"], ["-p"]),
    ([REC, "--testbed", 2], ["--testbed"]),
    ([os.path.join(DATA, "missing.json")], ["missing.json"]),
])
def test_explain_cli_bad_input_is_one_line(args, words, capsys):
    code, out, err = _call(["explain", *args], capsys)
    assert code == 2, (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in lines[0], (w, lines[0])


# ----------------------------------------------------------------- recording for real
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_capture_on_a_testbed_then_explain(tmp_path, capsys):
    """Record a split mlp step on 2 workers through the command, then read it back."""
    out = tmp_path / "rec.json"
    code, stdout, err = _call(["explain", "-g", "mlp", "--batch", 16, "-p", "round-robin", "--testbed", 2,
                               "--steps", 2, "--warmup", 1, "--save", out, "--json", "-q"], capsys)
    assert code == 0, err
    e = json.loads(stdout)
    assert e["steps"] == 2 and e["n_data_transfers"] > 0
    assert out.exists() and out.with_suffix(".npz").exists()
    r = TL.load(out, OpGraph.load(out.with_suffix(".npz")))
    for st in r.steps:
        assert st.traced.all() and (st.op_dev == r.placement).all()
        known = np.isfinite(st.x_consumer_start)
        assert (st.x_producer_end[known] <= st.x_end[known]).all()
        assert (st.x_end[known] <= st.x_consumer_start[known]).all()
    assert r.single_op_us is not None and np.isfinite(r.single_op_us).all()
    # the executor's order of each op's consumers, read from the run's partition graphs
    assert r.out_order and any(c.startswith("@send:") for v in r.out_order.values() for c in v)
    g = r.executed_graph()
    assert sorted(zip(g.edge_src.tolist(), g.edge_dst.tolist())) == sorted(zip(r.graph.edge_src.tolist(),
                                                                                r.graph.edge_dst.tolist()))


def _unqueued_models():
    """Cost models whose transfers cost their devices nothing, on links that do not queue:
    what :func:`timeline.list_schedule` models."""
    from hypothesis import strategies as st

    from .helpers import assignments, cost_models

    @st.composite
    def draw(d):
        cm = d(cost_models(max_ops=16))
        if cm.net.has_tasks or cm.cluster.link_queue != "none":
            from dataclasses import replace

            from placetool.costmodel import CostModel

            c = replace(cm.cluster, link_queue="none", link_send="eager",
                        devices=[replace(x, send_us=0.0, send_us_per_byte=0.0, recv_us=0.0, recv_us_per_byte=0.0)
                                 for x in cm.cluster.devices])
            cm = CostModel(cm.graph, c, op_times=cm.T)
        return cm, cm.graph.to_placement(np.array(d(assignments(cm)), np.int32))

    return draw()


def test_the_replay_list_schedule_is_the_simulator_on_links_that_do_not_queue():
    """``list_schedule`` (the ``traced`` replay, which gives each transfer its own traced
    time) repeats the simulator's rules: with no overrides it must agree with it."""
    from hypothesis import HealthCheck, given, settings

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(_unqueued_models())
    def check(args):
        cm, p = args
        r = cm.simulate(p, trace=True)
        dur = cm.T[np.arange(cm.graph.n_ops), p]
        start, end = TL.list_schedule(cm.graph, dur, p, cm.cluster.latency_us, cm.cluster.bandwidth_bytes_per_us)
        assert np.array_equal(start, r.trace.op_start) and np.array_equal(end, r.trace.op_end)

    check()


def one_device_choices():
    """On one device: a (0-10) feeds b and c; e has no input. The trace runs a, c, e, b.
    At 0 the ready ops are a and e (a chosen: earliest, lowest rank); at 10 they are b, c
    (ready at 10) and e (ready since 0): c is chosen, which only "latest ready" agrees
    with; at 15, b and e: e chosen (earliest ready, and the simulator's order)."""
    g = OpGraph.from_networkx(nxgraph({v: 8 for v in "abce"}, [("a", "b"), ("a", "c")]), "one")
    i = {n: g.names.index(n) for n in "abce"}
    dev, start, end = np.zeros(4, np.int64), np.zeros(4), np.zeros(4)
    for n, s, e in (("a", 0, 10), ("c", 10, 15), ("e", 15, 20), ("b", 20, 25)):
        start[i[n]], end[i[n]] = s, e
    none = np.array([], np.int64)
    st = TL.Step(op_dev=dev, op_start=start, op_end=end, x_edge=[], x_producer=none, x_src=none, x_dst=none,
              x_bytes=none, x_start=np.array([]), x_end=np.array([]), x_control=np.array([], bool),
              x_producer_end=np.array([]), x_consumer_start=np.array([]))
    return g, st, i


def test_order_agreement_by_hand():
    g, st, i = one_device_choices()
    assert g.topo_rank[i["a"]] < g.topo_rank[i["e"]]  # so a is the simulator's choice at 0
    r = TL.order_agreement(g, st)
    assert r["decisions"] == 3
    # a at 0: all three agree (a and e both ready at 0: a tie for the ready rules);
    # c at 10: latest only; e at 15: earliest and simulator
    assert r["earliest_ready"] == pytest.approx(2 / 3) and r["latest_ready"] == pytest.approx(2 / 3)
    assert r["simulator"] == pytest.approx(2 / 3)  # at 10 it would run e, ready since 0


def test_a_choice_between_a_transfer_s_op_and_a_local_one():
    """b (dev 1) waits on a's tensor from dev 0, arrived at 40; f (dev 1) has no input.
    The trace runs f at 45 and b at 50: at 45 both were ready, and the local one ran."""
    g = OpGraph.from_networkx(nxgraph({"a": 1_000, "b": 1, "f": 1}, [("a", "b")]), "mixed")
    i = {n: g.names.index(n) for n in "abf"}
    dev, start, end = np.zeros(3, np.int64), np.zeros(3), np.zeros(3)
    for n, d, s, e in (("a", 0, 0, 10), ("f", 1, 45, 50), ("b", 1, 50, 60)):
        dev[i[n]], start[i[n]], end[i[n]] = d, s, e
    st = TL.Step(op_dev=dev, op_start=start, op_end=end, x_edge=["a:0"], x_producer=np.array([i["a"]]),
              x_src=np.array([0]), x_dst=np.array([1]), x_bytes=np.array([1_000], np.int64),
              x_start=np.array([12.0]), x_end=np.array([40.0]), x_control=np.array([False]),
              x_producer_end=np.array([10.0]), x_consumer_start=np.array([50.0]))
    r = TL.order_agreement(g, st)
    assert r["decisions"] == 1 and r["mixed"] == 1 and r["remote_chosen"] == 0.0
    assert r["earliest_ready"] == 1.0 and r["latest_ready"] == 0.0  # f ready since 0, b since 40
