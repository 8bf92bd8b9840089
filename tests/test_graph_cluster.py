"""OpGraph and Cluster: building, validation with named errors, file round trips."""

import networkx as nx
import numpy as np
import pytest

from placetool.costmodel import Cluster, ClusterError, GraphError, OpGraph, presets
from placetool.costmodel import cluster as cluster_io
from placetool.costmodel import graph as graph_io
from tests.helpers import cluster, nxgraph


def small():
    nodes = {
        "x": {"op_type": "Placeholder", "out_bytes": 400, "kinds": ["cpu"]},
        "w": {"op_type": "VarHandleOp", "out_bytes": 64, "param_bytes": 64, "group": "w"},
        "read": {"op_type": "ReadVariableOp", "out_bytes": 64, "group": "w"},
        "mm": {"op_type": "MatMul", "out_bytes": 200, "flops": 1600.0, "layer": 1},
        "upd": {"op_type": "AssignSub", "out_bytes": 0, "group": "w"},
    }
    edges = [("x", "mm"), ("w", "read"), ("read", "mm"), ("mm", "upd", {"bytes": 64, "output": 0}),
             ("w", "upd", {"control": True})]
    return OpGraph.from_networkx(nxgraph(nodes, edges, name="small"))


def test_from_networkx_keeps_order_groups_and_pins():
    g = small()
    assert g.names == ["x", "w", "read", "mm", "upd"]
    assert g.n_groups == 3
    assert g.group[1] == g.group[2] == g.group[4] != g.group[0]
    assert g.allowed[0] == 1 and g.allowed[3] == 3
    assert g.group_allowed[g.group[0]] == 1
    assert list(g.in_bytes) == [0, 0, 64, 464, 64]
    assert g.layer[3] == 1 and g.layer[0] == -1
    assert (g.edge_tensor < 0).sum() == 1
    assert g.summary()["pinned_ops"] == 1 and g.summary()["param_bytes"] == 64


def test_edge_bytes_default_to_the_producers_out_bytes():
    g = small()
    e = {(g.names[s], g.names[d]): b for s, d, b in zip(g.edge_src, g.edge_dst, g.edge_bytes)}
    assert e[("x", "mm")] == 400 and e[("mm", "upd")] == 64 and e[("w", "upd")] == 0


def test_networkx_round_trip():
    g = small()
    h = OpGraph.from_networkx(g.to_networkx(), "small")
    for f in ("out_bytes", "param_bytes", "flops", "group", "allowed", "layer", "edge_src", "edge_dst",
              "edge_tensor", "tensor_op", "tensor_bytes"):
        assert np.array_equal(getattr(g, f), getattr(h, f)), f
    assert g.names == h.names and g.op_types == h.op_types


def test_save_load_round_trip(tmp_path):
    g = presets.load_graph("synthetic-1k")
    path = tmp_path / "g.npz"
    g.save(path)
    h = graph_io.load(path)
    assert h.names == g.names and h.op_types == g.op_types and h.meta == g.meta
    for f in ("out_bytes", "param_bytes", "flops", "group", "allowed", "layer", "edge_src", "edge_dst",
              "edge_tensor", "tensor_op", "tensor_bytes"):
        assert np.array_equal(getattr(g, f), getattr(h, f)), f
    assert not list(tmp_path.glob(".*tmp"))


def test_a_50k_op_graph_file_is_a_few_megabytes(tmp_path):
    g = presets.load_graph("synthetic-50k")
    g.save(tmp_path / "big.npz")
    assert (tmp_path / "big.npz").stat().st_size < 4 << 20


@pytest.mark.parametrize("edges,match", [
    ([("a", "b"), ("b", "c"), ("c", "a")], "cycle"),
    ([("a", "a")], "'a': edge to itself"),
])
def test_cycles_are_rejected_naming_an_op(edges, match):
    with pytest.raises(GraphError, match=match):
        OpGraph.from_networkx(nxgraph({"a": 1, "b": 1, "c": 1}, edges))


