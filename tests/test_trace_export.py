"""Chrome trace and Gantt export of a simulated step (costmodel/trace.py)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from placetool.costmodel import CostModel, OpGraph, presets
from placetool.costmodel.errors import UserError
from placetool.costmodel.trace import chrome_trace, figure_format, memory_timeline, peak_residents

from .helpers import cluster, nxgraph


def _fork():
    """a on d0 feeds c on d0 and b on d1: one transfer, hand-computable."""
    g = OpGraph.from_networkx(nxgraph(
        {"a": {"op_type": "MatMul", "out_bytes": 100, "param_bytes": 5, "flops": 7e3},
         "b": {"op_type": "Relu", "out_bytes": 10}, "c": {"op_type": "Add", "out_bytes": 20}},
        [("a", "b"), ("a", "c")], name="fork"))
    cm = CostModel(g, cluster(2, latency=1.0, bandwidth=10.0, kinds=["gpu", "gpu"]),
                   op_times=[[2.0, 2.0], [3.0, 3.0], [4.0, 4.0]])
    return cm, cm.simulate({"a": "d0", "b": "d1", "c": "d0"}, trace=True)


def test_memory_timeline_by_hand():
    # a runs 0-2 on d0, c 2-6 on d0; a's tensor goes to d1 over 2-13 (1 + 100/10); b runs 13-16.
    # d0: 5 params + a's 100 from 0, c's 20 over 2-6; a's output lives until its transfer ends (13).
    # d1: the received copy from 2 until b ends (16), b's 10 over 13-16.
    cm, r = _fork()
    (t0, m0), (t1, m1) = memory_timeline(r.trace, cm.graph, 2)
    assert t0.tolist() == [0.0, 0.0, 2.0, 6.0, 13.0] and m0.tolist() == [5, 105, 125, 105, 5]
    assert t1.tolist() == [0.0, 2.0, 13.0, 16.0] and m1.tolist() == [0, 100, 110, 0]
    assert [m0.max(), m1.max()] == r.peak_memory_bytes.tolist()


def test_peak_residents_by_hand():
    # d0 peaks at 2 (a's output and c's); d1 at 13 (the received copy of a's output and b's)
    cm, r = _fork()
    a, b, c = (cm.graph.index[v] for v in "abc")
    (t, ops, copies), (t1, ops1, copies1) = peak_residents(r.trace, cm.graph, 2)
    assert t == 2.0 and sorted(ops.tolist()) == sorted([a, c]) and copies.tolist() == []
    assert t1 == 13.0 and ops1.tolist() == [b] and copies1.tolist() == [0]
    assert cm.graph.tensor_op[r.trace.x_tensor[0]] == a  # the copy is of a's output


@pytest.mark.parametrize("graph,placement", [("nmt", "round-robin"), ("synthetic-1k", "random:2"),
                                             ("inception_v3", "random:5")])
def test_memory_counter_peaks_are_the_simulators(graph, placement):
    from placetool.cli.simulate import parse_placement

    g, cl = presets.load_graph(graph), presets.load_cluster("k80x4")
    cm = CostModel(g, cl)
    r = cm.simulate(parse_placement(placement, cm), trace=True)
    tl = memory_timeline(r.trace, g, cl.n_devices)
    assert [int(m.max()) for _, m in tl] == r.peak_memory_bytes.tolist()
    params = np.bincount(r.trace.placement, weights=g.param_bytes, minlength=cl.n_devices)
    assert [int(m[-1]) for _, m in tl] == params.astype(np.int64).tolist()  # everything else freed


def check_chrome_schema(doc) -> dict:
    """The trace-event format's rules that Perfetto relies on; returns counts per phase."""
    assert isinstance(doc, dict) and isinstance(doc["traceEvents"], list)
    named, slices, counts, flows = {}, {}, {}, {}
    for e in doc["traceEvents"]:
        ph = e["ph"]
        counts[ph] = counts.get(ph, 0) + 1
        assert isinstance(e["pid"], int) and e["pid"] >= 1, e
        if ph == "M":
            assert e["name"] in ("process_name", "process_sort_index", "thread_name") and "args" in e
            if e["name"] == "process_name":
                named[e["pid"]] = e["args"]["name"]
            continue
        assert isinstance(e["ts"], float) and e["ts"] >= 0, e
        if ph == "X":
            assert e["tid"] >= 1 and e["dur"] >= 0 and isinstance(e["name"], str)
            slices.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
        elif ph == "C":
            assert all(isinstance(v, int) for v in e["args"].values())
        elif ph in ("s", "f"):
            flows.setdefault(e["id"], {})[ph] = e
        else:
            raise AssertionError(f"unexpected phase {ph}")
    used = {e["pid"] for e in doc["traceEvents"] if e["ph"] != "M"}
    assert used <= set(named), "every process is named"
    for fid, pair in flows.items():
        assert set(pair) == {"s", "f"}, fid
        s, f = pair["s"], pair["f"]
        assert f["bp"] == "e" and f["ts"] >= s["ts"]
        for ev in (s, f):  # both ends sit inside a slice of their thread
            assert any(a <= ev["ts"] <= b for a, b in slices[ev["pid"], ev["tid"]]), ev
    return counts


