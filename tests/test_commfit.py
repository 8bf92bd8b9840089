"""Transfer costs read off traced timelines (costmodel/commfit.py): hand-made recordings
with known answers, and the checked-in recording of a real split step."""

from pathlib import Path

import numpy as np
import pytest

from placetool.costmodel import OpGraph, presets
from placetool.costmodel import timeline as TL
from placetool.costmodel.commfit import (fit_device_costs, stolen_cpu, transfer_counts, with_device_costs)
from tests.helpers import cluster, nxgraph

DATA = Path(__file__).parent / "data"


def fan(k: int, nbytes: int) -> OpGraph:
    """p0..p{k-1} each send one tensor of ``nbytes`` to q0..q{k-1}."""
    nodes = {**{f"p{i}": nbytes for i in range(k)}, **{f"q{i}": 4 for i in range(k)}}
    return OpGraph.from_networkx(nxgraph(nodes, [(f"p{i}", f"q{i}", {"bytes": nbytes}) for i in range(k)],
                                         name=f"fan{k}"))


def recording(g, k, nbytes, extra_us, gap_us=0.0, traced=True):
    """p_i on device 0 at [10 i, 10 i + 10), back to back; q_i on device 1, 5 µs alone,
    starting ``gap_us`` after its input arrived (RecvTensor 1 µs after p_i ends); q_0 runs
    ``extra_us`` longer than alone (gap + extra <= 5: it ends before q_1's input arrives)."""
    ops, recv = [], []
    for i in range(k):
        ops.append([f"p{i}", 0, 10.0 * i, 10.0])
        arrive = 10.0 * i + 11.0
        if traced:
            recv.append([f"edge_{i}_p{i}", f"p{i}", 0, 1, nbytes, 10.0 * i + 10.0, 1.0])
        ops.append([f"q{i}", 1, arrive + gap_us, 5.0 + (extra_us if i == 0 else 0.0)])
    d = {"format": TL.FORMAT, "version": TL.VERSION, "graph": g.name, "n_ops": g.n_ops,
         "devices": ["/cpu:0", "/cpu:1"], "kinds": ["cpu", "cpu"],
         "placement": {**{f"p{i}": 0 for i in range(k)}, **{f"q{i}": 1 for i in range(k)}},
         "untraced_step_us": [100.0], "steps": [{"wall_us": 100.0, "ops": ops, "recv": recv}],
         "single": {"device": 0, "step_us": 15.0 * k, "op_us": {n: 10.0 if n[0] == "p" else 5.0 for n in g.names}}}
    return TL.load(d, g)


def test_transfer_counts_count_each_tensor_once_per_destination():
    g = OpGraph.from_networkx(nxgraph(
        {"a": 100, "b": 1, "c": 1, "d": 2048, "e": 1},
        [("a", "b", {"bytes": 100}), ("a", "c", {"bytes": 100}), ("d", "e", {"bytes": 2048})]))
    p = np.array([g.index[n] for n in "abcde"])
    place = np.empty(g.n_ops, np.int64)
    place[p] = [0, 1, 1, 1, 0]
    c = transfer_counts(g, place, 2)
    # device 0 sends a's tensor once (b and c share it) and receives d's 2 KiB
    assert np.allclose(c, [[1, 100 / 1024, 1, 2.0], [1, 2.0, 1, 100 / 1024]])


def test_stolen_cpu_is_op_growth_plus_idle_while_every_input_was_there():
    g = fan(2, 1024)
    rec = recording(g, 2, 1024, extra_us=3.0, gap_us=2.0)
    one = {d: rec.single_op_us for d in (0, 1)}
    dev0, dev1 = stolen_cpu(rec, 0, one)
    assert dev0 == {"device": 0, "inflation_us": 0.0, "gaps_us": 0.0, "stolen_us": 0.0}
    # q0 (13..21) runs 3 µs long; q1 starts at 23, 2 µs after its tensor arrived at 21;
    # q0's own 2 µs wait comes before the device's first op: not a gap between its ops
    assert dev1["inflation_us"] == 3.0 and dev1["gaps_us"] == 2.0 and dev1["stolen_us"] == 5.0