def test_dangling_edges_and_negative_sizes_name_the_op():
    with pytest.raises(GraphError, match="'b': dangling edge"):
        OpGraph.from_arrays("g", ["a", "b"], ["Op", "Op"], [1, 1], [5], [1])
    with pytest.raises(GraphError, match="'b': negative out_bytes"):
        OpGraph.from_networkx(nxgraph({"a": 1, "b": -3}, []))
    with pytest.raises(GraphError, match="'a': missing node attribute 'out_bytes'"):
        OpGraph.from_networkx(nxgraph({"a": {"op_type": "X"}}, []))
    with pytest.raises(GraphError, match="unknown device kind 'tpu'"):
        OpGraph.from_networkx(nxgraph({"a": {"out_bytes": 1, "kinds": ["tpu"]}}, []))


def test_group_with_no_common_device_kind_is_rejected():
    nodes = {"a": {"out_bytes": 1, "kinds": ["cpu"], "group": 1}, "b": {"out_bytes": 1, "kinds": ["gpu"], "group": 1}}
    with pytest.raises(GraphError, match="no device kind can run all"):
        OpGraph.from_networkx(nxgraph(nodes, []))


def test_unknown_versions_and_bad_files_are_rejected(tmp_path):
    import json
    import zipfile

    g = small()
    path = tmp_path / "g.npz"
    g.save(path)
    with zipfile.ZipFile(path) as z:
        items = {n: z.read(n) for n in z.namelist()}
    meta = json.loads(items["meta.json"])
    meta["version"] = 99
    items["meta.json"] = json.dumps(meta).encode()
    bad = tmp_path / "v99.npz"
    with zipfile.ZipFile(bad, "w") as z:
        for n, b in items.items():
            z.writestr(n, b)
    with pytest.raises(GraphError, match="unknown placetool.opgraph version 99"):
        graph_io.load(bad)
    junk = tmp_path / "junk.npz"
    junk.write_text("hello")
    with pytest.raises(GraphError, match="not a placetool graph file"):
        graph_io.load(junk)
    with pytest.raises(GraphError, match="no such graph file"):
        graph_io.load(tmp_path / "missing.npz")


def test_synthetic_graphs_are_deterministic_and_realistic():
    a, b = presets.load_graph("synthetic-1k"), presets.load_graph("synthetic-1k")
    assert a.names == b.names and np.array_equal(a.edge_src, b.edge_src)
    assert a.n_ops == 1000 and a.n_groups < 1000
    assert (a.allowed == 1).sum() >= 1 and a.param_bytes.sum() > 0
    assert presets.load_graph("synthetic-10k").n_ops == 10_000


# ---------------------------------------------------------------- clusters
def test_cluster_from_dict_and_links():
    c = Cluster.from_dict({
        "name": "two",
        "devices": [{"name": "cpu", "kind": "cpu", "memory_bytes": 100},
                    {"name": "gpu", "kind": "gpu", "memory_bytes": 50}],
        "links": {"default": {"latency_us": 2.0, "bandwidth_bytes_per_us": 4.0},
                  "pairs": [{"src": "cpu", "dst": "gpu", "bandwidth_bytes_per_us": 8.0}]},
    })
    assert c.transfer_time_us(0, 1, 80) == 12.0
    assert c.transfer_time_us(1, 0, 80) == 22.0
    assert c.transfer_time_us(1, 1, 80) == 0.0
    assert c.device_index("gpu") == 1
    with pytest.raises(ClusterError, match="unknown device 'tpu'"):
        c.device_index("tpu")


def test_cluster_toml_round_trip(tmp_path):
    c = presets.load_cluster("v100x8")
    c.save(tmp_path / "c.toml")
    d = cluster_io.load(tmp_path / "c.toml")
    assert d.names == c.names and d.kinds == c.kinds
    assert np.array_equal(d.latency_us, c.latency_us)
    assert np.array_equal(d.bandwidth_bytes_per_us, c.bandwidth_bytes_per_us)
    assert np.array_equal(d.memory_bytes, c.memory_bytes)


