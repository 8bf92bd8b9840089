"""Small graphs and clusters shared by the tests."""

from __future__ import annotations

import networkx as nx

from costmodel import Cluster


def cluster(n_devices=2, latency=1.0, bandwidth=10.0, memory=1 << 40, kinds=None, name="test"):
    """A cluster with uniform links; device 0 is a CPU unless kinds say otherwise."""
    kinds = kinds or (["cpu"] + ["gpu"] * (n_devices - 1))
    mem = memory if isinstance(memory, (list, tuple)) else [memory] * n_devices
    return Cluster.from_dict({
        "name": name,
        "devices": [{"name": f"d{i}", "kind": k, "memory_bytes": m} for i, (k, m) in enumerate(zip(kinds, mem))],
        "links": {"default": {"latency_us": latency, "bandwidth_bytes_per_us": bandwidth}},
    })


def nxgraph(nodes, edges, name="g"):
    """nodes: {name: out_bytes or dict of attributes}; edges: (u, v) or (u, v, attrs)."""
    g = nx.DiGraph(name=name)
    for v, a in nodes.items():
        attrs = {"op_type": "Op", "out_bytes": a} if isinstance(a, int) else {"op_type": "Op", **a}
        g.add_node(v, **attrs)
    for e in edges:
        g.add_edge(e[0], e[1], **(e[2] if len(e) > 2 else {}))
    return g