def test_a_wait_on_a_tensor_the_trace_did_not_record_is_not_counted():
    g = fan(2, 1 << 20)
    rec = recording(g, 2, 1 << 20, extra_us=0.0, gap_us=4.0, traced=False)
    assert stolen_cpu(recording(g, 2, 1 << 20, extra_us=0.0, gap_us=4.0), 0,
                      {d: rec.single_op_us for d in (0, 1)})[1]["gaps_us"] == 4.0  # traced: counted
    assert stolen_cpu(rec, 0, {d: rec.single_op_us for d in (0, 1)})[1]["gaps_us"] == 0.0


def test_the_fit_recovers_a_known_cost_per_received_message():
    """Device 1 loses exactly 50 µs per tensor it receives, whatever its size; device 0
    nothing. Two recordings with different counts and sizes tell messages from bytes."""
    recs = []
    for k, nbytes in ((2, 1024), (4, 2048)):
        g = fan(k, nbytes)
        rec = recording(g, k, nbytes, extra_us=0.0)
        rec.single_op_us[g.index["q0"]] -= 50.0 * k  # q0 "alone" 50 k µs faster: that much growth
        recs.append(rec)
    fit = fit_device_costs(recs, labels=["a", "b"])
    assert fit.params["recv_us"] == pytest.approx(50.0)
    for key in ("send_us", "send_us_per_byte", "recv_us_per_byte"):
        assert fit.params[key] == pytest.approx(0.0, abs=1e-9)
    assert fit.r2 == pytest.approx(1.0)
    assert [r["label"] for r in fit.rows] == ["a", "a", "b", "b"]


def test_recordings_on_one_device_leave_nothing_to_fit():
    g = fan(1, 8)
    d = {"format": TL.FORMAT, "version": TL.VERSION, "graph": g.name, "n_ops": 2, "devices": ["/cpu:0", "/cpu:1"],
         "kinds": ["cpu", "cpu"], "placement": {"p0": 0, "q0": 0},
         "steps": [{"ops": [["p0", 0, 0.0, 10.0], ["q0", 0, 10.0, 10.0]], "recv": []}],
         "single": {"device": 0, "step_us": 20.0, "op_us": {"p0": 10.0, "q0": 10.0}}}
    with pytest.raises(TL.TimelineError, match="no traced split steps"):
        fit_device_costs([TL.load(d, g)])


def test_the_real_recording_inflation_agrees_with_explain():
    """On the checked-in traced split step, each device's inflation is what
    ``explain``'s per-op account gives for that step, and stolen = inflation + gaps."""
    g = presets.load_graph(str(DATA / "mlp_split.timeline.npz"))
    rec = TL.load(DATA / "mlp_split.timeline.json", g)
    one = {d: rec.single_op_us for d in range(rec.n_devices)}
    for k in range(len(rec.steps)):
        infl = TL.op_inflation(rec, k)["devices"]
        for r in stolen_cpu(rec, k, one):
            assert r["inflation_us"] == pytest.approx(infl[r["device"]]["split_us"] - infl[r["device"]]["single_us"])
            assert r["gaps_us"] >= 0 and r["stolen_us"] == r["inflation_us"] + r["gaps_us"]
    fit = fit_device_costs([rec])
    assert all(v >= 0 for v in fit.params.values()) and len(fit.rows) == 2 * len(rec.steps)


def test_device_costs_come_off_the_links_so_a_lone_transfer_keeps_its_time():
    base = cluster(latency=100.0, bandwidth=1000.0, link_send="idle")
    params = {"send_us": 30.0, "send_us_per_byte": 2e-4, "recv_us": 20.0, "recv_us_per_byte": 1e-4}
    c = with_device_costs(base, params, kinds=("cpu", "gpu"))
    assert c.link_send == "idle" and c.devices[1].recv_us == 20.0
    nbytes = 10_000
    lone = lambda cl, a, b: ((cl.devices[a].send_us + nbytes * cl.devices[a].send_us_per_byte)  # noqa: E731
                             + cl.latency_us[a, b] + nbytes / cl.bandwidth_bytes_per_us[a, b]
                             + cl.devices[b].recv_us + nbytes * cl.devices[b].recv_us_per_byte)
    assert lone(c, 0, 1) == pytest.approx(lone(base, 0, 1)) == pytest.approx(110.0)
    # more device cost than the link had: the link keeps 10% of what it was
    big = with_device_costs(base, {**params, "send_us": 500.0}, kinds=("cpu", "gpu"))
    assert big.latency_us[0, 1] == pytest.approx(10.0)