def test_chrome_trace_of_the_fork():
    cm, r = _fork()
    doc = json.loads(json.dumps(chrome_trace(r.trace, cm.graph, cm.cluster)))
    counts = check_chrome_schema(doc)
    ev = doc["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in ev if e["name"] == "process_name"}
    assert names == {1: "d0 (gpu)", 2: "d1 (gpu)", 3: "d0 -> d1"}
    ops = {e["name"]: e for e in ev if e["ph"] == "X" and e["cat"] != "transfer"}
    assert {k: (v["pid"], v["ts"], v["dur"]) for k, v in ops.items()} == {
        "a": (1, 0.0, 2.0), "c": (1, 2.0, 4.0), "b": (2, 13.0, 3.0)}
    assert ops["a"]["args"] | {} == {"op_type": "MatMul", "flops": 7e3, "bytes": 100, "param_bytes": 5,
                                     "group": ops["a"]["args"]["group"], "layer": -1, "op": 0}
    (x,) = [e for e in ev if e["ph"] == "X" and e["cat"] == "transfer"]
    assert (x["pid"], x["ts"], x["dur"], x["args"]["bytes"], x["args"]["consumers"]) == (3, 2.0, 11.0, 100, ["b"])
    flow = {e["ph"]: e for e in ev if e["ph"] in "sf"}
    assert counts["s"] == counts["f"] == 1 and (flow["s"]["pid"], flow["f"]["pid"], flow["f"]["ts"]) == (3, 2, 13.0)
    mem = [(e["pid"], e["ts"], e["args"]["bytes"]) for e in ev if e["ph"] == "C"]
    assert max(b for p, _, b in mem if p == 1) == 125 and max(b for p, _, b in mem if p == 2) == 110


def test_chrome_trace_of_a_real_graph_passes_the_schema():
    from placetool.cli.simulate import parse_placement

    g, cl = presets.load_graph("nmt"), presets.load_cluster("k80x4")
    cm = CostModel(g, cl)
    r = cm.simulate(parse_placement("round-robin", cm), trace=True)
    doc = json.loads(json.dumps(r.trace.to_chrome(g, cl)))
    counts = check_chrome_schema(doc)
    assert counts["X"] == g.n_ops + r.trace.n_transfers
    # one flow per (transfer, consumer on the destination): at least one per transfer
    assert counts["s"] >= r.trace.n_transfers
    assert counts["C"] > 2 * cl.n_devices


def test_send_and_receive_tasks_are_exported_and_drawn(tmp_path):
    # _fork with device-side transfer costs: a ends at 2 on d0; its send (rank of a, before
    # c) runs 2-2.5 on d0, so c runs 2.5-6.5; the link 2.5-13.5 (1 + 100/10); the receive
    # 13.5-15 on d1; b 15-18.
    g = _fork()[0].graph
    cm = CostModel(g, cluster(2, latency=1.0, bandwidth=10.0, kinds=["gpu", "gpu"], send_us=[0.5, 0.0],
                              recv_us=[0.0, 1.5]), op_times=[[2.0, 2.0], [3.0, 3.0], [4.0, 4.0]])
    tr = cm.simulate({"a": "d0", "b": "d1", "c": "d0"}, trace=True).trace
    doc = chrome_trace(tr, cm.graph, cm.cluster)
    check_chrome_schema(json.loads(json.dumps(doc)))
    tasks = sorted((e["cat"], e["pid"], e["ts"], e["dur"]) for e in doc["traceEvents"]
                   if e.get("cat") in ("send", "recv"))
    assert tasks == [("recv", 2, 13.5, 1.5), ("send", 1, 2.0, 0.5)]
    ops = {e["name"]: (e["ts"], e["dur"]) for e in doc["traceEvents"] if e.get("ph") == "X" and e["name"] in "abc"}
    assert ops == {"a": (0.0, 2.0), "c": (2.5, 4.0), "b": (15.0, 3.0)}
    from placetool.costmodel.trace import gantt

    gantt(tr, cm.graph, cm.cluster, tmp_path / "g.svg")
    text = (tmp_path / "g.svg").read_text()
    assert "send/recv work" in text
    # busy time counts the send and receive work: d0 a 2 + send 0.5 + c 4, d1 receive 1.5 + b 3
    assert "36% busy" in text and "25% busy" in text


def test_gantt_formats_and_legend(tmp_path):
    from placetool.cli.simulate import parse_placement

    g, cl = presets.load_graph("nmt"), presets.load_cluster("k80x4")
    cm = CostModel(g, cl)
    r = cm.simulate(parse_placement("round-robin", cm), trace=True)
    r.trace.plot(g, cl, tmp_path / "g.svg", lower_bound_us=cm.lower_bound_us())
    root = ET.parse(tmp_path / "g.svg").getroot()
    text = ET.tostring(root, encoding="unicode")
    for want in ("MatMul", "other", "lower bound", "time (ms)", "% busy", "links (12 busiest of 20)"):
        assert want in text, want
    r.trace.plot(g, cl, tmp_path / "g.pdf")
    assert (tmp_path / "g.pdf").read_bytes()[:5] == b"%PDF-"
    r.trace.plot(g, cl, tmp_path / "g.png", dpi=60)
    small = (tmp_path / "g.png").stat().st_size
    r.trace.plot(g, cl, tmp_path / "g.png", dpi=240)
    assert (tmp_path / "g.png").read_bytes()[:4] == b"\x89PNG" and (tmp_path / "g.png").stat().st_size > 2 * small


def test_figure_format_rules():
    assert figure_format("a.PDF") == "pdf" and figure_format("a", "svg") == "svg"
    with pytest.raises(UserError, match="suffix says png but --format is pdf"):
        figure_format("a.png", "pdf")
    with pytest.raises(UserError, match="cannot tell the figure format"):
        figure_format("a.jpg")


def test_simulate_cli_writes_each_format_and_refuses_a_mismatch(tmp_path):
    import subprocess
    import sys

    def run(*a):
        return subprocess.run([sys.executable, "-m", "placetool.cli.main", "simulate", "-g", "synthetic-1k", *a],
                              capture_output=True, text=True, timeout=120)

    r = run("--plot", str(tmp_path / "g.svg"), "--trace", str(tmp_path / "t.json"))
    assert r.returncode == 0, r.stderr
    ET.parse(tmp_path / "g.svg")
    check_chrome_schema(json.loads((tmp_path / "t.json").read_text()))
    r = run("--plot", str(tmp_path / "g.png"), "--format", "pdf")
    assert r.returncode == 2 and "the suffix says png but --format is pdf" in r.stderr
    assert not (tmp_path / "g.png").exists()
    r = run("--plot", str(tmp_path / "g"), "--format", "pdf", "--dpi", "100")
    assert r.returncode == 0 and (tmp_path / "g").read_bytes()[:5] == b"%PDF-"