def test_transfer_costs_round_trip_through_toml(tmp_path):
    c = Cluster.from_dict({
        "name": "w",
        "devices": [{"name": "w0", "kind": "cpu", "memory_bytes": 100, "send_us": 40.5, "recv_us_per_byte": 0.25},
                    {"name": "w1", "kind": "cpu", "memory_bytes": 100, "send_us_per_byte": 1e-3, "recv_us": 7}],
        "links": {"default": {"latency_us": 2.0, "bandwidth_bytes_per_us": 4.0}},
    })
    want = [[40.5, 0.0], [0.0, 1e-3], [0.0, 7.0], [0.25, 0.0]]
    assert c.transfer_costs().tolist() == want
    assert c.devices[1].recv_us == 7.0 and isinstance(c.devices[1].recv_us, float)
    c.save(tmp_path / "w.toml")
    text = (tmp_path / "w.toml").read_text()
    assert "send_us = 40.5" in text and "recv_us_per_byte = 0.25" in text
    assert cluster_io.load(tmp_path / "w.toml").transfer_costs().tolist() == want


@pytest.mark.parametrize("value,shown", [(-1.0, "-1.0"), (float("inf"), "inf"), (float("nan"), "nan"), ("3", "'3'"),
                                         (True, "True")])
@pytest.mark.parametrize("key", ["send_us", "send_us_per_byte", "recv_us", "recv_us_per_byte"])
def test_bad_transfer_costs_name_the_device_and_key(key, value, shown):
    d = {"devices": [{"name": "w0", "kind": "cpu", "memory_bytes": 1, key: value}],
         "links": {"default": {"latency_us": 1, "bandwidth_bytes_per_us": 1}}}
    with pytest.raises(ClusterError, match=rf"^c.toml: device 'w0': {key} must be a finite non-negative number, "
                                           rf"got {shown}$"):
        Cluster.from_dict(d, source="c.toml")


@pytest.mark.parametrize("name", ["k80x2", "k80x4", "k40x2", "k40x4", "k40x8", "p100x4", "v100x8"])
def test_presets_have_one_host_cpu_and_say_they_are_analytic(name):
    c = presets.load_cluster(name)
    assert c.kinds.count("cpu") == 1 and c.kinds[0] == "cpu"
    assert c.kinds.count("gpu") == int(name.split("x")[1])
    assert "analytic" in c.metadata["source"]
    # copy engines overlap transfers with compute: no device-side transfer cost
    assert not c.transfer_costs().any()


@pytest.mark.parametrize("d,match", [
    ({"devices": []}, "non-empty 'devices'"),
    ({"devices": [{"name": "a", "kind": "tpu", "memory_bytes": 1}]}, "device 'a': kind 'tpu'"),
    ({"devices": [{"name": "a", "kind": "cpu"}]}, "device 'a': missing field 'memory_bytes'"),
    ({"devices": [{"name": "a", "kind": "cpu", "memory_bytes": -1}]}, "memory_bytes must be a whole number of bytes from 1"),
    ({"devices": [{"name": "a", "kind": "cpu", "memory_bytes": 1}]}, r"needs \[links.default\]"),
    ({"devices": [{"name": "a", "kind": "cpu", "memory_bytes": 1}],
      "links": {"default": {"latency_us": 1, "bandwidth_bytes_per_us": 0}}}, "bandwidth_bytes_per_us must be a positive"),
])
def test_bad_clusters_name_the_field(d, match):
    with pytest.raises(ClusterError, match=match):
        Cluster.from_dict(d)


def test_malformed_toml_names_the_file(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text("name = [")
    with pytest.raises(ClusterError, match="bad.toml: malformed TOML"):
        cluster_io.load(p)


def test_helper_cluster_builds():
    assert cluster(3).n_devices == 3


def test_graph_with_control_edges_only_has_zero_edge_bytes():
    g = nx.DiGraph()
    g.add_node("a", op_type="NoOp", out_bytes=0)
    g.add_node("b", op_type="NoOp", out_bytes=0)
    g.add_edge("a", "b", control=True)
    og = OpGraph.from_networkx(g, "ctrl")
    assert og.n_tensors == 0 and og.edge_bytes.tolist() == [0]


def test_to_assignment_inverts_to_placement():
    from placetool.costmodel import presets

    g = presets.load_graph("synthetic-1k")
    a = np.random.default_rng(0).integers(0, 4, g.n_groups).astype(np.int32)
    p = g.to_placement(a)
    assert np.array_equal(g.to_assignment(p), a)
    assert all(g.group[g.group_first[k]] == k for k in range(g.n_groups))
    with pytest.raises(ValueError, match="expected"):
        g.to_assignment(p[:-1])
